"""``MockModel``: the multi-adapter model interface over a tiny deterministic numpy model."""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np

from twinkle.errors import (
    InvalidArgumentError,
    NonFiniteUpdateError,
    StateOrderError,
    UnknownAdapterError,
)
from twinkle.model import numerics
from twinkle.model.mock import _checkpoint as ckpt
from twinkle.model.mock import _lora
from twinkle.model.mock._adapter import AdapterState, MetricResult
from twinkle.model.mock._batch import Batch, flatten, per_row
from twinkle.model.mock._optim import LRSchedule, NumpyOptimizer
from twinkle.model.protocol import AdamParams, Capabilities
from twinkle.model.protocol import adam_params as adam_params_of
from twinkle_client.tracking.history import TrainingHistory
from twinkle_client.types import ForwardOutput, TrainConfigs

#: Inputs of the torch backends that the mock's losses never read: refused, not ignored.
_UNSUPPORTED_INPUTS = ("ref_outputs", "ref_logprobs", "ref_logps", "teacher_topk_logprobs")


class MockModel:
    """A numpy-only stand-in for ``MultiLoraTransformersModel``: same methods, no torch.

    ``logits[t] = h_t @ W`` with ``h_t = E[x_t] + scale * (E[x_t] @ A) @ B`` per adapter.
    Labels follow the HF shift (logits at ``t`` predict ``labels[t + 1]``; -100 is ignored) and
    returned ``logprobs`` are aligned with ``labels`` (0 where there is no target).

    Args:
        model_id: reported model id.
        vocab_size: vocabulary size ``V``.
        hidden_size: hidden size ``H``.
        seed: seed of the base weights and of adapter initialisation.
    """

    # One tenant at a time: the mock has no fused pass or batched step (the server runs each
    # tenant's call on its own), no paging, and no adapter tensors to hand over.
    capabilities = Capabilities()

    def __init__(
        self, model_id: str = "mock", vocab_size: int = 256, hidden_size: int = 16, seed: int = 0
    ):
        self.model_id = model_id
        self.vocab_size, self.hidden_size, self.seed = vocab_size, hidden_size, seed
        self.base = _lora.BaseWeights.from_seed(vocab_size, hidden_size, seed)
        self._adapters: dict[str, AdapterState] = {}

    @classmethod
    def for_model(cls, model_id: str, **kwargs: Any) -> MockModel:
        """A mock with the vocabulary of ``model_id`` (:func:`model_vocab_size`), so that data
        tokenized for that model fits it."""
        return cls(model_id=model_id, vocab_size=model_vocab_size(model_id), **kwargs)

    # Adapter lifecycle and settings.

    def add_adapter_to_model(
        self,
        adapter_name: str,
        config: Any,
        gradient_accumulation_steps: int = 1,
        seed: int | None = None,
        display_name: str | None = None,
    ) -> None:
        """Add a LoRA adapter; ``config`` has ``r`` and ``lora_alpha`` (attributes or keys);
        ``seed`` overrides the model's seed for this adapter's initialisation;
        ``display_name`` is the name messages show (see ``Tenant.display_name``)."""
        if adapter_name in self._adapters:
            raise InvalidArgumentError(f"adapter {adapter_name!r} already exists")
        self._adapters[adapter_name] = AdapterState.create(
            adapter_name,
            config,
            self.hidden_size,
            self.seed if seed is None else int(seed),
            gradient_accumulation_steps,
        )
        self._adapters[adapter_name].display_name = display_name

    def remove_adapter(self, adapter_name: str) -> None:
        """Drop an adapter with all its state."""
        self._adapters.pop(self._resolve(adapter_name).name)

    def list_adapters(self) -> list[str]:
        """The adapters on the model, in the order they were added."""
        return list(self._adapters)

    def set_template(self, template: Any, adapter_name: str | None = None, **kwargs) -> None:
        """Record the template name (the mock works on token ids)."""
        self._resolve(adapter_name).set_template(template)

    def set_processor(self, processor: Any, adapter_name: str | None = None, **kwargs) -> None:
        """Record the processor name (the mock works on token ids)."""
        self._resolve(adapter_name).set_processor(processor)

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs) -> None:
        """Select ``'CrossEntropyLoss'`` (mean), ``'cross_entropy'`` (sum) or ``'importance_sampling'``."""
        self._resolve(adapter_name).set_loss(loss, **kwargs)

    def set_optimizer(
        self, optimizer: str, adapter_name: str | None = None, lr: float = 1e-4, **kwargs
    ) -> None:
        """Select ``'Adam'``, ``'AdamW'`` or ``'SGD'`` (``'default'`` = Adam); resets its state."""
        self._resolve(adapter_name).optimizer = NumpyOptimizer(optimizer, lr=lr, **kwargs)

    def set_lr_scheduler(self, scheduler: str, adapter_name: str | None = None, **kwargs) -> None:
        """Select ``'constant'``, ``'LinearLR'``, ``'cosine'`` or ``'default'``."""
        self._resolve(adapter_name).schedule = LRSchedule(scheduler, **kwargs)

    # Training and inference.

    def forward_backward(self, inputs: Any, adapter_name: str | None = None, **kwargs) -> dict:
        """Run forward and accumulate gradients into the adapter.

        Args:
            inputs: a list of rows (dicts with ``input_ids`` and optional ``labels``,
                ``advantages``, ``old_logprobs`` aligned with labels), or one such dict.
            adapter_name: the adapter to train.
            **kwargs: ``advantages``, one float per row, for ``importance_sampling``.

        Returns:
            ``{'loss': float, 'logprobs': [per-row arrays aligned with labels], 'num_tokens':
            trained tokens}``.
        """
        state = self._resolve(adapter_name)
        _check_inputs(kwargs)
        if kwargs.get("disable_lora"):
            raise InvalidArgumentError(
                "disable_lora applies to forward_only (a pass of the base model alone)"
            )
        tokens_before = state.train_totals.tokens
        loss, logprobs, grads = self._run(state, inputs, kwargs.get("advantages"), with_grads=True)
        for key, grad in grads.items():
            state.grads[key] += grad
        state.pending_grads = True
        tokens = state.train_totals.tokens - tokens_before
        state.history.forward_backward(loss, tokens)
        return {"loss": loss, "logprobs": logprobs, "num_tokens": tokens}

    def forward_only(
        self,
        inputs: Any,
        adapter_name: str | None = None,
        disable_lora: bool = False,
        **kwargs,
    ) -> ForwardOutput:
        """Like :meth:`forward_backward` without touching gradients; ``disable_lora`` runs the
        base model alone and returns its log-probs only (no loss, no metric), as the torch
        backends do."""
        state = self._resolve(adapter_name)
        _check_inputs(kwargs)
        if disable_lora:
            batch, lp_N, _ = self._logprobs(state, inputs, bare=True)
            return ForwardOutput(logprobs=per_row(batch, lp_N), num_tokens=int(batch.valid_N.sum()))
        loss, logprobs, _ = self._run(state, inputs, kwargs.get("advantages"), with_grads=False)
        return ForwardOutput(loss=loss, logprobs=logprobs)

    def forward(self, inputs: Any, adapter_name: str | None = None, **kwargs) -> dict:
        """Per-row target log-probs and the trained-token count, as the transformers backend's
        ``forward`` returns them; the mock keeps no graph for a later ``backward``, so nothing
        of the adapter (gradients, metrics) changes."""
        state = self._resolve(adapter_name)
        _check_inputs(kwargs)
        batch, lp_N, _ = self._logprobs(state, inputs)
        return ForwardOutput(logprobs=per_row(batch, lp_N), num_tokens=int(batch.valid_N.sum()))

    def clip_grad_and_step(
        self, max_grad_norm: float | None = 1.0, adapter_name: str | None = None, **kwargs
    ) -> bool:
        """Step every ``gradient_accumulation_steps``-th call on the averaged, clipped gradients.

        Returns:
            Whether the optimizer stepped, as in the transformers backend.
        """
        state = self._resolve(adapter_name)
        if state.optimizer is None:
            raise InvalidArgumentError(
                f"adapter {state.label!r} has no optimizer; call set_optimizer first"
            )
        if max_grad_norm is not None:
            numerics.check_value("max_grad_norm", max_grad_norm)
        if (state.micro_steps + 1) % state.gradient_accumulation_steps:
            state.micro_steps += 1
            return False
        grads = {k: g / state.gradient_accumulation_steps for k, g in state.grads.items()}
        lr = state.current_lr()
        norm = _guarded_step(state, grads, max_grad_norm, lr)
        state.micro_steps += 1
        state.last_grad_norm = norm
        state.cur_step += 1
        state.zero_grad()
        state.history.stepped(state.cur_step, lr, norm)
        return True

    def optim_step(
        self, adam_params: AdamParams | dict | None = None, adapter_name: str | None = None
    ) -> dict[str, float]:
        """A Tinker-style step, as in the transformers backend: clip to ``grad_clip_norm`` (when
        > 0), one AdamW step with this call's hyper-parameters, zero the gradients."""
        params = adam_params_of(adam_params)
        state = self._resolve(adapter_name)
        if not state.pending_grads:
            raise StateOrderError(
                f"adapter {state.label!r}: optim_step without gradients: call forward_backward first"
            )
        numerics.check_adam_params(params)
        if params.learning_rate == 0:  # nothing applied: the norm reported, the gradients dropped
            norm = _norm(state.grads)
        else:
            norm = _adamw_step(state, params)
        state.last_grad_norm = norm
        state.cur_step += 1
        state.zero_grad()
        state.history.stepped(state.cur_step, params.learning_rate, norm)
        return {
            "grad_norm": norm,
            "learning_rate": params.learning_rate,
            "step": float(state.cur_step),
        }

    def get_training_history(
        self, adapter_name: str | None = None, since_step: int | None = None
    ) -> TrainingHistory:
        """One point per optimizer step, as the transformers backend records it."""
        state = self._resolve(adapter_name)
        return state.history.history(state.name, since_step)

    def calculate_metric(
        self, is_training: bool = True, adapter_name: str | None = None
    ) -> MetricResult:
        """Summarise the passes since the last call: loss, token_acc, grad_norm, lr, step."""
        state = self._resolve(adapter_name)
        totals = state.train_totals if is_training else state.eval_totals
        result = {
            "loss": totals.loss_sum / totals.calls if totals.calls else None,
            "token_acc": totals.correct / totals.tokens if totals.tokens else None,
            "grad_norm": state.last_grad_norm,
            "lr": state.current_lr(),
            "step": state.cur_step,
        }
        totals.__init__()
        return MetricResult(result)

    def get_train_configs(self, adapter_name: str | None = None) -> TrainConfigs:
        """The adapter's training settings."""
        s = self._resolve(adapter_name)
        # The same shape as the torch backends' (twinkle_client.types.TrainConfigs), so a script
        # reading it runs against either.
        return TrainConfigs(
            adapter_name=s.name,
            model_id=self.model_id,
            lora={"r": s.rank, "lora_alpha": s.alpha},
            gradient_accumulation_steps=s.gradient_accumulation_steps,
            loss={"name": s.loss_name, **s.loss_kwargs},
            optimizer=s.optimizer.config() if s.optimizer else None,
            lr_scheduler={"name": s.schedule.name, **s.schedule.kwargs},
            template=s.template,
            processor={"name": s.processor} if s.processor else None,
        )

    # Checkpoints.

    def save(
        self,
        name: str,
        output_dir: str | None = None,
        save_optimizer: bool = False,
        consumed_train_samples: int = 0,
        adapter_name: str | None = None,
        **kwargs,
    ) -> str:
        """Save the adapter (and optionally optimizer state) to ``output_dir/name``; return it."""
        s = self._resolve(adapter_name)
        path = ckpt.checkpoint_dir(output_dir or os.path.join("output", s.name), name)
        # The config is peft-shaped so tooling that lists adapters can read it; "mock" records
        # the base it was trained against.
        mock_base = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "seed": self.seed,
        }
        config = {
            "r": s.rank,
            "lora_alpha": s.alpha,
            "peft_type": "LORA",
            "base_model_name_or_path": self.model_id,
            "mock": mock_base,
        }
        trainer = {
            "cur_step": s.cur_step,
            "micro_steps": s.micro_steps,
            "consumed_train_samples": consumed_train_samples,
            "lr_scheduler": {"name": s.schedule.name, "kwargs": s.schedule.kwargs},
        }
        files = {
            ckpt.ADAPTER_CONFIG: config,
            ckpt.ADAPTER_WEIGHTS: s.params,
            ckpt.TRAINER_STATE: trainer,
        }
        if save_optimizer and s.optimizer is not None:
            trainer["optimizer"] = {**s.optimizer.config(), "steps": s.optimizer.steps}
            files[ckpt.OPTIMIZER_STATE] = s.optimizer.state
        return ckpt.write_checkpoint(path, files)

    def load(self, path: str, adapter_name: str | None = None, **kwargs) -> None:
        """Load adapter weights from a checkpoint; the rank must match the adapter's."""
        s = self._resolve(adapter_name)
        config = ckpt.read_json(path, ckpt.ADAPTER_CONFIG)
        if int(config["r"]) != s.rank:
            raise InvalidArgumentError(
                f"checkpoint rank {config['r']} does not match adapter {s.label!r} rank {s.rank}"
            )
        params = ckpt.read_arrays(path, ckpt.ADAPTER_WEIGHTS)
        for key, value in params.items():
            if not np.isfinite(value).all():
                raise InvalidArgumentError(
                    f"the checkpoint holds non-finite adapter weights ({key}): refused"
                )
        s.params = params
        s.alpha = float(config["lora_alpha"])
        # Gradients and the accumulation window belong to the previous weights.
        s.zero_grad()
        s.micro_steps = 0

    def resume_from_checkpoint(self, path: str, adapter_name: str | None = None, **kwargs) -> dict:
        """Restore weights, optimizer, schedule and progress; return the progress."""
        self.load(path, adapter_name)
        s = self._resolve(adapter_name)
        trainer = ckpt.read_json(path, ckpt.TRAINER_STATE)
        s.cur_step, s.micro_steps = trainer["cur_step"], trainer["micro_steps"]
        s.schedule = LRSchedule(
            trainer["lr_scheduler"]["name"], **trainer["lr_scheduler"]["kwargs"]
        )
        if "optimizer" in trainer:
            opt = dict(trainer["optimizer"])
            steps = opt.pop("steps")
            s.optimizer = NumpyOptimizer(opt.pop("name"), **opt)
            s.optimizer.steps, s.optimizer.state = (
                steps,
                ckpt.read_arrays(path, ckpt.OPTIMIZER_STATE),
            )
        return {"cur_step": s.cur_step, "consumed_train_samples": trainer["consumed_train_samples"]}

    # Internals.

    def _resolve(self, adapter_name: str | None) -> AdapterState:
        if adapter_name is None:
            if len(self._adapters) != 1:
                raise InvalidArgumentError(
                    f"adapter_name is required when the model holds {len(self._adapters)} adapters"
                )
            return next(iter(self._adapters.values()))
        if adapter_name not in self._adapters:
            raise UnknownAdapterError(
                f"unknown adapter {adapter_name!r}; known: {sorted(self._adapters)}"
            )
        return self._adapters[adapter_name]

    def _logprobs(self, state: AdapterState, inputs: Any, bare: bool = False):
        """The flattened batch, each position's target log-prob, and the forward's cache
        (``bare``: without the adapter)."""
        rows = [inputs] if isinstance(inputs, dict) else list(inputs)
        if not rows:
            raise InvalidArgumentError("inputs must hold at least one row")
        batch = flatten(rows, self.vocab_size)
        logprobs_N_V, cache = _lora.forward(
            self.base,
            state.params["A"],
            state.params["B"],
            0.0 if bare else state.scale,
            batch.ids_N,
        )
        n = len(batch.ids_N)
        lp_N = np.where(batch.valid_N, logprobs_N_V[np.arange(n), batch.targets_N], 0.0)
        return batch, lp_N, (logprobs_N_V, cache)

    def _run(self, state: AdapterState, inputs: Any, advantages: Any, with_grads: bool):
        rows = [inputs] if isinstance(inputs, dict) else list(inputs)
        batch, lp_N, (logprobs_N_V, cache) = self._logprobs(state, rows)
        loss, dloss_dlp_N = self._loss(state, rows, batch, lp_N, advantages)
        correct = int(np.sum((logprobs_N_V.argmax(-1) == batch.targets_N) & batch.valid_N))
        totals = state.train_totals if with_grads else state.eval_totals
        totals.add(loss, correct, int(batch.valid_N.sum()))
        grads = {}
        if with_grads:
            grad_a, grad_b = _lora.backward(
                self.base, state.params["B"], state.scale, cache, batch.targets_N, dloss_dlp_N
            )
            grads = {"A": grad_a, "B": grad_b}
        return loss, per_row(batch, lp_N), grads

    def _loss(self, state, rows, batch: Batch, lp_N, advantages) -> tuple[float, np.ndarray]:
        """Return the loss and dloss/d(target logprob) per position."""
        valid = batch.valid_N.astype(np.float64)
        if state.loss_name != "importance_sampling":
            # CrossEntropyLoss averages over label tokens; Tinker's cross_entropy sums.
            count = max(valid.sum(), 1.0) if state.loss_name == "CrossEntropyLoss" else 1.0
            return float(-lp_N.sum() / count), -valid / count
        if advantages is None:
            if any("advantages" not in row for row in rows):
                raise InvalidArgumentError(
                    "loss 'importance_sampling' requires the input 'advantages'"
                )
            advantages = [row["advantages"] for row in rows]
        adv_N = np.asarray(advantages, dtype=np.float64).reshape(-1)[batch.row_N]
        old_N = lp_N.copy()
        for i, row in enumerate(rows):
            if "old_logprobs" in row:
                old_N[batch.row_N == i] = np.asarray(row["old_logprobs"], dtype=np.float64)[1:]
        ratio_N = np.exp(lp_N - old_N) * valid
        # Summed, not averaged, as Tinker defines importance_sampling.
        return float(-(ratio_N * adv_N).sum()), -ratio_N * adv_N


