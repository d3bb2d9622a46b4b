"""The checkpoint half of :class:`~twinkle.model.engine.TenantEngine`: save,
load, resume, hub upload and the adapter's PEFT state (the file logic is in :mod:`._checkpoints`)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

import torch

from twinkle.errors import ArgumentTypeError, InvalidArgumentError
from twinkle.model.engine import _checkpoints
from twinkle.model.lora import adapter_state_dict, load_adapter_state_dict
from twinkle_client.types import SavedCheckpoint

DEFAULT_POLL_INTERVAL_S = 2.0  # the remote model's; a local upload's Future needs no polling


class CheckpointMethods:
    """Mixed into the model class; uses its ``tenant()``, ``model``, ``model_id``, ``model_dir``,
    ``set_optimizer`` and ``set_lr_scheduler``."""

    def _set_save_dir(self, adapter_name: str, save_dir: str | os.PathLike | None) -> None:
        """Remember (or, with ``None``, forget) where ``save`` puts the adapter's checkpoints."""
        save_dirs = self.__dict__.setdefault("_save_dirs", {})
        if save_dir is None:
            save_dirs.pop(adapter_name, None)
        else:
            save_dirs[adapter_name] = Path(save_dir)

    def _save_dir(self, adapter_name: str) -> Path | None:
        return self.__dict__.get("_save_dirs", {}).get(adapter_name)

    def save(
        self,
        name: str,
        output_dir: str | os.PathLike | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int | None = None,
        is_sampler: bool = False,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> SavedCheckpoint:
        """Save the tenant's adapter (PEFT layout) and, optionally, its full training state.

        Args:
            name: Checkpoint directory name (one plain path component).
            output_dir: Parent directory; the adapter's ``save_dir``, else
                ``$TWINKLE_OUTPUT_DIR/<adapter>`` or ``./output/<adapter>``.
            save_optimizer: Also write optimizer, scheduler, RNG and progress for resuming.
            consumed_train_samples: Data progress to store (from ``DataLoader.get_state()``).
            is_sampler: Weights for a sampler only (no training state; not with
                ``save_optimizer``).

        Returns:
            The checkpoint directory, as a string with ``.twinkle_path`` and
            ``.checkpoint_dir`` (:class:`~twinkle_client.types.SavedCheckpoint`).
        """
        is_sampler = is_sampler or kwargs.pop("kind", None) == "sampler"  # the remote spelling
        if kwargs:
            raise ArgumentTypeError(f"unexpected arguments: {', '.join(kwargs)}")
        if is_sampler and save_optimizer:
            raise InvalidArgumentError(
                "a sampler checkpoint (is_sampler=True) holds weights only: drop save_optimizer"
            )
        tenant = self.tenant(adapter_name)
        directory = _checkpoints.save(
            tenant,
            self.model,
            model_id=self.model_id,
            model_dir=self.model_dir,
            name=name,
            output_dir=output_dir if output_dir is not None else self._save_dir(tenant.name),
            save_optimizer=save_optimizer,
            consumed_train_samples=consumed_train_samples,
        )
        kind = "sampler_weights" if is_sampler else "weights"
        return SavedCheckpoint(directory, checkpoint_dir=directory, checkpoint_type=kind)

    def load(
        self,
        path: str | os.PathLike,
        adapter_name: str | None = None,
        load_optimizer: bool = False,
        **kwargs: Any,
    ) -> None:
        """Load adapter weights from a checkpoint directory; with ``load_optimizer``, also the
        optimizer, scheduler, RNG and progress (what ``resume_from_checkpoint`` restores)."""
        if kwargs:
            raise ArgumentTypeError(f"unexpected arguments: {', '.join(kwargs)}")
        if load_optimizer:
            self.resume_from_checkpoint(path, adapter_name=adapter_name)
            return
        _checkpoints.load_weights(self.tenant(adapter_name), self.model, Path(path))

    def resume_from_checkpoint(
        self,
        path: str | os.PathLike,
        adapter_name: str | None = None,
        resume_only_model: bool = False,
    ) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler, RNG and progress; returns the progress dict
        (``cur_step``, ``consumed_train_samples``, ...).

        With ``resume_only_model`` only the weights are loaded (optimizer, scheduler, RNG and
        step counters start afresh) and the stored progress is returned, so a data loader can
        skip what was trained already."""
        tenant = self.tenant(adapter_name)
        if resume_only_model:
            _checkpoints.load_weights(tenant, self.model, Path(path))
            return _checkpoints.stored_progress(Path(path))
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
        hub_token: str | None = None,
        async_upload: bool = False,
        poll_interval: float = DEFAULT_POLL_INTERVAL_S,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Upload a checkpoint's adapter files to the ModelScope hub
        (:func:`twinkle.hub.upload.upload_to_hub`; optimizer state stays local).

        Args:
            checkpoint_dir: What ``save`` returned, or a checkpoint name under the adapter's
                output directory.
            hub_model_id: The repository, ``owner/name`` (created when missing).
            hub_token: A ModelScope token (default ``$MODELSCOPE_API_TOKEN``, then the saved
                ``modelscope login``).
            async_upload: Return a ``Future`` at once; ``result()`` waits for the upload.
            poll_interval: Used by the remote model only (a local upload runs in this process).
            **kwargs: ``endpoint``, ``private``, ``commit_message``.

        Returns:
            A ``HubUpload`` (hub_model_id, files, url), or its ``Future``.

        Raises:
            HubUnreachableError: The hub does not answer (within seconds, before uploading).
        """
        from twinkle.hub.upload import upload_to_hub

        tenant = self.tenant(adapter_name)
        directory = _checkpoints.checkpoint_directory(
            tenant, checkpoint_dir, self._save_dir(tenant.name)
        )
        token = kwargs.pop("token", None) or hub_token
        return upload_to_hub(
            directory, hub_model_id, token=token, async_upload=async_upload, **kwargs
        )

    def get_state_dict(self, adapter_name: str | None = None) -> dict[str, Any]:
        """A copy of the tenant's adapter weights, PEFT-keyed (torch tensors)."""
        return self.adapter_state_dict(adapter_name)

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
