"""Model-deployment metrics: task timings and outcomes, queue depth, per-tenant training progress.

Pass :meth:`ModelTaskMetrics.on_task_done` as ``ModelService(on_task_done=...)`` and call
:meth:`ModelTaskMetrics.watch` with the service. Tenants appear only as hashed ids.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twinkle.server.telemetry._pipeline import current_telemetry


def tenant_hash(owner: str) -> str:
    """A short stable id for a tenant in metric attributes (never the API key or tenant id)."""
    return hashlib.sha256(f"twinkle-tenant:{owner}".encode()).hexdigest()[:12]


class ModelTaskMetrics:
    """Records every finished task of one model deployment.

    Args:
        model: Base model name, an attribute of every series.
        component: Component attribute (``Model``).
    """

    def __init__(self, model: str, component: str = "Model") -> None:
        self.model, self.component = model, component
        self.service: Any = None
        self._seen: dict[
            str, tuple[int, int, int]
        ] = {}  # adapter -> steps, tokens, losses recorded

    def watch(self, service: Any) -> None:
        """Publish ``service``'s queue depth and read its adapters' training progress."""
        self.service = service
        current_telemetry().watch_queue(
            service.scheduler.depth, component=self.component, model=self.model
        )

    def on_task_done(self, task: Any, wait_s: float, exec_s: float, ok: bool) -> None:
        """``FairScheduler`` callback (worker thread): timings, outcome, training progress."""
        telemetry = current_telemetry()
        if not telemetry.enabled:
            return
        attrs = {"component": self.component, "model": self.model, "op": task.kind}
        telemetry.task_wait.record(wait_s, attrs)
        telemetry.task_execution.record(exec_s, attrs)
        telemetry.tasks.add(1, {**attrs, "outcome": "ok" if ok else "error"})
        if ok:
            self._record_progress(telemetry, task)

    def _record_progress(self, telemetry: Any, task: Any) -> None:
        entry = self.service.adapters.get(task.tenant) if self.service is not None else None
        if entry is None:
            self._seen.pop(task.tenant, None)
            return
        # Series per tenant (hashed owner: bounded by the API keys), not per adapter: adapters
        # come and go for the server's whole life, and the SDK keeps every attribute set it
        # has seen, up to 2000 per instrument, after which every new one is reported only as
        # ``otel.metric.overflow``. Per-adapter progress is in ``/status``.
        attrs = {"model": self.model, "tenant": tenant_hash(entry.owner)}
        steps, tokens, losses = self._seen.get(task.tenant, (0, 0, 0))
        if entry.steps > steps:
            telemetry.train_steps.add(entry.steps - steps, attrs)
        if entry.tokens > tokens:
            telemetry.train_tokens.add(entry.tokens - tokens, attrs)
        if entry.losses > losses and entry.last_loss is not None:
            telemetry.train_loss.set(entry.last_loss, attrs)
        self._seen[task.tenant] = (entry.steps, entry.tokens, entry.losses)
        if len(self._seen) > 2 * len(self.service.adapters) + 16:  # removed adapters' records
            live = self.service.adapters
            self._seen = {name: seen for name, seen in self._seen.items() if name in live}
