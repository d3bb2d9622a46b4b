"""Adapter paging: ``max_resident`` adapters on the device as a cache, not a wall.

A model with a pager holds at most ``max_resident`` tenants' tensors on its device. When another
tenant needs a slot, the least recently used IDLE tenant is paged out: its weights and optimizer
state (Adam moments and step counts) are copied to host memory, or written to the storage
directory (mode ``storage``, or when host memory is bounded and full), and its device buffers
are freed. Its next call pages it back. Everything else a tenant owns (step and accumulation
counters, loss, template, scheduler, metrics) is plain Python state on its ``Tenant`` and never
leaves the process, so a tenant paged out and back continues bit-exactly as one never paged:
copies are exact, and the optimizer reads the same moments and counts.

A tenant is never paged out while busy: gradients pending (mid-accumulation), a forward waiting
for its loss, pinned by the current call (several tenants fused into one pass), or reported
busy by the caller's ``busy`` hook (the server: a call of it is queued). When no resident tenant
is idle, or storage is full, :class:`AdapterCapacityError` says so (the server answers 503
``paused_capacity`` and the client retries).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from twinkle.errors import AdapterCapacityError, InvalidArgumentError
from twinkle.model.flat import FlatAdapter
from twinkle.model.tenant import Tenant

PagingMode = Literal["host", "storage"]


@dataclass
class PagingStats:
    """Counters since the pager was made (seconds are wall time of the copies)."""

    page_outs: int = 0
    page_ins: int = 0
    page_out_s: float = 0.0
    page_in_s: float = 0.0
    to_storage: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class _Paged:
    """A paged-out tenant's tensors: in ``blob`` (host) or in the file ``path`` (storage)."""

    blob: dict[str, Any] | None = None
    path: Path | None = None
    nbytes: int = 0
    devices: dict[str, Any] = field(default_factory=dict)


