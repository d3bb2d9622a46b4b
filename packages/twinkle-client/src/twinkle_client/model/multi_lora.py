"""``MultiLoraTransformersModel`` on a server: every method is one ``POST`` to the model deployment."""

from __future__ import annotations

import dataclasses
import os
import warnings
from enum import Enum
from typing import TYPE_CHECKING, Any

from twinkle_client._wire import jsonable, training_inputs
from twinkle_client.client import TwinkleClient, get_default_client
from twinkle_client.model._adapter_files import (
    adapter_directory,
    is_server_path,
    read_adapter_config,
    upload_body,
)
from twinkle_client.model._hub_upload import DEFAULT_POLL_INTERVAL_S, RemoteUpload
from twinkle_client.model.adam import AdamParams
from twinkle_client.model.metrics import Metric
from twinkle_client.tracking.history import TrainingHistory
from twinkle_client.types import ForwardOutput, SavedCheckpoint, TrainConfigs

if TYPE_CHECKING:
    import torch

# Placement arguments the server's config decides; a script may still pass them.
_SERVER_SIDE = {"torch_dtype": None, "device": None, "attn_implementation": "sdpa", "seed": 0}


class MultiLoraTransformersModel:
    """A tenant's view of the server's shared base model, with the local class's API.

    Every method takes ``adapter_name=``; when this object created exactly one adapter it is
    the default. Adapter names are per API key, so tenants never collide.

    Args:
        model_id: The served base model: ``ms://Qwen/Qwen3.5-4B`` (route ``Qwen/Qwen3.5-4B``),
            ``tiny://qwen3.5`` (route ``tiny/qwen3.5``) or the served name itself.
        torch_dtype: Decided by the server's config; a value other than the default warns.
        device: Decided by the server's config; a value other than the default warns.
        attn_implementation: Decided by the server's config.
        seed: Decided by the server's config.
        **model_kwargs: ``client=`` a :class:`TwinkleClient` (default: the one
            ``init_twinkle_client`` made); other keys are server-side and warn.
    """

    max_adapters: int | None = None

    def __init__(
        self,
        model_id: str,
        torch_dtype: torch.dtype | str | None = None,
        device: str | torch.device | None = None,
        attn_implementation: str = "sdpa",
        seed: int = 0,
        **model_kwargs: Any,
    ) -> None:
        client = model_kwargs.pop("client", None)
        given = dict(
            torch_dtype=torch_dtype,
            device=device,
            attn_implementation=attn_implementation,
            seed=seed,
        )
        ignored = [k for k, v in given.items() if v != _SERVER_SIDE[k]] + list(model_kwargs)
        if ignored:
            warnings.warn(
                f"{', '.join(ignored)}: set by the server's config for a remote model; ignored here",
                stacklevel=2,
            )
        self.model_id = model_id
        self.client: TwinkleClient = client or get_default_client()
        self.route = self.client.model_route(model_id)
        self._adapters: list[str] = []
        self._last_add: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, server={self.client.base_url!r})"

    def _name(self, adapter_name: str | None) -> str | None:
        if adapter_name is not None:
            return adapter_name
        if len(self._adapters) > 1:
            raise ValueError(
                f"several adapters exist ({', '.join(self._adapters)}): pass adapter_name="
            )
        return self._adapters[0] if self._adapters else None  # None: the server's "default"

    def _call(self, op: str, adapter_name: str | None, **body: Any) -> Any:
        body = {k: jsonable(v) for k, v in body.items()}
        return self.client.call(self.route, op, {"adapter_name": self._name(adapter_name), **body})

    # ----------------------------------------------------------------- adapters
    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any = None,
        gradient_accumulation_steps: int = 1,
        save_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        """Create this tenant's adapter ``adapter_name`` on the server: ``config`` is a
        ``peft.LoraConfig``, a dict, or a PEFT adapter directory on this machine (its
        ``adapter_config.json`` is read here and sent).

        ``save_dir`` (where a local model puts this adapter's checkpoints) is accepted and not
        sent: the server keeps a tenant's checkpoints in its own storage, and ``save()``
        returns their ``twinkle://`` paths.

        Raises:
            BadRequestError: Duplicate name, a rank over the server's limit, bad arguments.
            ServerUnavailableError: The model is at ``max_loras`` capacity after every retry.
        """
        if self.max_adapters is not None and len(self._adapters) >= self.max_adapters:
            raise ValueError(f"{type(self).__name__} holds at most {self.max_adapters} adapter(s)")
        if save_dir is not None:
            warnings.warn(
                f"save_dir={str(save_dir)!r} ignored: the server stores this adapter's "
                "checkpoints; save() returns their twinkle:// paths",
                stacklevel=2,
            )
        self._last_add = self._call(
            "add_adapter_to_model",
            adapter_name,
            config=lora_config_dict(config),
            gradient_accumulation_steps=gradient_accumulation_steps,
            session_id=self.client.session_id,
            **kwargs,
        )
        self._adapters.append(adapter_name)
        self.client.track_adapter(self.route, adapter_name)

    @property
    def training_run_id(self) -> str | None:
        """The server's training run of the last adapter added through this object."""
        return self._last_add.get("training_run_id")

    def remove_adapter(self, adapter_name: str | None = None) -> None:
        """Drop the adapter on the server: its weights, optimizer and state are freed."""
        name = self._name(adapter_name)
        self._call("remove_adapter", name)
        if name in self._adapters:
            self._adapters.remove(name)
        self.client.track_adapter(self.route, name or "default", alive=False)

    def list_adapters(self) -> list[str]:
        return list(self._adapters)

    # ------------------------------------------------------------ configuration
    def set_template(self, template: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's chat template by name (``'Qwen3_5Template'``)."""
        self._call("set_template", adapter_name, template=_by_name("template", template), **kwargs)

    def set_processor(self, processor: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set how the tenant's samples are collated on the server (``'InputProcessor'``, ...)."""
        self._call(
            "set_processor", adapter_name, processor=_by_name("processor", processor), **kwargs
        )

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's loss by name (``'CrossEntropyLoss'``, ``'GRPOLoss'``, ``'DPOLoss'``...)."""
        self._call("set_loss", adapter_name, loss=_by_name("loss", loss), **kwargs)

    def set_optimizer(self, optimizer: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Set the tenant's optimizer by name (``'Adam'``, ``'AdamW'``, ``'SGD'``), e.g. ``lr=1e-4``."""
        self._call(
            "set_optimizer", adapter_name, optimizer=_by_name("optimizer", optimizer), **kwargs
        )

    def set_lr_scheduler(
        self, scheduler: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """Set the tenant's learning-rate scheduler by name (``'LinearLR'``, ``'cosine'``...)."""
        self._call(
            "set_lr_scheduler", adapter_name, scheduler=_by_name("scheduler", scheduler), **kwargs
        )

    def get_train_configs(self, adapter_name: str | None = None) -> TrainConfigs:
        """The tenant's configuration, as a pydantic model (``.model_dump()``)."""
        return TrainConfigs.model_validate(self._call("get_train_configs", adapter_name))

    # ----------------------------------------------------------------- training
    def forward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward on the server, keeping the graph for a later ``calculate_loss`` + ``backward``."""
        return ForwardOutput(
            self._call("forward", adapter_name, inputs=training_inputs(inputs), **kwargs)
        )

    def calculate_loss(self, adapter_name: str | None = None, **kwargs: Any) -> float:
        """Apply the tenant's loss to the last ``forward``; returns the loss value."""
        return float(self._call("calculate_loss", adapter_name, **kwargs))

    def backward(self, adapter_name: str | None = None) -> None:
        """Backpropagate the last calculated loss into the tenant's adapter gradients."""
        self._call("backward", adapter_name)

    def forward_backward(
        self, inputs: Any, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Forward, loss and backward for one micro-batch (fused with other tenants' on the server).

        Args:
            inputs: ``InputFeature``s / dicts with ``input_ids`` and ``labels``, trajectories, or
                single-sequence ``SampleResult``s; numpy arrays are sent as lists.
            adapter_name: The tenant's adapter.
            **kwargs: Loss inputs such as ``advantages`` or ``old_logprobs``.

        Returns:
            ``{'loss': float, 'logprobs': [per-row target log-probs], 'num_tokens': int}``.
        """
        return self._call(
            "forward_backward", adapter_name, inputs=training_inputs(inputs), **kwargs
        )

    def forward_only(
        self,
        inputs: Any,
        adapter_name: str | None = None,
        disable_lora: bool = False,
        **kwargs: Any,
    ) -> ForwardOutput:
        """Forward without gradients; returns loss and per-row target log-probabilities as a
        :class:`~twinkle_client.types.ForwardOutput` (the dict, also as ``.result``).

        With ``disable_lora`` the base model answers without the adapter (reference
        log-probabilities for DPO: ``forward_backward(..., ref_outputs=out.result)``)."""
        if disable_lora:
            kwargs["disable_lora"] = True
        return ForwardOutput(
            self._call("forward_only", adapter_name, inputs=training_inputs(inputs), **kwargs)
        )

    def clip_grad_norm(self, max_grad_norm: float = 1.0, adapter_name: str | None = None) -> float:
        """Clip the tenant's gradient norm; returns the norm before clipping."""
        return float(self._call("clip_grad_norm", adapter_name, max_grad_norm=max_grad_norm))

    def step(self, adapter_name: str | None = None) -> None:
        """One optimizer step for the tenant."""
        self._call("step", adapter_name)

    def zero_grad(self, adapter_name: str | None = None) -> None:
        self._call("zero_grad", adapter_name)

    def lr_step(self, adapter_name: str | None = None) -> None:
        self._call("lr_step", adapter_name)

    def clip_grad_and_step(
        self, max_grad_norm: float = 1.0, adapter_name: str | None = None
    ) -> bool:
        """``clip_grad_norm`` + ``step`` + ``zero_grad`` + ``lr_step`` once every
        ``gradient_accumulation_steps`` calls; returns whether the optimizer stepped."""
        return bool(self._call("clip_grad_and_step", adapter_name, max_grad_norm=max_grad_norm))

    def optim_step(
        self,
        adam_params: AdamParams | dict[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> dict[str, float]:
        """A Tinker-style step: clip to ``grad_clip_norm`` (when > 0), one AdamW step with THIS
        call's hyper-parameters, zero the gradients; returns ``grad_norm``, ``learning_rate`` and
        ``step``."""
        params = AdamParams.coerce(adam_params)  # a bad value fails here, before the request
        return self._call("optim_step", adapter_name, adam_params=dataclasses.asdict(params))

    def calculate_metric(self, is_training: bool = True, adapter_name: str | None = None) -> Metric:
        """Averages since the last call: loss, token_acc, grad_norm, lr, step."""
        return Metric(
            result=self._call("calculate_metric", adapter_name, is_training=is_training)["result"]
        )

    def get_training_history(
        self, adapter_name: str | None = None, since_step: int | None = None
    ) -> TrainingHistory:
        """One point per optimizer step of the adapter's training run, as the server recorded
        it (``TwinkleClient.get_training_history``); it outlives the adapter and this process."""
        run_id = self._call("get_train_configs", adapter_name)["training_run_id"]
        return self.client.get_training_history(run_id, since_step=since_step)

    # -------------------------------------------------------------- checkpoints
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
        """Save the tenant's adapter (and, with ``save_optimizer``, its full training state) in
        the server's storage.

        Args:
            name: Checkpoint name (one plain path component).
            output_dir: Must stay ``None``: the server decides where a tenant's checkpoints live.
            save_optimizer: Also save optimizer, scheduler, RNG and progress for resuming.
            consumed_train_samples: Data progress to store (from ``DataLoader.get_state()``).
            is_sampler: Save the weights for sampling only, as ``sampler_weights/<name>``
                (saving the same name again replaces it); not with ``save_optimizer``.

        Returns:
            The checkpoint's ``twinkle://<run>/weights/<name>`` path, as a string that also has
            ``.twinkle_path`` (:class:`~twinkle_client.types.SavedCheckpoint`).
        """
        if output_dir is not None:
            raise ValueError(
                "output_dir cannot be chosen for a remote model: the server stores checkpoints"
            )
        reply = self._call(
            "save",
            adapter_name,
            name=name,
            save_optimizer=save_optimizer,
            consumed_train_samples=consumed_train_samples,
            is_sampler=is_sampler,
            **kwargs,
        )
        kind = "sampler_weights" if is_sampler or kwargs.get("kind") == "sampler" else "weights"
        return SavedCheckpoint(reply["path"], checkpoint_type=kind)

    def load(
        self,
        path: str | os.PathLike,
        adapter_name: str | None = None,
        load_optimizer: bool = False,
        **kwargs: Any,
    ) -> None:
        """Load adapter weights (with ``load_optimizer``, the whole training state, as
        ``resume_from_checkpoint`` does) into the tenant's adapter.

        The path's form says where the checkpoint is: a ``twinkle://`` (or ``tinker://``) path
        is one of this key's checkpoints on the server; any other path is a PEFT adapter
        directory on this machine (``save_pretrained``'s, or a local Twinkle ``save``'s). Its
        ``adapter_config.json`` and ``adapter_model.safetensors`` (no other file) are uploaded;
        the server checks them against the adapter (config fields, base model, rank and scaling
        per module, every tensor's key and shape), loads them and keeps them as this key's
        checkpoint ``twinkle://<run>/weights/<name>``. A refused upload changes nothing.

        Args:
            path: A ``twinkle://`` checkpoint path or a local adapter directory.
            adapter_name: The tenant's adapter (created beforehand, e.g. with
                ``add_adapter_to_model(name, LoraConfig.from_pretrained(path))``).
            load_optimizer: Also restore optimizer, scheduler, RNG and progress (a
                ``twinkle://`` checkpoint saved with ``save_optimizer=True`` only).
            **kwargs: For a local directory, ``name=`` the checkpoint name on the server
                (default: the directory's name).

        Raises:
            FileNotFoundError: A local path that is not an adapter directory.
            BadRequestError: The server refused the files (the message names what differs), or
                they are over its ``max_request_bytes`` (base64 makes them a third larger).
            NotFoundError: A ``twinkle://`` path that is not a checkpoint of this key.
        """
        if is_server_path(path):
            self._call(
                "load", adapter_name, path=str(path), load_optimizer=load_optimizer, **kwargs
            )
            return
        if load_optimizer:
            raise ValueError(
                "load_optimizer=True needs a twinkle:// checkpoint: a local adapter directory "
                "holds no training state the server can restore"
            )
        body = upload_body(adapter_directory(path), kwargs.pop("name", None))
        if kwargs:
            raise TypeError(f"unexpected arguments for a local directory: {', '.join(kwargs)}")
        self._call("upload_adapter", adapter_name, **body)

    def resume_from_checkpoint(
        self,
        path: str | os.PathLike,
        adapter_name: str | None = None,
        resume_only_model: bool = False,
    ) -> dict[str, Any]:
        """Restore weights, optimizer, scheduler, RNG and progress from a ``twinkle://`` path;
        returns the progress dict (``cur_step``, ``consumed_train_samples``, ...).

        With ``resume_only_model`` only the weights are loaded (optimizer, scheduler, RNG and
        step counters start afresh) and the stored progress is returned, so a data loader can
        skip what was trained already."""
        return self._call(
            "resume_from_checkpoint",
            adapter_name,
            path=str(path),
            resume_only_model=resume_only_model,
        )

    def get_state_dict(self, adapter_name: str | None = None) -> dict[str, Any]:
        """A copy of the tenant's adapter weights, PEFT-keyed, as float32 numpy arrays (sent as
        JSON: for large adapters, ``save()`` and download the checkpoint instead)."""
        import numpy as np

        reply = self._call("get_state_dict", adapter_name)
        return {
            key: np.asarray(value["data"], dtype=np.float32).reshape(value["shape"])
            for key, value in reply.items()
        }

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
        """Have the server upload one of this key's checkpoints to the ModelScope hub.

        The server uploads in the background and this call asks for the upload's status every
        ``poll_interval`` seconds until it is done (so a long upload never runs into an HTTP
        timeout). Only the adapter files go (``adapter_config.json``,
        ``adapter_model.safetensors``, a ``README.md``); optimizer state stays on the server.

        Args:
            checkpoint_dir: The ``twinkle://`` path ``save`` returned.
            hub_model_id: The repository, ``owner/name`` (created when missing).
            hub_token: A ModelScope token for this upload only (never stored). Without it the
                server's token rule applies: this client's API key when the hub accepts it as a
                ModelScope token, else the server's own token (``docs/checkpoints.md``).
            async_upload: Return as soon as the server has started the upload.
            poll_interval: Seconds between status requests while waiting.
            **kwargs: ``private``, ``commit_message``.

        Returns:
            A :class:`~twinkle_client.model._hub_upload.RemoteUpload` (a dict): ``status``
            ``uploaded`` with ``files`` and ``url``; with ``async_upload``, ``started``, and its
            ``result()`` waits for the end.

        Raises:
            NotFoundError: Not a checkpoint of this key.
            BadRequestError: No usable token, or a hub that cannot be reached (before anything
                is started).
            HubUploadFailedError: The upload itself failed (the hub refused it, went away).
        """
        started = self._call(
            "upload_to_hub",
            adapter_name,
            checkpoint_dir=str(checkpoint_dir),
            hub_model_id=hub_model_id,
            hub_token=hub_token,
            **kwargs,
        )
        upload = RemoteUpload(started, self._upload_status)
        return upload if async_upload else upload.result(poll_interval=poll_interval)

    def _upload_status(self, upload_id: str) -> dict[str, Any]:
        return self.client.call(self.route, "upload_status", {"upload_id": upload_id})

    def add_metric(
        self,
        metric_cls: Any,
        is_training: bool | None = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Attach a metric by name (``'DPOMetric'``, ``'EmbeddingMetric'``, ...; a class is sent
        by its name) to the tenant: fed after training forwards (``is_training=True``),
        ``forward_only`` (``False``) or both (``None``) and reported by ``calculate_metric``;
        ``kwargs`` configure it (``beta=0.1``).

        Raises:
            BadRequestError: An unknown or client-side metric, or arguments it does not take.
        """
        self._call(
            "add_metric",
            adapter_name,
            metric_cls=_by_name("metric", metric_cls),
            is_training=is_training,
            **kwargs,
        )


class TransformersModel(MultiLoraTransformersModel):
    """A model with at most one LoRA adapter; every method defaults to it."""

    max_adapters = 1


def lora_config_dict(config: Any) -> dict[str, Any]:
    """A ``peft.LoraConfig``, dict, simple object or local adapter directory as a JSON dict,
    without importing peft."""
    if config is None:
        return {}
    if isinstance(config, (str, os.PathLike)):
        values = read_adapter_config(config)
    elif isinstance(config, dict):
        values = dict(config)
    elif hasattr(config, "to_dict"):
        values = config.to_dict()
    else:
        values = dict(vars(config))
    out = {}
    for key, value in values.items():
        if isinstance(value, set):
            value = sorted(value)
        elif isinstance(value, str) and isinstance(value, Enum):  # str enums (peft's PeftType)
            value = value.value
        value = jsonable(value)
        if _is_json(value):
            out[key] = value
    return out


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _by_name(kind: str, value: Any) -> str:
    """Only names travel to the server: a class is sent by its name, an instance is refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return value.__name__
    raise TypeError(
        f"a remote model takes its {kind} by name (e.g. a string such as 'Adam' or "
        f"'CrossEntropyLoss'), not a {type(value).__name__} instance: no code is sent to the server"
    )
