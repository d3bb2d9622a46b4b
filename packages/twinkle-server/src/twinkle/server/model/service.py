"""The model deployment's logic, free of any web or Ray code: tenants' adapters on one base model,
fair queues with fused ``forward_backward``, rate limits and the adapter lifecycle."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from twinkle.errors import WorkerLostError
from twinkle.hub.upload import UploadTracker
from twinkle.model.protocol import capabilities_of
from twinkle.server.hub import HubPublisher
from twinkle.server.model.operations import (
    check_lengths,
    clip_grad_and_step_many,
    count_tokens,
    native_operations,
    training_kwargs,
)
from twinkle.server.model.protocol import Call, Empty, Operation, OperationTable, Request
from twinkle.server.model.registry import RunRegistry
from twinkle.server.model.scheduler import FUSABLE, FairScheduler, Task
from twinkle.server.ratelimit import RateLimiter
from twinkle.server.state._history import RunHistory
from twinkle.server.state.paths import validate_id
from twinkle.server.web.encoding import jsonable
from twinkle.server.web.errors import (
    AtCapacity,
    BadRequest,
    Gone,
    InternalError,
    NotFound,
    from_exception,
)
from twinkle.server.web.request_ids import new_request_id

logger = logging.getLogger("twinkle.server.model")


@dataclass(frozen=True)
class Job:
    """What the scheduler runs for one queued call."""

    operation: Operation
    call: Call
    request: Request


@dataclass
class AdapterEntry:
    """One tenant adapter living on the shared model."""

    owner: str
    name: str
    internal: str
    run_id: str
    rank: int
    session_id: str | None
    created_at: float
    last_used: float
    steps: int = 0
    tokens: int = 0
    losses: int = 0
    last_loss: float | None = None
    first_trained_at: float | None = None
    # The LoraConfig fields it was created with (an uploaded adapter is checked against them).
    lora_config: dict[str, Any] = field(default_factory=dict)
    history: Any = None  # figures since its last optimizer step (state/_history.py)


class ModelService:
    """All tenants' training calls against one shared base model.

    Every call is ``await service.call(owner, op, payload)``: ``owner`` is the authenticated
    tenant; adapter names are per tenant, so two API keys can both have an adapter ``default``.

    Args:
        model: The backend model (``MultiLoraTransformersModel`` or ``MockModel``).
        base_model: The name clients use for it (``tiny/qwen3.5``, ``Qwen/Qwen3.5-4B``).
        registry: Where runs and checkpoints are recorded.
        max_loras: Adapters the model holds on its device at once. Without paging more ->
            :class:`AtCapacity`; with paging, the least recently used idle ones are paged out.
        adapter_paging: ``off``, ``host`` or ``storage`` (see :mod:`twinkle.model.paging`);
            ``off`` also for a backend that cannot page (the mock, Megatron).
        max_paged_adapters: Adapters paged out at once (None: as many as storage holds).
        paging_storage: Directory for paged adapters (mode ``storage``, or host overflow).
        max_paged_host_bytes: Host memory paged adapters may hold (None: unbounded).
        max_lora_rank: Largest rank accepted.
        per_token_model_limit: Adapters one API key may hold server-wide.
        adapter_timeout: Seconds of idleness after which an adapter is unloaded.
        adapter_max_lifetime: Seconds after which an adapter is unloaded regardless.
        rate_limiter: Per-tenant request/token limits.
        max_fused: Most tenants fused into one pass.
        fuse_wait_s: Longest a fusable group waits for tenants about to join it.
        executor: The single thread that built ``model`` (see
            :func:`~twinkle.server.process.threads.model_thread`); every call runs on it.
        operations: The operations served (default: the Twinkle-native ones; the deployment
            adds the Tinker ones, see :func:`twinkle.server.model.tinker_ops.tinker_operations`).
        hub: Hub settings and token rule of ``upload_to_hub`` (default: environment only).
    """

    def __init__(
        self,
        model: Any,
        base_model: str,
        registry: RunRegistry,
        *,
        max_loras: int = 8,
        max_lora_rank: int = 64,
        per_token_model_limit: int | None = None,
        adapter_timeout: float | None = 1800,
        adapter_max_lifetime: float | None = 36000,
        rate_limiter: RateLimiter | None = None,
        max_fused: int = 8,
        max_length: int | None = None,
        clock: Callable[[], float] = time.time,
        on_task_done: Callable[[Task, float, float, bool], None] | None = None,
        executor: ThreadPoolExecutor | None = None,
        fuse_wait_s: float = 0.02,
        operations: OperationTable | None = None,
        hub: HubPublisher | None = None,
        adapter_paging: str = "off",
        max_paged_adapters: int | None = None,
        paging_storage: Any = None,
        max_paged_host_bytes: int | None = None,
    ) -> None:
        self.model = model
        self.hub = hub or HubPublisher()
        self.uploads = UploadTracker()  # this replica's background hub uploads
        self.operations = operations or native_operations()
        self.capabilities = capabilities_of(model)
        self.base_model = base_model
        self.registry = registry
        self.max_loras, self.max_lora_rank = max_loras, max_lora_rank
        self.per_token_model_limit = per_token_model_limit
        self.adapter_timeout, self.adapter_max_lifetime = adapter_timeout, adapter_max_lifetime
        self.rate_limiter = rate_limiter or RateLimiter()
        self.max_length = max_length
        self.clock = clock
        self.adapters: dict[str, AdapterEntry] = {}
        self.unloaded: dict[str, str] = {}  # internal name -> why
        # Runs created before this service started live in no process any more (lost).
        self.started_at = clock()
        self.lost_reason = "the model server restarted"  # what took them (the 410's text)
        # The backends that page declare it: the transformers model (megatron shards its
        # adapters, and the data-parallel wrappers hold them in worker processes).
        self.paging = adapter_paging != "off" and self.capabilities.adapter_paging
        self.max_paged_adapters = max_paged_adapters if self.paging else 0
        # Each run's per-step figures, kept with the run in the state store.
        self.history = RunHistory(getattr(registry, "state", None), model, clock)
        self.scheduler = FairScheduler(
            self._run_single,
            self._run_fused,
            # One fused pass holds its tenants on the device together.
            max_fused=min(max_fused, max_loras) if self.paging else max_fused,
            on_done=on_task_done,
            executor=executor,
            fuse_wait_s=fuse_wait_s,
            fusable=self._fusable(),
        )
        if self.paging:
            # A tenant with a call queued is about to run: never paged out for another.
            model.enable_paging(
                max_loras,
                mode=adapter_paging,
                storage_dir=paging_storage,
                max_host_bytes=max_paged_host_bytes,
                max_paged=max_paged_adapters,
                busy=lambda name: self.scheduler.depth(name) > 0,
            )

    def _fusable(self) -> tuple[str, ...]:
        """The kinds the scheduler may fuse: what the backend declares it can run together."""
        can = {
            "forward_backward": self.capabilities.fused_forward_backward,
            "clip_grad_and_step": self.capabilities.batched_optimizer_step,
        }
        return tuple(kind for kind in FUSABLE if can[kind])

    # ------------------------------------------------------------------ entry point
    async def call(
        self,
        owner: str,
        op: str,
        payload: dict[str, Any] | None = None,
        presented_key: str | None = None,
    ) -> Any:
        """Run ``op`` for tenant ``owner``; raises :class:`~twinkle.server.web.errors.ServiceError`.

        The body is validated against the operation's request model and admitted (adapter
        exists or may be created, rate limits, lengths) before it is queued: a refused call
        changes nothing. ``presented_key`` (the request's API key) reaches only operations that
        declare ``uses_caller_key``; ``off_queue`` operations run on a thread of their own.
        """
        body = dict(payload or {})
        name = body.pop("adapter_name", None) or "default"
        if not isinstance(name, str):
            raise BadRequest(f"adapter_name must be a string, got {type(name).__name__}")
        # The run id is made from the name: refuse a bad one before any record is written.
        validate_id(name, "adapter_name")
        operation, request = self.operations.parse(op, body)
        key = presented_key if operation.uses_caller_key else None
        call = Call(owner, name, self._internal(owner, name), presented_key=key)
        if operation.off_queue:
            try:
                return await asyncio.to_thread(operation.handler, self, call, request)
            except Exception as exc:
                raise from_exception(exc, names={call.internal: call.name}) from exc
        self.admit(operation, call, request, queued=True)
        tokens = count_tokens(request)
        if tokens:
            self.rate_limiter.check(owner, tokens)
            if self.max_length:
                check_lengths(request, self.max_length)
        try:
            return await self.scheduler.submit(call.internal, op, Job(operation, call, request))
        except Exception as exc:
            raise from_exception(exc, names={call.internal: call.name}) from exc

    def _internal(self, owner: str, name: str) -> str:
        return "a" + hashlib.sha1(f"{owner}/{name}".encode()).hexdigest()[:16]

    def _missing(self, call: Call) -> NotFound | Gone:
        why = self.unloaded.get(call.internal)
        if why:
            return NotFound(
                f"adapter {call.name!r} was unloaded ({why}); add it again or resume from a checkpoint"
            )
        self._lost_runs(call.owner)
        # The name's newest run, lost now or earlier: 410 on every call until the owner adds
        # the name again (never "unknown adapter" on the second call, inviting a fresh start).
        runs = self.registry.runs_named(call.owner, self.base_model, call.name)
        if runs and runs[-1].status == "lost":
            return self._lost_error(call.name, runs[-1])
        return NotFound(f"unknown adapter {call.name!r}: call add_adapter_to_model first")

    def _lost_runs(self, owner: str) -> list[Any]:
        """``owner``'s runs on this model still marked active that no adapter here holds and
        that an earlier process created: the server restarted under them. Marked ``lost``."""
        held = {e.run_id for e in self.adapters.values()}
        lost = [
            r
            for r in self.registry.active_runs(owner, self.base_model)
            if r.training_run_id not in held and r.created_at < self.started_at
        ]
        for run in lost:
            self.registry.set_run_status(owner, run.training_run_id, "lost")
        return lost

    def _lost_error(self, name: str, run: Any) -> Gone:
        """Lost, never silently fresh: the owner is told what is gone and where to resume."""
        last = (run.last_checkpoint or {}).get("tinker_path")
        if last and run.training_run_id != name:  # a native run: its twinkle:// path
            last = "twinkle://" + last.split("://", 1)[1]
        where = (
            f"resume from its newest checkpoint {last} (a new adapter, then resume_from_checkpoint)"
            if last
            else "it had no checkpoint: add a new adapter to start again from fresh weights"
        )
        return Gone(
            f"adapter {name!r} (training run {run.training_run_id}) was lost: {self.lost_reason}"
            f" and the weights it trained since its last checkpoint are gone; {where}"
        )

    def admit(
        self, operation: Operation, call: Call, request: Request, queued: bool = False
    ) -> None:
        """Every admission check of a call, in one place: run when the call is queued
        (``queued``) and again when it runs on the model thread, where one call runs at a
        time (another call may have changed the adapters in between). ``max_loras`` holds
        there; ``per_token_model_limit``, shared by every model of the server, is checked
        early here and enforced where the run is created, atomically with its record
        (:meth:`~twinkle.server.model.registry.StateRunRegistry.create_run`).

        Raises:
            BadRequest: Rank over ``max_lora_rank``, a duplicate name, or the tenant's
                ``per_token_model_limit`` reached.
            AtCapacity: The model holds ``max_loras`` adapters already (retry later).
            NotFound: Any other call for an adapter that does not exist.
        """
        if not operation.creates_adapter:
            if call.internal not in self.adapters:
                raise self._missing(call)
            return
        rank = request.rank  # type: ignore[attr-defined]
        if rank > self.max_lora_rank:
            raise BadRequest(
                f"LoRA rank {rank} is over this server's max_lora_rank={self.max_lora_rank}"
            )
        if call.internal in self.adapters:
            raise BadRequest(f"adapter {call.name!r} already exists for this API key")
        if queued:
            self._lost_runs(call.owner)  # lost runs hold no adapter: they do not count
        if (
            queued
            and self.per_token_model_limit is not None
            and self.registry.count_active_runs(call.owner) >= self.per_token_model_limit
        ):
            raise BadRequest(
                f"this API key already holds {self.per_token_model_limit} adapters (per_token_model_limit); "
                "remove one first"
            )
        if self.max_paged_adapters is None:
            return  # paged adapters bounded by storage only: the model says when it is full
        if len(self.adapters) >= self.max_loras + self.max_paged_adapters:
            paged = f", max_paged_adapters={self.max_paged_adapters}" if self.paging else ""
            raise AtCapacity(
                f"model {self.base_model} is at capacity (max_loras={self.max_loras}{paged}); "
                "retry later",
                retry_after=5.0,
            )

    def entry(self, call: Call) -> AdapterEntry:
        """The adapter ``call`` is for (:class:`NotFound` when it does not exist)."""
        entry = self.adapters.get(call.internal)
        if entry is None:
            raise self._missing(call)
        return entry

    def adapter_added(
        self,
        call: Call,
        run_id: str,
        rank: int,
        session_id: str | None,
        lora_config: dict[str, Any] | None = None,
    ) -> None:
        now = self.clock()
        self.adapters[call.internal] = AdapterEntry(
            call.owner,
            call.name,
            call.internal,
            run_id,
            rank,
            session_id,
            now,
            now,
            lora_config=dict(lora_config or {}),
        )
        self.unloaded.pop(call.internal, None)

    def adapter_removed(self, call: Call, entry: AdapterEntry) -> None:
        del self.adapters[call.internal]
        self.unloaded[call.internal] = call.reason or "removed by its owner"
        self.registry.set_run_status(
            entry.owner, entry.run_id, "unloaded" if call.reason else "removed"
        )

    # ------------------------------------------------------------------ execution (worker thread)
    def _run_single(self, task: Task) -> Any:
        job: Job = task.payload
        self.admit(job.operation, job.call, job.request)
        try:
            result = job.operation.handler(self, job.call, job.request)
        except Exception as exc:
            if not _worker_lost(exc):
                raise
            self._recover_workers(exc)
            raise self._missing(job.call) from None
        if task.tenant in self.adapters:
            self.adapters[task.tenant].last_used = self.clock()
            self._note_progress(job, result)
        return result

    def _run_fused(self, tasks: list[Task]) -> list[Any]:
        jobs: list[Job] = [task.payload for task in tasks]
        for job in jobs:
            self.admit(job.operation, job.call, job.request)
        try:
            if tasks[0].kind == "forward_backward":
                requests = {job.call.internal: training_kwargs(job.request) for job in jobs}
                results = self.model.forward_backward_many(requests)
            else:
                results = clip_grad_and_step_many(
                    self, [job.call for job in jobs], [job.request for job in jobs]
                )
        except Exception as exc:
            if _worker_lost(exc):  # the scheduler reruns each alone: each gets its 410
                self._recover_workers(exc)
            raise
        now = self.clock()
        wire = [jsonable(results[job.call.internal]) for job in jobs]
        for job, result in zip(jobs, wire):
            self.adapters[job.call.internal].last_used = now
            self._note_progress(job, result)
        return wire

    def _note_progress(self, job: Job, result: Any) -> None:
        """Steps, trained tokens and last loss of the job's adapter (status table, metrics)."""
        entry = self.adapters[job.call.internal]
        if job.operation.trains:
            entry.tokens += count_tokens(job.request)
            entry.first_trained_at = entry.first_trained_at or self.clock()
        if job.operation.steps:
            entry.steps += 1
        loss = result.get("loss") if isinstance(result, dict) else None
        if job.operation.trains and isinstance(loss, (int, float)):
            entry.last_loss, entry.losses = float(loss), entry.losses + 1
        self.history.note(entry, job.operation, result)

    def _recover_workers(self, exc: Exception) -> None:
        """A data-parallel worker died (``WorkerLostError``): restart the worker group, and drop
        every adapter. Their state died with the worker; reloading each from its last
        checkpoint would silently roll back the steps trained since, so each run is reported
        lost (410, as after a restart) and its owner resumes from its newest checkpoint."""
        rank = getattr(exc, "rank", "?")
        try:
            report = self.model.recover()  # on the model thread: the scheduler's worker
            for name in [*report["reloaded"], *report["lost"]]:
                self.model.remove_adapter(name)
        except Exception as error:  # noqa: BLE001 - the next call tries again
            rid = new_request_id()
            logger.error("request %s: restarting the workers failed", rid, exc_info=error)
            raise InternalError(
                f"data-parallel worker rank {rank} of model {self.base_model} died and its "
                f"workers could not be restarted; retry later (request id {rid})",
                request_id=rid,
            ) from error
        self.adapters.clear()
        self.started_at = self.clock()  # every run created before now held an adapter: lost
        self.lost_reason = (
            f"data-parallel worker rank {rank} of the model died (its workers were restarted)"
        )

    # ------------------------------------------------------------------ lifecycle
    async def sweep(self, now: float | None = None) -> list[str]:
        """Unload adapters idle past ``adapter_timeout`` or older than ``adapter_max_lifetime``."""
        now = self.clock() if now is None else now
        doomed = []
        for entry in list(self.adapters.values()):
            if self.adapter_timeout is not None and now - entry.last_used > self.adapter_timeout:
                doomed.append(
                    (entry, f"idle for more than adapter_timeout={self.adapter_timeout:g} s")
                )
            elif (
                self.adapter_max_lifetime is not None
                and now - entry.created_at > self.adapter_max_lifetime
            ):
                doomed.append(
                    (entry, f"older than adapter_max_lifetime={self.adapter_max_lifetime:g} s")
                )
        for entry, why in doomed:
            await self.unload(entry, why)
        return [entry.name for entry, _ in doomed]

    async def unload_session(
        self, session_id: str, why: str = "its session stopped heartbeating"
    ) -> list[str]:
        """Unload every adapter created under ``session_id``."""
        entries = [e for e in self.adapters.values() if e.session_id == session_id]
        for entry in entries:
            await self.unload(entry, why)
        return [e.name for e in entries]

    async def unload(self, entry: AdapterEntry, why: str) -> None:
        call = Call(entry.owner, entry.name, entry.internal, reason=why)
        job = Job(self.operations.get("remove_adapter"), call, Empty())
        await self.scheduler.submit(entry.internal, "remove_adapter", job)

    def status(self, owner: str | None = None) -> dict[str, Any]:
        """Queue depth and adapters, for health checks and the status table.

        ``tenants`` lists ``owner``'s own adapters only (other tenants are just counted).
        """
        return {
            "base_model": self.base_model,
            "adapters": len(self.adapters),
            "max_loras": self.max_loras,
            "paging": self.model.pager.describe() if self.paging else None,
            "queue_depth": self.scheduler.depth(),
            "fused_passes": self.scheduler.fused_passes,
            "fused_steps": self.scheduler.fused_steps,
            "fused_fallbacks": self.scheduler.fused_fallbacks,
            "busy_s": round(self.scheduler.busy_s, 3),
            "rate_limit_rejections": self.rate_limiter.rejections,
            "tenants": [
                self._status_row(e)
                for e in self.adapters.values()
                if owner is not None and e.owner == owner
            ],
        }

    def _status_row(self, entry: AdapterEntry) -> dict[str, Any]:
        elapsed = entry.last_used - entry.first_trained_at if entry.first_trained_at else 0.0
        return {
            "adapter_name": entry.name,
            "training_run_id": entry.run_id,
            "rank": entry.rank,
            "steps": entry.steps,
            "tokens": entry.tokens,
            "last_loss": entry.last_loss,
            "tokens_per_s": entry.tokens / elapsed if elapsed > 0 else None,
            "queue_depth": self.scheduler.depth(entry.internal),
            "idle_s": self.clock() - entry.last_used,
        }


def _worker_lost(exc: BaseException) -> bool:
    """A data-parallel worker died (the library's ``WorkerLostError``)."""
    return isinstance(exc, WorkerLostError)


__all__ = ["AdapterEntry", "FUSABLE", "Job", "ModelService"]