def _norm(grads: dict[str, np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(g)) for g in grads.values())))


def _guarded_step(
    state: AdapterState, grads: dict[str, np.ndarray], max_norm: float | None, lr: float
) -> float:
    """Clip (``torch.nn.utils.clip_grad_norm_`` semantics, its 1e-6 guard included) and step,
    through :func:`twinkle.model.numerics.guarded_step`; returns the norm before clipping."""
    clipped: dict[str, dict[str, np.ndarray]] = {}

    def clip() -> list[float]:
        norm = _norm(grads)
        scale = max_norm / (norm + 1e-6) if max_norm is not None and norm > max_norm else 1.0
        clipped["grads"] = {k: g * scale for k, g in grads.items()}
        return [norm]

    def take(_: int):
        optimizer = state.optimizer
        params = {k: v.copy() for k, v in state.params.items()}
        moments = {k: v.copy() for k, v in optimizer.state.items()}
        steps = optimizer.steps

        def restore() -> None:
            state.params = params
            optimizer.state.clear()  # in place: a copied optimizer shares this dict
            optimizer.state.update(moments)
            optimizer.steps = steps

        return restore

    (norm,) = numerics.guarded_step(
        [state.name],
        take=take,
        clip=clip,
        apply=lambda: _step_quietly(state, clipped["grads"], lr),
        finite=lambda: [all(np.isfinite(v).all() for v in state.params.values())],
        hyper=f"lr {lr:g}, weight_decay {state.optimizer.weight_decay:g}",
    )
    return norm


