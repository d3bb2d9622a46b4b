"""The worker ranks of a ``ParallelMegatronModel`` and the two ways to launch them.

A rank is one process of the ``torch.distributed`` world: it joins the process group (gloo on
CPU, nccl on CUDA), sets up megatron's parallel state and builds its model (:func:`build_rank`),
then runs the driver's calls one at a time (:func:`run_call`). Both launchers run exactly these two
functions, so the ranks behave the same however they were started:

* :class:`ProcessRanks` (``launcher="process"``): ``torch.multiprocessing`` spawned processes on
  this host, fed through queues, rendezvous on ``127.0.0.1``. Library use without Ray.
* :class:`RayRanks` (``launcher="ray"``): one Ray actor per rank, reserved as one placement-group
  bundle each (``{"GPU": 1}`` or ``{"CPU": num_cpus}``), so a multi-node cluster can host the
  ranks; the rendezvous is rank 0's node IP and a port free there.

Both answer ``run(name, messages)`` with every rank's ``(ok, value)`` and raise a
``RuntimeError`` naming the ranks when one has died or the call timed out, after closing the rest
(a survivor would wait in its next collective for the dead peer forever).
"""

from __future__ import annotations

import socket
import traceback
from dataclasses import dataclass, field
from typing import Any

#: Methods that write files: run on the answering rank alone (every tp rank holds the same
#: adapters). Under pp ``save`` runs on every rank: the stages gather their layers, one writes;
#: under tp the other ranks join the gather of the sharded optimizer state (``_join_save``).
RANK0_ONLY = frozenset({"save", "upload_to_hub"})
#: Methods whose small per-rank answers every rank sends back (the others: the answering ranks').
EVERY_RANK = frozenset({"computed_rows", "optimizer_state_numel"})
#: The message that runs one dp replica's rows of a ``forward_backward_many``.
DP_FORWARD_BACKWARD = "__dp_forward_backward_many"
#: Seconds a worker may take to build its model or answer one call before the driver gives up.
CALL_TIMEOUT_S = 600.0
#: After one rank has answered with an error, how long the others may still take (at least; twice
#: the call's time up to that error when longer). A rank that fails alone leaves its peers in a
#: collective that waits for it (a tp all-reduce, a pp receive); past this they are taken as stuck.
PEER_GRACE_S = 30.0
#: Logical CPUs a CPU rank actor reserves by default: each rank runs one torch thread, and a
#: fraction lets a tp x pp = 4 world fit beside the Serve replicas of a 2-core host.
DEFAULT_RAY_CPUS = 0.25
LAUNCHERS = ("process", "ray")


@dataclass
class Rank:
    """What one rank holds between calls."""

    rank: int
    model: Any
    answer: int  # the rank whose results the driver answers
    answers: list[int] = field(default_factory=list)  # the ranks whose results are sent back
    pp: int = 1
    tp: int = 1
    sync: Any = None  # dp > 1: the replica's gradient synchronisation


def build_rank(rank: int, world: int, host: str, port: int, kwargs: dict) -> Rank:
    """Join the world at ``tcp://host:port`` and build this rank's model shard."""
    import torch
    import torch.distributed as dist

    from twinkle.env import TWINKLE_MEGATRON_THREADS
    from twinkle.model.megatron import _moe

    torch.set_num_threads(TWINKLE_MEGATRON_THREADS.get())
    kwargs = dict(kwargs)
    cuda = torch.cuda.is_available() and kwargs.get("device") != "cpu"
    if cuda:  # under Ray the actor sees its one GPU only: device 0
        torch.cuda.set_device(rank % torch.cuda.device_count())
        kwargs["device"] = f"cuda:{torch.cuda.current_device()}"
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{host}:{port}",
        world_size=world,
        rank=rank,
    )
    _moe.init_expert_parallel(kwargs)  # ep_size > 1: the experts split over the ranks
    pp, answer = kwargs.get("pp_size", 1), kwargs.pop("answer_rank", 0)
    answers, dp = kwargs.pop("replica_answers", [answer]), kwargs.pop("dp_size", 1)
    if pp > 1:
        from twinkle.model.megatron._pp_model import PipelineMegatronModel

        model = PipelineMegatronModel(**kwargs)
    else:
        from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel

        model = MultiLoraMegatronModel(**kwargs)
    state = Rank(rank, model, answer, answers, pp, int(kwargs.get("tp_size", 1) or 1))
    if dp > 1:
        from megatron.core import parallel_state as ps

        from twinkle.model.megatron._dp_world import replica_sync

        state.sync = replica_sync(model, ps.get_data_parallel_rank(), dp)
    return state


