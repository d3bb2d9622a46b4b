"""The checkpoint half of :class:`~twinkle.model.transformers.MultiLoraTransformersModel`: save,
load, resume, hub upload and the adapter's PEFT state (the file logic is in :mod:`._checkpoints`)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import torch

from twinkle.model.lora import adapter_state_dict, load_adapter_state_dict
from twinkle.model.transformers import _checkpoints


class CheckpointMethods:
    """Mixed into the model class; uses its ``tenant()``, ``model``, ``model_id``, ``model_dir``,
    ``set_optimizer`` and ``set_lr_scheduler``."""

    def save(
        self,
        name: str,
        output_dir: str | os.PathLike | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """Save the tenant's adapter (PEFT layout) and, optionally, its full training state.

        Args:
            name: Checkpoint directory name (one plain path component).
            output_dir: Parent directory; ``$TWINKLE_OUTPUT_DIR/<adapter>`` or ``./output/<adapter>``.
            save_optimizer: Also write optimizer, scheduler, RNG and progress for resuming.
            consumed_train_samples: Data progress to store (from ``DataLoader.get_state()``).

        Returns:
            The checkpoint directory path.
        """
        return _checkpoints.save(
            self.tenant(adapter_name),
            self.model,
            model_id=self.model_id,
            model_dir=self.model_dir,
            name=name,
            output_dir=output_dir,
            save_optimizer=save_optimizer,
            consumed_train_samples=consumed_train_samples,
        )

    def load(self, path: str | os.PathLike, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Load adapter weights only (no optimizer or progress) from a checkpoint directory."""
        _checkpoints.load_weights(self.tenant(adapter_name), self.model, Path(path))

    def resume_from_checkpoint(
        self, path: str | os.PathLike, adapter_name: str | None = None
    ) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler, RNG and progress; returns the progress dict
        (``cur_step``, ``consumed_train_samples``, ...)."""
        tenant = self.tenant(adapter_name)
        return _checkpoints.resume(
            tenant,
            self.model,
            self.model_id,
            Path(path),
            set_optimizer=partial(self.set_optimizer, adapter_name=tenant.name),
            set_lr_scheduler=partial(self.set_lr_scheduler, adapter_name=tenant.name),
        )

    def upload_to_hub(
        self,
        checkpoint_dir: str | os.PathLike,
        hub_model_id: str,
        async_upload: bool = False,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Upload a checkpoint's adapter files to the ModelScope hub
        (:func:`twinkle.hub.upload.upload_to_hub`; optimizer state stays local).

        Args:
            checkpoint_dir: What ``save`` returned, or a checkpoint name under the adapter's
                default output directory.
            hub_model_id: The repository, ``owner/name`` (created when missing).
            async_upload: Return a ``Future`` at once; ``result()`` waits for the upload.
            **kwargs: ``token``, ``endpoint``, ``private``, ``commit_message``.

        Returns:
            A ``HubUpload`` (hub_model_id, files, url), or its ``Future``.
        """
        from twinkle.hub.upload import upload_to_hub

        directory = _checkpoints.checkpoint_directory(self.tenant(adapter_name), checkpoint_dir)
        return upload_to_hub(directory, hub_model_id, async_upload=async_upload, **kwargs)

    def adapter_state_dict(self, adapter_name: str | None = None) -> dict[str, torch.Tensor]:
        """A copy of the tenant's adapter weights, PEFT-keyed."""
        return adapter_state_dict(self.model, self.tenant(adapter_name).name)

    def load_adapter_state_dict(
        self, state: dict[str, torch.Tensor], adapter_name: str | None = None
    ) -> None:
        load_adapter_state_dict(self.model, self.tenant(adapter_name).name, state)

    def adapter_peft_config(self, adapter_name: str | None = None) -> dict[str, Any]:
        """The ``adapter_config.json`` a checkpoint of this tenant would carry (standard PEFT)."""
        return _checkpoints._peft_config(self.tenant(adapter_name), self.model, self.model_dir)