def _step_quietly(state: AdapterState, grads: dict[str, np.ndarray], lr: float) -> None:
    """The optimizer step; an overflow is the guard's to report, not a numpy warning's."""
    with np.errstate(over="ignore", invalid="ignore"):
        state.optimizer.step(state.params, grads, lr)


def _adamw_step(state: AdapterState, params: AdamParams) -> float:
    """A Tinker-style AdamW step with this call's hyper-parameters (the moments kept); on a
    refusal the adapter keeps its previous optimizer and settings too."""
    previous = state.optimizer
    hyper = {
        "betas": (params.beta1, params.beta2),
        "eps": params.eps,
        "weight_decay": params.weight_decay,
    }
    if previous is None or previous.name != "AdamW":
        state.optimizer = NumpyOptimizer("AdamW", lr=params.learning_rate, **hyper)
    else:  # a copy of the settings: a refused step leaves the optimizer as it was
        state.optimizer = copy.copy(previous)
        opt = state.optimizer
        opt.lr, opt.betas, opt.eps = params.learning_rate, hyper["betas"], params.eps
        opt.weight_decay = params.weight_decay
    max_norm = params.grad_clip_norm if params.grad_clip_norm > 0 else None
    try:
        return _guarded_step(state, state.grads, max_norm, params.learning_rate)
    except NonFiniteUpdateError:
        state.optimizer = previous
        raise