def run_call(state: Rank, name: str, args: tuple, kw: dict) -> tuple[bool, Any]:
    """``(True, result)`` of ``model.<name>(*args, **kw)`` on this rank, or ``(False, error)``."""
    try:
        if (
            name in RANK0_ONLY
            and state.rank != state.answer
            and not (state.pp > 1 and name == "save")
        ):
            result = (
                state.model._join_save(*args, **kw) if state.tp > 1 and name == "save" else None
            )
        elif name == DP_FORWARD_BACKWARD:  # this replica's rows, gradients synchronised
            result = state.sync.forward_backward_many(*args, **kw)
        else:
            result = getattr(state.model, name)(*args, **kw)
            if callable(result) or name == "routes":
                raise TypeError(f"{name} returns a context or callable; not remotable")
        if state.sync is not None:
            state.sync._wrap_losses()  # a new tenant's loss records its shard statistics
        return True, (result if state.rank in state.answers or name in EVERY_RANK else None)
    except BaseException as exc:  # the driver re-raises it
        return False, portable(exc)


def leave_world() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError carrying its text and traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")


def choose_launcher(launcher: str | None) -> str:
    """``launcher`` as given, else ``"ray"`` when Ray is initialised here (a Serve replica, or a
    script that called ``ray.init``), else ``"process"``."""
    if launcher is not None:
        if launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
        return launcher
    try:
        import ray
    except ImportError:
        return "process"
    return "ray" if ray.is_initialized() else "process"


def lost(name: str, what: str) -> RuntimeError:
    return RuntimeError(
        f"megatron ranks did not answer {name}: {what}; the workers are closed, rebuild the model"
    )


class FailureWatch:
    """The deadline of one call's gather: ``CALL_TIMEOUT_S``, cut short once a rank has failed
    (:data:`PEER_GRACE_S`), so that a rank failing alone costs its call seconds, not the timeout."""

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self.started = self._clock()
        self.deadline = self.started + CALL_TIMEOUT_S
        self.failed: tuple[int, BaseException] | None = None

    def saw(self, rank: int, ok: bool, value: Any) -> None:
        if not ok and self.failed is None:
            self.failed = (rank, value)
            now = self._clock()
            grace = max(PEER_GRACE_S, 2 * (now - self.started))
            self.deadline = min(self.deadline, now + grace)

    def left(self) -> float:
        return self.deadline - self._clock()

    def stuck(self, name: str, waiting: list[int]) -> RuntimeError:
        """The error for ranks ``waiting`` that never answered by the deadline."""
        if self.failed is None:
            return lost(name, "timed out")
        rank, error = self.failed
        return lost(
            name,
            f"rank {rank} failed ({type(error).__name__}: {error}) and ranks {waiting} "
            f"were still waiting for it {self._clock() - self.started:.0f} s into the call "
            "(a collective that rank never joined)",
        )


def _process_main(rank: int, world: int, port: int, kwargs: dict, inbox, outbox) -> None:
    try:
        state = build_rank(rank, world, "127.0.0.1", port, kwargs)
        outbox.put((rank, True, None))
    except BaseException as exc:
        outbox.put((rank, False, portable(exc)))
        return
    while (message := inbox.get()) is not None:
        outbox.put((rank, *run_call(state, *message)))
    leave_world()


class ProcessRanks:
    """``world`` spawned processes on this host, each running :func:`_process_main`."""

    kind = "process"

    def __init__(self, world: int) -> None:
        import torch.multiprocessing as mp

        self.world, self.procs, self._ctx = world, [], mp.get_context("spawn")

    @property
    def closed(self) -> bool:
        return not self.procs

    def start(self, kwargs: dict) -> dict[int, tuple[bool, Any]]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._outbox = self._ctx.Queue()
        self._inboxes = [self._ctx.Queue() for _ in range(self.world)]
        self.procs = [
            self._ctx.Process(
                target=_process_main,
                args=(rank, self.world, port, kwargs, self._inboxes[rank], self._outbox),
                daemon=True,
            )
            for rank in range(self.world)
        ]
        for proc in self.procs:
            proc.start()
        return self._gather("__init__")

    def run(self, name: str, messages: list[tuple]) -> dict[int, tuple[bool, Any]]:
        for inbox, message in zip(self._inboxes, messages):
            inbox.put(message)
        return self._gather(name)

    def _gather(self, name: str) -> dict[int, tuple[bool, Any]]:
        import queue

        results: dict[int, tuple[bool, Any]] = {}
        watch = FailureWatch()
        while len(results) < self.world:
            try:
                rank, ok, value = self._outbox.get(timeout=max(0.0, min(1.0, watch.left())))
            except queue.Empty:
                dead = {r: p.exitcode for r, p in enumerate(self.procs) if not p.is_alive()}
                if dead:
                    self.close()
                    raise lost(name, f"ranks {dead} exited (rank: exit code)") from None
                if watch.left() <= 0:
                    self.close()
                    waiting = sorted(set(range(self.world)) - set(results))
                    raise watch.stuck(name, waiting) from None
                continue
            results[rank] = (ok, value)
            watch.saw(rank, ok, value)
        return results

    def close(self) -> None:
        # Only started processes: a start that failed part-way leaves some never started.
        started = [(r, p) for r, p in enumerate(self.procs) if p.pid is not None]
        self.procs = []
        for rank, proc in started:
            if proc.is_alive():
                self._inboxes[rank].put(None)
        for _, proc in started:
            # A rank blocked in a collective with a dead peer never reads its inbox: kill it.
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
