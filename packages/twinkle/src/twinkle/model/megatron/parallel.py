"""``ParallelMegatronModel``: one multi-LoRA megatron model over ``tp_size * pp_size`` worker
ranks (times ``dp_size`` or ``ep_size``).

Each rank (:mod:`~twinkle.model.megatron._ranks`) joins one gloo (CPU) or nccl (CUDA) process
group, calls megatron-core's ``parallel_state.initialize_model_parallel(tp_size, pp_size)`` and
builds a :class:`~twinkle.model.megatron.MultiLoraMegatronModel` holding its tensor-parallel
shards of the HF weights (under pp > 1 a
:class:`~twinkle.model.megatron._pp_model.PipelineMegatronModel` of its stage's layers). The ranks
are spawned processes on this host (``launcher="process"``) or Ray actors placed over the cluster
(``launcher="ray"``, :mod:`~twinkle.model.megatron._ray_ranks`); by default Ray when Ray is
initialised here. The driver sends every method call to all ranks at once, in the same order
(collectives and pipeline sends pair up across ranks), and answers the last stage's first rank
(:func:`answer_rank`). Adapters are replicated over tp (see
:mod:`~twinkle.model.megatron._tp_lora`), so at pp 1 ``save`` runs on that rank only; under pp
every rank takes part and one writes: one standard PEFT checkpoint, written once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from twinkle.model.megatron import _moe
from twinkle.model.megatron._ranks import (
    CALL_TIMEOUT_S,
    DP_FORWARD_BACKWARD,
    RANK0_ONLY,
    ProcessRanks,
    choose_launcher,
)
from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel

__all__ = ["CALL_TIMEOUT_S", "RANK0_ONLY", "ParallelMegatronModel", "answer_rank"]


def answer_rank(tp_size: int, pp_size: int, dp_size: int = 1) -> int:
    """The rank whose results the driver answers: the last pipeline stage (its logits and
    losses), tensor rank 0, data-parallel rank 0. megatron's rank order is tp-cp-ep-dp-pp
    (pp outermost), so that is the first rank of the last stage."""
    return tp_size * dp_size * (pp_size - 1)


def _remotable() -> frozenset[str]:
    """The model methods a driver forwards: the public ones, less those that hand back live
    objects (a routing context, an adapter pager: paging is per process and not offered here)."""
    return frozenset(
        name
        for name in dir(MultiLoraMegatronModel)
        if not name.startswith("_")
        and callable(getattr(MultiLoraMegatronModel, name))
        and name not in ("routes", "enable_paging", "tenant", "expert_parameters")
    )


def one_pass(options: Any) -> Any:
    """``options`` with every fused training call run as one pass (``max_pass_tokens`` 0, no
    row chunks): under expert parallel each rank's pass count must match its peers' (their MoE
    all-to-alls pair up), and a token budget would cut ranks' unequal shares differently."""
    from twinkle.model.options import resolve_options

    return dataclasses.replace(resolve_options(options), max_pass_tokens=0, split_batches=False)


