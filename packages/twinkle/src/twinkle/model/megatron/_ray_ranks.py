"""The megatron worker ranks as Ray actors (``launcher="ray"``), one per rank.

Each rank reserves one placement-group bundle: ``{"GPU": num_gpus}`` on CUDA (1 by default: Ray
sets the actor's ``CUDA_VISIBLE_DEVICES``, so the rank sees its GPU as device 0) or
``{"CPU": num_cpus}`` on CPU (``DEFAULT_RAY_CPUS``), plus any custom ``resources``. Without
``nproc_per_node`` the bundles form one ``PACK`` group (on one node when it fits, spilled over
others when not); with it, ``nproc_per_node`` ranks go on each node (one ``STRICT_PACK`` group per
node, :class:`twinkle.parallel.placement.NodePacking`, as the data-parallel ranks are placed).
Rank 0's actor names the rendezvous: its node's IP (``ray.util.get_node_ip_address()``) and a
port free there; every rank then builds at once (:func:`~._ranks.build_rank`).
"""

from __future__ import annotations

import socket
from typing import Any

from twinkle.env import with_prefix
from twinkle.model.megatron._ranks import (
    CALL_TIMEOUT_S,
    DEFAULT_RAY_CPUS,
    FailureWatch,
    build_rank,
    lost,
    portable,
    run_call,
)


class RankActor:
    """One rank in a Ray actor: the same :func:`build_rank` / :func:`run_call` as a process."""

    def __init__(self, rank: int) -> None:
        self.rank, self.state = rank, None

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free on it (rank 0 hosts the process group)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((ip, 0))
            return ip, sock.getsockname()[1]

    def build(self, world: int, host: str, port: int, kwargs: dict) -> tuple[bool, Any]:
        try:
            self.state = build_rank(self.rank, world, host, port, kwargs)
            return True, None
        except BaseException as exc:
            return False, portable(exc)

    def call(self, name: str, args: tuple, kw: dict) -> tuple[bool, Any]:
        return run_call(self.state, name, args, kw)

    def where(self) -> dict[str, Any]:
        """pid, node, assigned resources and ``CUDA_VISIBLE_DEVICES`` of this rank."""
        import ray

        from twinkle.parallel.placement import placement_report

        return {**placement_report(), "node_ip": ray.util.get_node_ip_address(), "rank": self.rank}


class RayRanks:
    """``world`` :class:`RankActor` s placed as the module says.

    Args:
        world: Number of ranks.
        cuda: Ranks compute on CUDA: ``num_gpus`` defaults to 1 (else 0).
        num_cpus: Logical CPUs per rank (default 0 for a rank holding a GPU, else
            ``DEFAULT_RAY_CPUS``).
        num_gpus: GPUs per rank (a rank computes on CUDA when its GPU is visible to torch and
            ``device`` is not ``cpu``; logical GPUs on a CPU host fall back to the CPU).
        resources: Custom Ray resources each rank reserves.
        nproc_per_node: Ranks per node; ``None``: one ``PACK`` group.
        timeout_s: How long the placement may take.
    """

    kind = "ray"

    def __init__(
        self,
        world: int,
        cuda: bool = False,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        resources: dict[str, float] | None = None,
        nproc_per_node: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        import ray
        from ray.util import placement_group

        from twinkle.parallel.placement import NodePacking, rank_bundle

        if not ray.is_initialized():
            raise RuntimeError("launcher 'ray' needs Ray: call ray.init() first")
        self.world, self.actors = world, []
        num_gpus = num_gpus if num_gpus is not None else (1.0 if cuda else 0.0)
        # A GPU rank reserves no CPU by default: the GPU is what it holds; its host thread idles.
        num_cpus = num_cpus if num_cpus is not None else (0.0 if num_gpus else DEFAULT_RAY_CPUS)
        self.bundle = rank_bundle(num_cpus, num_gpus, resources)
        self._options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0}
        if num_gpus:
            self._options["num_gpus"] = num_gpus
        if resources:
            self._options["resources"] = dict(resources)
        self._packing = self._group = None
        if not self.bundle:
            pass  # nothing to reserve (num_cpus 0 on CPU): Ray places the actors freely
        elif nproc_per_node:
            self._packing = NodePacking(world, nproc_per_node, self.bundle, timeout_s)
        else:
            self._group = placement_group([dict(self.bundle)] * world, strategy="PACK")
            if not ray.wait([self._group.ready()], timeout=timeout_s)[0]:
                self.close()
                raise TimeoutError(
                    f"cannot place {world} megatron ranks of {self.bundle} each within "
                    f"{timeout_s:g} s; the cluster has {ray.available_resources()} available"
                )

    @property
    def closed(self) -> bool:
        return not self.actors

    def _actor_options(self, rank: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = dict(self._options)
        if self._packing is not None:
            options.update(self._packing.options(rank))
        elif self._group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._group, placement_group_bundle_index=rank
            )
        return options

    def start(self, kwargs: dict) -> dict[int, tuple[bool, Any]]:
        import ray

        # The driver's TWINKLE_MEGATRON_* settings (threads) reach ranks on other nodes too.
        env = with_prefix("TWINKLE_MEGATRON_")
        remote = ray.remote(RankActor)
        self.actors = [
            remote.options(
                **self._actor_options(r), **({"runtime_env": {"env_vars": env}} if env else {})
            ).remote(r)
            for r in range(self.world)
        ]
        host, port = self._gather("__init__", {0: self.actors[0].address.remote()})[0]
        refs = {
            r: a.build.remote(self.world, host, port, kwargs) for r, a in enumerate(self.actors)
        }
        return self._gather("__init__", refs)

    def run(self, name: str, messages: list[tuple]) -> dict[int, tuple[bool, Any]]:
        refs = {r: a.call.remote(*m) for r, (a, m) in enumerate(zip(self.actors, messages))}
        return self._gather(name, refs)

    def placements(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([a.where.remote() for a in self.actors], timeout=CALL_TIMEOUT_S)

    def _gather(self, name: str, refs: dict[int, Any]) -> dict[int, tuple[bool, Any]]:
        """Each rank's ``(ok, value)``; a dead actor closes the rest and raises at once."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        pending = {ref: rank for rank, ref in refs.items()}
        results: dict[int, tuple[bool, Any]] = {}
        dead: dict[int, str] = {}
        watch = FailureWatch()
        while pending:
            # After a death, a short look for other dead ranks: the survivors are stuck in a
            # collective with the dead one and will not answer.
            left = 1.0 if dead else watch.left()
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, left))
            if not ready:
                break
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as exc:
                    dead[rank] = type(exc).__name__
                except RayTaskError as exc:  # e.g. a result that does not serialise
                    results[rank] = (False, portable(exc.as_instanceof_cause()))
                except GetTimeoutError:
                    pending[ref] = rank
                if rank in results:
                    watch.saw(rank, *results[rank])
        if dead or pending:
            self.close()
            if dead:
                raise lost(name, f"ranks {dead} died (rank: Ray error)")
            raise watch.stuck(name, sorted(pending.values()))
        return results

    def close(self) -> None:
        """Kill the actors (the process group dies with them) and release the reservations."""
        import ray

        actors, self.actors = self.actors, []
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead, or Ray is gone
                pass
        if self._packing is not None:
            self._packing.remove()
        if self._group is not None:
            try:
                ray.util.remove_placement_group(self._group)
            except Exception:
                pass
            self._group = None