def _check_inputs(kwargs: dict) -> None:
    """Refuse the torch backends' inputs that the mock cannot honour, naming them.

    Raises:
        InvalidArgumentError: a reference, a teacher, or an embedding task.
    """
    given = [key for key in _UNSUPPORTED_INPUTS if kwargs.get(key) is not None]
    if kwargs.get("task", "causal_lm") != "causal_lm":
        given.append(f"task={kwargs['task']!r}")
    if given:
        raise InvalidArgumentError(
            f"the mock backend does not support {', '.join(given)} (its losses are "
            "CrossEntropyLoss, cross_entropy and importance_sampling); serve backend: "
            "transformers for reference, distillation and embedding training"
        )


def model_vocab_size(model_id: str) -> int:
    """The vocabulary size of ``model_id``'s config, or 256 for an id that names no model.

    An image-text model's config (e.g. ``Qwen3_5Config``) has no top-level ``vocab_size``: its
    text model's (``text_config.vocab_size``) is the vocabulary its tokens come from. ``mock``, or
    an id that resolves to no model directory (ModelScope Twinkle's ``mock-model``), gets the
    mock's default 256: a mock needs no real model.
    """
    if model_id == "mock":
        return 256
    from twinkle.hub import load_config
    from twinkle.hub._resolve import ModelNotFoundError

    try:
        config = load_config(model_id)
    except ModelNotFoundError:
        return 256
    vocab = getattr(config, "vocab_size", None)
    if vocab is None:
        vocab = getattr(getattr(config, "text_config", None), "vocab_size", None)
    if vocab is None:
        raise InvalidArgumentError(f"the config of {model_id!r} names no vocab_size")
    return int(vocab)