class ParallelMegatronModel:
    """The :class:`MultiLoraMegatronModel` API, each call run on ``tp_size * pp_size`` ranks.

    Args:
        model_id: As ``MultiLoraMegatronModel``.
        tp_size: Tensor-parallel size.
        pp_size: Pipeline-parallel size (stages of ``num_hidden_layers / pp_size`` layers; see
            :mod:`~twinkle.model.megatron._pp`).
        num_microbatches: Microbatches per pipeline pass (default ``pp_size``).
        launcher: ``"process"`` (spawned processes on this host), ``"ray"`` (one Ray actor per
            rank, placed over the cluster) or ``None``: Ray when Ray is initialised here.
        ray_options: Placement of the Ray ranks (:class:`~._ray_ranks.RayRanks`): ``num_cpus``,
            ``num_gpus``, ``resources``, ``nproc_per_node``.
        **kwargs: ``MultiLoraMegatronModel`` arguments (torch_dtype, device, seed, options);
            ``ep_size`` (an MoE model): its experts split over that many ranks, which are the
            data-parallel ranks (``dp_size`` 1 or equal): each runs its share of the rows.

    Raises:
        ValueError: ``tp_size`` does not divide the model's heads, groups, MLP width or vocab, or
            ``pp_size`` its layers; ``ep_size`` with another ``dp_size``; an unknown
            ``launcher``.
        RuntimeError: A worker failed to start (its error is the cause).
    """

    #: What the server offers (``capabilities_of`` reads the class): the in-process model's,
    #: less ``tenant``: the tenants live in the rank processes.
    capabilities = dataclasses.replace(MultiLoraMegatronModel.capabilities, local_tenants=False)

    def __init__(
        self,
        model_id: str,
        tp_size: int = 2,
        pp_size: int = 1,
        num_microbatches: int | None = None,
        dp_size: int = 1,
        launcher: str | None = None,
        ray_options: dict[str, Any] | None = None,
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
        if ep_size > 1 and dp_size not in (1, ep_size):
            raise ValueError(
                f"ep_size {ep_size} with dp_size {dp_size} is not built: the expert ranks are "
                f"megatron's data-parallel ranks, so dp_size must equal ep_size ({ep_size}) or "
                "be left 1 (each rank runs its share of the rows)"
            )
        self.launcher = choose_launcher(launcher)
        # ep: megatron carves the expert groups out of its data-parallel ranks (tp = pp = 1
        # here): ep_size ranks, which are the dp ranks, each running its share of the rows.
        self.ep_size = ep_size
        if ep_size > 1:
            dp_size = ep_size
            kwargs["options"] = one_pass(kwargs.get("options"))
        self.tp_size, self.pp_size, self.dp_size = tp_size, pp_size, dp_size
        self.world = tp_size * pp_size * dp_size
        self.answer = answer_rank(tp_size, pp_size, dp_size)
        #: The rank whose results stand for each dp replica's rows.
        self.replica_answers = [self.answer + tp_size * d for d in range(dp_size)]
        self._pair_rows: set[str] = set()
        self._expert_tenants: set[str] = set()  # tenants with LoRA on MoE experts
        self.model_id, self.model_dir = model_id, resolve_model_dir(model_id)
        self.pager = None
        kw = {"model_id": model_id, "tp_size": tp_size, **kwargs}
        if pp_size > 1:
            kw.update(pp_size=pp_size, num_microbatches=num_microbatches)
        kw.update(answer_rank=self.answer, replica_answers=self.replica_answers, dp_size=dp_size)
        if self.launcher == "ray":
            import torch

            from twinkle.model.megatron._ray_ranks import RayRanks

            cuda = kwargs.get("device") != "cpu" and (
                torch.cuda.is_available() or str(kwargs.get("device", "")).startswith("cuda")
            )
            self._ranks = RayRanks(self.world, cuda=cuda, **(ray_options or {}))
        else:
            self._ranks = ProcessRanks(self.world)
        try:
            self._check("__init__", self._ranks.start(kw))
        except BaseException:
            self.close()
            raise

    def _check(self, name: str, results: dict[int, tuple[bool, Any]], ranks=None) -> Any:
        """The answer among every rank's ``(ok, value)``: the answering rank's error is raised
        first (an earlier pipeline stage's is only the consequence), then any other rank's; a
        rank's own error before its peers' ``PeerFailedError`` (theirs only follows from it)."""
        from twinkle.parallel._worker import PeerFailedError

        errors = [results[r][1] for r in [self.answer, *sorted(results)] if not results[r][0]]
        if errors:
            raise next((e for e in errors if not isinstance(e, PeerFailedError)), errors[0])
        if ranks is not None:
            return [results[rank][1] for rank in ranks]
        return results[self.answer][1]

    def _run(self, name: str, messages: list[tuple], ranks: list[int] | None = None) -> Any:
        """Send each rank its message at once; raises at once when a rank has died (its peers
        would wait on it in their next collective forever)."""
        if self.closed:
            raise RuntimeError("the megatron workers are closed")
        return self._check(name, self._ranks.run(name, messages), ranks)

    @property
    def closed(self) -> bool:
        ranks = self.__dict__.get("_ranks")
        return ranks is None or ranks.closed

    def placements(self) -> list[dict[str, Any]]:
        """Each Ray rank's pid, node, resources and ``CUDA_VISIBLE_DEVICES`` (``[]`` for processes:
        they share the driver's host)."""
        return self._ranks.placements() if self._ranks.kind == "ray" else []

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
        if self.ep_size > 1 and (
            _dp_world.empty_share(shards) or _dp_world.odd_pairs(requests, self._pair_rows)
        ):
            # A rank without rows cannot take part in the MoE all-to-alls, and an odd DPO batch
            # would fail on one rank only, after its forward: every rank runs the whole batch
            # (the same losses, gradients or error on each, so no all-reduce is needed) ...
            if not self._expert_tenants & set(requests):
                return self.call("forward_backward_many", requests)
            # ... except for expert adapters: each rank's experts got every rank's copy of the
            # tokens, and the other experts' gradients are on the other ranks. The ranks then
            # synchronise as for split rows, each holding the whole batch (scale 1/ep each).
            messages = [
                (DP_FORWARD_BACKWARD, ({n: requests[n] for n in order}, order), {})
            ] * self.world
            return _dp_world.join(order, [self._run(DP_FORWARD_BACKWARD, messages)])
        messages = [
            # megatron's order tp-cp-ep-dp-pp: rank r is in replica (r // tp) % dp
            (DP_FORWARD_BACKWARD, (shards[(rank // self.tp_size) % self.dp_size], order), {})
            for rank in range(self.world)
        ]
        return _dp_world.join(order, self._run(DP_FORWARD_BACKWARD, messages, self.replica_answers))

    def computed_rows(self) -> list[tuple[int, int]]:
        """Each rank's ``(rows, padded tokens)`` its base model has run forward so far."""
        return self._run(
            "computed_rows", [("computed_rows", (), {})] * self.world, list(range(self.world))
        )

    def optimizer_state_numel(self, adapter_name: str | None = None) -> list[int]:
        """Each rank's elements of the tenant's Adam moments (sharded over each tp group)."""
        message = ("optimizer_state_numel", (), {"adapter_name": adapter_name})
        return self._run("optimizer_state_numel", [message] * self.world, list(range(self.world)))

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

    def add_adapter_to_model(self, adapter_name: str, config: Any = None, *args, **kwargs) -> None:
        """As the model's, on every rank; remembers the tenants with expert adapters."""
        self.call("add_adapter_to_model", adapter_name, config, *args, **kwargs)
        from twinkle.model.lora import adapter_spec_from_config

        if adapter_spec_from_config(adapter_name, config).target_parameters:
            self._expert_tenants.add(adapter_name)

    def remove_adapter(self, adapter_name: str | None = None) -> None:
        self.call("remove_adapter", adapter_name)
        self._expert_tenants.discard(adapter_name)

    def set_loss(self, loss: Any, adapter_name: str | None = None, **kwargs: Any) -> None:
        # DPO's rows come in (chosen, rejected) pairs: the dp split keeps each pair together.
        name = getattr(loss, "name", None) or getattr(loss, "__name__", loss)
        (self._pair_rows.add if name == "DPOLoss" else self._pair_rows.discard)(adapter_name)
        return self.call("set_loss", loss, adapter_name=adapter_name, **kwargs)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``model.<name>(*args, **kwargs)`` on every rank; the answering rank's result."""
        return self._run(name, [(name, args, kwargs)] * self.world)

    def __getattr__(self, name: str) -> Any:
        if name not in _remotable():
            raise AttributeError(f"{type(self).__name__} has no method {name!r} across ranks")
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def close(self) -> None:
        """Stop the workers: each process leaves its process group; Ray actors are killed and
        their placement group removed."""
        ranks = self.__dict__.get("_ranks")
        if ranks is not None:
            ranks.close()

    def __enter__(self) -> ParallelMegatronModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
