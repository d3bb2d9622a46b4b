"""The optimizer side of the tenant engine: clipping, steps, schedules.

A mixin of :class:`~twinkle.model.engine.TenantEngine`, which
provides ``tenant``, ``set_optimizer``, ``_pinned`` and ``_small_cpu``; the arithmetic lives in
:mod:`twinkle.model.step.optimizer`.
"""

from __future__ import annotations

from typing import Any

from twinkle.errors import StateOrderError
from twinkle.model.protocol import AdamParams
from twinkle.model.protocol import adam_params as adam_params_of
from twinkle.model.step import optimizer as optimizer_steps
from twinkle.model.tenant import Tenant


class OptimizerMethods:
    """Per-tenant optimizer steps, one at a time or batched; every step is guarded
    (:func:`twinkle.model.numerics.guarded_step`)."""

    #: Ranks holding different layers of the same adapters (pipeline stages) set this: their
    #: verdicts on a step combined, so that all of them keep it or all roll it back.
    _step_agreement: optimizer_steps.Agreement | None = None

    def clip_grad_norm(self, max_grad_norm: float = 1.0, adapter_name: str | None = None) -> float:
        """Clip the tenant's gradient norm; returns the norm before clipping."""
        return optimizer_steps.clip_grad_norm(
            self.tenant(adapter_name), max_grad_norm, self._small_cpu
        )

    def step(self, adapter_name: str | None = None) -> None:
        """One optimizer step for the tenant (Adam with lr 1e-4 if none was set)."""
        tenant = self.tenant(adapter_name)
        if not tenant.pending_grads:
            raise StateOrderError(
                f"adapter {tenant.label!r} has no gradients: call forward_backward before step"
            )
        self._ensure_optimizer(tenant)
        optimizer_steps.plain_step(tenant, agree=self._step_agreement)
        tenant.cur_step += 1

    def zero_grad(self, adapter_name: str | None = None) -> None:
        """Discard the tenant's gradients (zeroed in place when they live in its flat buffer)."""
        optimizer_steps.discard_grads(self.tenant(adapter_name))

    def lr_step(self, adapter_name: str | None = None) -> None:
        tenant = self.tenant(adapter_name)
        if tenant.scheduler is not None:
            tenant.scheduler.step()

    def clip_grad_and_step(
        self, max_grad_norm: float = 1.0, adapter_name: str | None = None
    ) -> bool:
        """``clip_grad_norm`` + ``step`` + ``zero_grad`` + ``lr_step`` once every
        ``gradient_accumulation_steps`` calls; returns whether the optimizer stepped."""
        name = self.tenant(adapter_name).name
        return self.clip_grad_and_step_many([name], max_grad_norm)[name]

    def clip_grad_and_step_many(
        self, adapter_names: list[str], max_grad_norm: float = 1.0
    ) -> dict[str, bool]:
        """``clip_grad_and_step`` for several tenants at once, with shared multi-tensor kernels.

        Each tenant's clipping (by its own norm), optimizer update, accumulation count and lr
        schedule equal those of its own ``clip_grad_and_step``; see :mod:`twinkle.model.multi_step`.
        Every tenant is checked before anything changes.

        Returns:
            ``{adapter_name: whether its optimizer stepped}``.
        """
        with self._pinned(list(adapter_names)):
            return self._clip_grad_and_step_many(adapter_names, max_grad_norm)

    def _clip_grad_and_step_many(
        self, adapter_names: list[str], max_grad_norm: float
    ) -> dict[str, bool]:
        return optimizer_steps.clip_grad_and_step_many(
            [self.tenant(name) for name in adapter_names],
            max_grad_norm,
            ensure_optimizer=self._ensure_optimizer,
            lr_step=lambda tenant: self.lr_step(adapter_name=tenant.name),
            small=self._small_cpu,
            agree=self._step_agreement,
        )

    def optim_step(
        self,
        adam_params: AdamParams | dict[str, Any] | None = None,
        adapter_name: str | None = None,
    ) -> dict[str, float]:
        """A Tinker-style optimizer step: clip (when ``grad_clip_norm`` > 0), one AdamW step with
        THIS call's hyper-parameters, zero the gradients.

        The tenant's optimizer becomes AdamW (its moments are kept across calls); the
        hyper-parameters may change from call to call, as Tinker's ``optim_step(AdamParams(...))``
        allows.

        Returns:
            ``{'grad_norm': norm before clipping, 'learning_rate': ..., 'step': steps taken}``.
        """
        params = adam_params_of(adam_params)
        return optimizer_steps.optim_step(
            self.tenant(adapter_name),
            params,
            make_adamw=lambda t, kw: self.set_optimizer("AdamW", adapter_name=t.name, **kw),
            agree=self._step_agreement,
        )

    def _ensure_optimizer(self, tenant: Tenant) -> None:
        """A tenant that steps without an optimizer gets Adam with lr 1e-4."""
        if tenant.optimizer is None:
            self.set_optimizer("Adam", adapter_name=tenant.name, lr=1e-4)


__all__ = ["OptimizerMethods"]
