"""``ParallelMegatronModel``: one multi-LoRA megatron model over ``tp_size * pp_size`` worker
processes.

Each worker is a spawned process that joins one gloo (CPU) or nccl (CUDA) process group, calls
megatron-core's ``parallel_state.initialize_model_parallel(tp_size, pp_size)`` and builds a
:class:`~twinkle.model.megatron.MultiLoraMegatronModel` holding its tensor-parallel shards of the
HF weights (under pp > 1 a :class:`~twinkle.model.megatron._pp_model.PipelineMegatronModel` of
its stage's layers). The driver sends every method call to all ranks in the same order
(collectives and pipeline sends pair up across ranks) and answers the last stage's first rank
(:func:`answer_rank`). Adapters are replicated over tp (see
:mod:`~twinkle.model.megatron._tp_lora`), so at pp 1 ``save`` runs on that rank only; under pp
every rank takes part and one writes: one standard PEFT checkpoint, written once.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp

from twinkle.model.megatron import _moe
from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel

#: Methods that write files: run on the answering rank alone (every tp rank holds the same
#: adapters). Under pp ``save`` runs on every rank: the stages gather their layers, one writes.
RANK0_ONLY = frozenset({"save", "upload_to_hub"})
#: The message that runs one dp replica's rows of a ``forward_backward_many``.
DP_FORWARD_BACKWARD = "__dp_forward_backward_many"
#: Seconds a worker may take to build its model or answer one call before the driver gives up.
CALL_TIMEOUT_S = 600.0


def answer_rank(tp_size: int, pp_size: int, dp_size: int = 1) -> int:
    """The rank whose results the driver answers: the last pipeline stage (its logits and
    losses), tensor rank 0, data-parallel rank 0. megatron's rank order is tp-cp-ep-dp-pp
    (pp outermost), so that is the first rank of the last stage."""
    return tp_size * dp_size * (pp_size - 1)


def _worker(rank: int, world: int, port: int, kwargs: dict, inbox, outbox) -> None:
    torch.set_num_threads(int(os.environ.get("TWINKLE_MEGATRON_THREADS", "1")))
    try:
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and kwargs.get("device") != "cpu"
        if cuda:
            torch.cuda.set_device(rank % torch.cuda.device_count())
            kwargs = {**kwargs, "device": f"cuda:{torch.cuda.current_device()}"}
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
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
            model = MultiLoraMegatronModel(**kwargs)
        sync = None
        if dp > 1:
            from megatron.core import parallel_state as ps

            from twinkle.model.megatron._dp_world import replica_sync

            sync = replica_sync(model, ps.get_data_parallel_rank(), dp)
        outbox.put((rank, True, None))
    except BaseException as exc:  # the driver re-raises it
        outbox.put((rank, False, _portable(exc)))
        return
    while True:
        message = inbox.get()
        if message is None:
            break
        name, args, kw = message
        try:
            if name in RANK0_ONLY and rank != answer and not (pp > 1 and name == "save"):
                result = None
            elif name == DP_FORWARD_BACKWARD:  # this replica's rows, gradients synchronised
                result = sync.forward_backward_many(*args, **kw)
            else:
                result = getattr(model, name)(*args, **kw)
                if callable(result) or name == "routes":
                    raise TypeError(f"{name} returns a context or callable; not remotable")
            if sync is not None:
                sync._wrap_losses()  # a new tenant's loss records its shard statistics
            outbox.put((rank, True, result if rank in answers else None))
        except BaseException as exc:
            outbox.put((rank, False, _portable(exc)))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError carrying its text and traceback."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")


def _remotable() -> frozenset[str]:
    """The model methods a driver forwards: the public ones, less those that hand back live
    objects (a routing context, an adapter pager: paging is per process and not offered here)."""
    return frozenset(
        name
        for name in dir(MultiLoraMegatronModel)
        if not name.startswith("_")
        and callable(getattr(MultiLoraMegatronModel, name))
        and name not in ("routes", "enable_paging", "tenant")
    )


class ParallelMegatronModel:
    """The :class:`MultiLoraMegatronModel` API, each call run on ``tp_size * pp_size`` ranks.

    Args:
        model_id: As ``MultiLoraMegatronModel``.
        tp_size: Tensor-parallel size.
        pp_size: Pipeline-parallel size (stages of ``num_hidden_layers / pp_size`` layers; see
            :mod:`~twinkle.model.megatron._pp`).
        num_microbatches: Microbatches per pipeline pass (default ``pp_size``).
        **kwargs: ``MultiLoraMegatronModel`` arguments (torch_dtype, device, seed, options);
            ``ep_size`` (an MoE model): its experts split over that many ranks.

    Raises:
        ValueError: ``tp_size`` does not divide the model's heads, groups, MLP width or vocab, or
            ``pp_size`` its layers.
        RuntimeError: A worker failed to start (its error is the cause).
    """

    #: What the server offers (``capabilities_of`` reads the class): the in-process model's.
    capabilities = MultiLoraMegatronModel.capabilities

    def __init__(
        self,
        model_id: str,
        tp_size: int = 2,
        pp_size: int = 1,
        num_microbatches: int | None = None,
        dp_size: int = 1,
        **kwargs: Any,
    ) -> None:
        from twinkle.hub import load_config, resolve_model_dir
        from twinkle.model.megatron import _build
        from twinkle.model.megatron._pp import check_pp

        hf_config = load_config(model_id)
        _build.check_supported(hf_config, model_id)
        _build.check_tp(hf_config, model_id, tp_size)
        ep_size = int(kwargs.get("ep_size", 1) or 1)
        _moe.check_moe(hf_config, model_id, tp_size, ep_size)
        check_pp(hf_config, model_id, pp_size)
        if ep_size > 1 and dp_size > 1:
            raise ValueError(
                f"ep_size {ep_size} with dp_size {dp_size} is not built: the expert ranks are "
                "megatron's data-parallel ranks, each fed the whole batch"
            )
        self.tp_size, self.pp_size, self.dp_size = tp_size, pp_size, dp_size
        # ep: megatron carves the expert groups out of its data-parallel ranks (tp 1 here), so
        # ep_size ranks per pipeline stage, each fed the whole batch.
        self.ep_size = ep_size
        replicas = ep_size if ep_size > 1 else dp_size
        self.world = tp_size * pp_size * replicas
        self.answer = answer_rank(tp_size, pp_size, replicas)
        #: The rank whose results stand for each dp replica's rows.
        self.replica_answers = [self.answer + tp_size * d for d in range(dp_size)]
        self._pair_rows: set[str] = set()
        self.model_id, self.model_dir = model_id, resolve_model_dir(model_id)
        self.pager = None
        ctx = mp.get_context("spawn")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        kw = {"model_id": model_id, "tp_size": tp_size, **kwargs}
        if pp_size > 1:
            kw.update(pp_size=pp_size, num_microbatches=num_microbatches)
        kw.update(answer_rank=self.answer, replica_answers=self.replica_answers, dp_size=dp_size)
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(rank, self.world, port, kw, self._inboxes[rank], self._outbox),
                daemon=True,
            )
            for rank in range(self.world)
        ]
        for proc in self._procs:
            proc.start()
        try:
            self._collect("__init__")
        except BaseException:
            self.close()
            raise

    def _collect(self, name: str, ranks: list[int] | None = None) -> Any:
        """Every rank's answer to ``name``; raises at once when a rank has died (its peers would
        wait on it in their next collective forever). The answering rank's error comes first (an
        earlier pipeline stage's is only the consequence)."""
        import queue
        import time

        results: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while len(results) < self.world:
            try:
                rank, ok, value = self._outbox.get(timeout=1.0)
            except queue.Empty:
                dead = {r: p.exitcode for r, p in enumerate(self._procs) if not p.is_alive()}
                if dead or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(
                        f"megatron ranks did not answer {name}: "
                        + (f"ranks {dead} exited (rank: exit code)" if dead else "timed out")
                        + "; the workers are closed, rebuild the model"
                    ) from None
                continue
            results[rank] = (ok, value)
        for rank in [self.answer, *sorted(results)]:
            ok, value = results[rank]
            if not ok:
                raise value
        if ranks is not None:
            return [results[rank][1] for rank in ranks]
        return results[self.answer][1]

    def forward_backward_many(self, requests: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """As the model's; under dp each replica runs its rows (then one gradient all-reduce)."""
        if self.dp_size == 1:
            return self.call("forward_backward_many", requests)
        from twinkle.errors import InvalidArgumentError
        from twinkle.model.megatron import _dp_world

        if not requests:
            raise InvalidArgumentError("forward_backward_many needs at least one request")
        for name, request in requests.items():
            if "inputs" not in request:
                raise InvalidArgumentError(f"request for adapter {name!r} has no 'inputs'")
        order, shards = _dp_world.split_requests(requests, self.dp_size, self._pair_rows)
        if not self._procs:
            raise RuntimeError("the megatron workers are closed")
        for rank, inbox in enumerate(self._inboxes):
            replica = (rank // self.tp_size) % self.dp_size  # megatron's order tp-cp-ep-dp-pp
            inbox.put((DP_FORWARD_BACKWARD, (shards[replica], order), {}))
        return _dp_world.join(order, self._collect(DP_FORWARD_BACKWARD, self.replica_answers))

    def forward_backward(self, inputs: Any, adapter_name: str | None = None, **kwargs: Any):
        if self.dp_size == 1:
            return self.call("forward_backward", inputs, adapter_name=adapter_name, **kwargs)
        if adapter_name is None:
            names = self.call("list_adapters")
            adapter_name = names[0] if len(names) == 1 else None
            if adapter_name is None:
                from twinkle.errors import InvalidArgumentError

                raise InvalidArgumentError(f"several adapters exist ({names}): pass adapter_name=")
        return self.forward_backward_many({adapter_name: {"inputs": inputs, **kwargs}})[
            adapter_name
        ]

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        # DPO's rows come in (chosen, rejected) pairs: the dp split keeps each pair together.
        name = getattr(loss, "name", None) or getattr(loss, "__name__", loss)
        (self._pair_rows.add if name == "DPOLoss" else self._pair_rows.discard)(adapter_name)
        return self.call("set_loss", loss, adapter_name=adapter_name, **kwargs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``model.<name>(*args, **kwargs)`` on every rank; rank 0's result."""
        if not self._procs:
            raise RuntimeError("the megatron workers are closed")
        for inbox in self._inboxes:
            inbox.put((name, args, kwargs))
        return self._collect(name)

    def __getattr__(self, name: str) -> Any:
        if name not in _remotable():
            raise AttributeError(f"{type(self).__name__} has no method {name!r} across ranks")
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def close(self) -> None:
        """Stop the workers (each leaves its process group)."""
        procs, self._procs = self.__dict__.get("_procs", []), []
        for inbox, proc in zip(self._inboxes, procs):
            if proc.is_alive():
                inbox.put(None)
        for proc in procs:
            # A rank blocked in a collective with a dead peer never reads its inbox: kill it.
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()

    def __enter__(self) -> ParallelMegatronModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