class AdapterPager:
    """Keeps at most ``max_resident`` tenants on the device; pages the rest out (see module doc).

    Args:
        max_resident: Tenants whose tensors stay on the device.
        mode: ``host`` (paged to host memory; to storage only past ``max_host_bytes``) or
            ``storage`` (always written to ``storage_dir``).
        storage_dir: Directory for paged adapters (required by ``storage``).
        max_host_bytes: Bound on host memory held by paged adapters (None: unbounded).
        max_paged: Most tenants paged out at once (None: unbounded); past it, capacity error.
        busy: ``busy(name)`` is True when the caller knows more work for ``name`` is coming.
    """

    def __init__(
        self,
        max_resident: int,
        mode: PagingMode = "host",
        storage_dir: str | os.PathLike | None = None,
        max_host_bytes: int | None = None,
        max_paged: int | None = None,
        busy: Callable[[str], bool] | None = None,
    ) -> None:
        if not isinstance(max_resident, int) or max_resident < 1:
            raise InvalidArgumentError(
                f"max_resident must be an integer >= 1, got {max_resident!r}"
            )
        if mode not in ("host", "storage"):
            raise InvalidArgumentError(f"paging mode must be 'host' or 'storage', got {mode!r}")
        if mode == "storage" and storage_dir is None:
            raise InvalidArgumentError("paging mode 'storage' needs a storage_dir")
        self.max_resident, self.mode = max_resident, mode
        self.storage_dir = Path(storage_dir) if storage_dir is not None else None
        self.max_host_bytes, self.max_paged = max_host_bytes, max_paged
        self.busy = busy or (lambda name: False)
        self.resident: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.paged: dict[str, _Paged] = {}
        self.host_bytes = 0
        self.stats = PagingStats()
        self._pins: set[str] = set()

    # --------------------------------------------------------------------------- bookkeeping
    def is_busy(self, tenant: Tenant) -> bool:
        return (
            tenant.name in self._pins
            or tenant.pending_grads
            or tenant.last_forward is not None
            or tenant.micro_step % tenant.gradient_accumulation_steps != 0
            or self.busy(tenant.name)
        )

    @contextlib.contextmanager
    def pinning(self, names: Iterable[str]) -> Iterator[None]:
        """Within the block, ``names`` are not paged out (one call's tenants page in together)."""
        names = [n for n in names if n not in self._pins]
        if len(set(names) | self._pins) > self.max_resident:
            raise AdapterCapacityError(
                f"{len(set(names) | self._pins)} adapters in one call, more than the "
                f"{self.max_resident} that fit on the device at once"
            )
        self._pins.update(names)
        try:
            yield
        finally:
            self._pins.difference_update(names)

    def make_room(self, tenants: dict[str, Tenant], for_name: str) -> None:
        """Page out idle tenants until one slot is free for ``for_name``."""
        while len(self.resident) >= self.max_resident:
            victim = next(
                (n for n in self.resident if n != for_name and not self.is_busy(tenants[n])), None
            )
            if victim is None:
                raise AdapterCapacityError(
                    f"all {len(self.resident)} resident adapters are busy; retry later"
                )
            self.page_out(tenants[victim])

    def added(self, tenants: dict[str, Tenant], name: str) -> None:
        """Before a new tenant's tensors are made: free a slot for it."""
        if self.max_paged is not None and len(self.resident) >= self.max_resident:
            if len(self.paged) >= self.max_paged:
                raise AdapterCapacityError(
                    f"{len(self.paged)} adapters are paged out already (max_paged={self.max_paged})"
                )
        self.make_room(tenants, name)
        self.resident[name] = None

    def removed(self, name: str) -> None:
        self.resident.pop(name, None)
        paged = self.paged.pop(name, None)
        if paged is not None:
            self.host_bytes -= paged.nbytes if paged.blob is not None else 0
            if paged.path is not None:
                paged.path.unlink(missing_ok=True)

    def ensure(self, tenants: dict[str, Tenant], tenant: Tenant) -> None:
        """Make ``tenant`` resident (paging it in, and an idle one out, when needed); it becomes
        the most recently used."""
        if tenant.name in self.resident:
            self.resident.move_to_end(tenant.name)
            return
        self.make_room(tenants, tenant.name)
        self.page_in(tenant)
        self.resident[tenant.name] = None

    # --------------------------------------------------------------------------------- copies
    def page_out(self, tenant: Tenant) -> None:
        """Move the idle ``tenant``'s weights and optimizer state off the device."""
        started = time.perf_counter()
        params, optimizer = tenant.params, tenant.optimizer
        blob: dict[str, Any] = {"data": [p.detach().to("cpu", copy=True) for p in params]}
        devices: dict[str, Any] = {"data": params[0].device if params else None}
        if optimizer is not None:
            states = [optimizer.state.get(p, {}) for p in params]
            blob["state"] = [{k: _to_host(v) for k, v in s.items()} for s in states]
            devices["state"] = [{k: _device(v) for k, v in s.items()} for s in states]
        nbytes = _nbytes(blob)
        paged = _Paged(nbytes=nbytes, devices=devices)
        if self.mode == "host" and (
            self.max_host_bytes is None or self.host_bytes + nbytes <= self.max_host_bytes
        ):
            paged.blob = blob
            self.host_bytes += nbytes
        elif self.storage_dir is None:
            raise AdapterCapacityError(
                f"host memory for paged adapters is full (max_host_bytes={self.max_host_bytes}) "
                "and no paging storage is configured"
            )
        else:
            paged.path = self._write(tenant.name, blob)
            self.stats.to_storage += 1
        # Written safely: now free the device copies.
        with torch.no_grad():
            for p in params:
                p.grad = None
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if optimizer is not None:
            for p in params:
                optimizer.state.pop(p, None)
        tenant.flat = None
        self.paged[tenant.name] = paged
        self.resident.pop(tenant.name, None)
        self.stats.page_outs += 1
        self.stats.page_out_s += time.perf_counter() - started

    def page_in(self, tenant: Tenant) -> None:
        """Bring a paged-out ``tenant`` back onto the device, exactly as it left."""
        started = time.perf_counter()
        paged = self.paged[tenant.name]
        blob = paged.blob if paged.blob is not None else torch.load(paged.path, weights_only=True)
        device = paged.devices["data"]
        with torch.no_grad():
            for p, data in zip(tenant.params, blob["data"]):
                p.data = data.to(device, copy=True)
        if tenant.optimizer is not None and "state" in blob:
            for p, state, where in zip(tenant.params, blob["state"], paged.devices["state"]):
                if state:
                    tenant.optimizer.state[p] = {
                        k: v.to(where[k], copy=True) if where[k] is not None else v
                        for k, v in state.items()
                    }
        # A fresh flat layout: weights copied in; Adam state adopted at the next batched step.
        tenant.flat = FlatAdapter.build(tenant.params)
        del self.paged[tenant.name]
        if paged.blob is not None:
            self.host_bytes -= paged.nbytes
        if paged.path is not None:
            paged.path.unlink(missing_ok=True)
        self.stats.page_ins += 1
        self.stats.page_in_s += time.perf_counter() - started

    def _write(self, name: str, blob: dict[str, Any]) -> Path:
        assert self.storage_dir is not None
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        path = self.storage_dir / f"{hashlib.sha256(name.encode()).hexdigest()[:32]}.pt"
        tmp = path.with_suffix(".tmp")
        try:
            torch.save(blob, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise AdapterCapacityError(
                    f"paging storage {self.storage_dir} is full: no room to page an adapter out"
                ) from exc
            raise
        return path

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "max_resident": self.max_resident,
            "resident": len(self.resident),
            "paged": len(self.paged),
            "host_bytes": self.host_bytes,
            **self.stats.as_dict(),
        }


def _to_host(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


def _device(value: Any) -> Any:
    return value.device if isinstance(value, torch.Tensor) else None


def _nbytes(blob: dict[str, Any]) -> int:
    total = sum(t.numel() * t.element_size() for t in blob["data"])
    for state in blob.get("state", ()):
        total += sum(
            v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)
        )
    return total


__all__ = ["AdapterCapacityError", "AdapterPager", "PagingStats"]
