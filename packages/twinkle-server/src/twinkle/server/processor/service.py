"""The processor's logic, free of web and Ray code: per-tenant dataset handles and their operations.

Only data and names arrive: rows, a ``DatasetMeta``, registered template and preprocessor names
with JSON arguments. No code is received; local files are read only under allowed directories.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from twinkle.server.env import TWINKLE_PROCESSOR_DATA_DIRS
from twinkle.server.web.encoding import jsonable
from twinkle.server.web.errors import BadRequest, Forbidden, NotFound, from_exception

ALLOWED_DIRS_ENV = TWINKLE_PROCESSOR_DATA_DIRS.name
_HUB_SCHEMES = ("builtin://", "ms://", "hf://")
_META_KEYS = ("dataset_id", "subset_name", "split", "data_slice", "data")
_SET_TEMPLATE_KEYS = ("template", "model_id", "max_length", "truncation_strategy")


class ProcessorService:
    """Remote datasets for every tenant; a handle is only ever visible to the key that made it.

    Args:
        max_num_proc: Most worker processes one ``map``/``encode`` may use.
        max_datasets_per_tenant: Handles kept per tenant; the oldest is dropped beyond this.
        max_rows_per_request: Most rows one ``rows`` request may fetch.
        allowed_dirs: Local directories datasets may be read from (default: ``$TWINKLE_PROCESSOR_DATA_DIRS``,
            ``os.pathsep``-separated; none when unset).
    """

    def __init__(
        self,
        max_num_proc: int = 1,
        max_datasets_per_tenant: int = 16,
        max_rows_per_request: int = 4096,
        allowed_dirs: list[str | Path] | None = None,
    ) -> None:
        self.max_num_proc = max_num_proc
        self.max_datasets_per_tenant = max_datasets_per_tenant
        self.max_rows_per_request = max_rows_per_request
        if allowed_dirs is None:
            allowed_dirs = [d for d in TWINKLE_PROCESSOR_DATA_DIRS.get().split(os.pathsep) if d]
        self.allowed_dirs = [Path(d).expanduser().resolve() for d in allowed_dirs]
        self._datasets: dict[str, OrderedDict[str, Any]] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=max(2, max_num_proc), thread_name_prefix="twinkle-processor"
        )
        self.ops = {
            "create_dataset": self.create_dataset,
            "set_template": self.set_template,
            "map": self.map,
            "filter": self.filter,
            "encode": self.encode,
            "len": self.length,
            "rows": self.rows,
            "delete_dataset": self.delete_dataset,
        }

    async def call(self, owner: str, op: str, payload: dict[str, Any]) -> Any:
        """Run ``op`` for tenant ``owner`` off the event loop; raises ``ServiceError``."""
        handler = self.ops.get(op)
        if handler is None:
            raise NotFound(
                f"unknown processor operation {op!r}; known: {', '.join(sorted(self.ops))}"
            )
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, handler, owner, dict(payload))
        except Exception as exc:
            raise from_exception(exc) from exc

    # ------------------------------------------------------------------ handles
    def _dataset(self, owner: str, payload: dict[str, Any]) -> Any:
        handle = payload.pop("dataset", None)
        with self._lock:
            dataset = self._datasets.get(owner, {}).get(handle) if isinstance(handle, str) else None
        if dataset is None:
            raise NotFound(
                f"unknown dataset {handle!r} for this API key (datasets are per key and "
                f"the oldest beyond {self.max_datasets_per_tenant} are dropped)"
            )
        return dataset

    @staticmethod
    def _summary(handle: str | None, dataset: Any) -> dict[str, Any]:
        reply = {
            "num_rows": len(dataset),
            "columns": dataset.column_names,
            "encoded": dataset._encoded,
        }
        if handle is not None:
            reply["dataset"] = handle
        return reply

    def create_dataset(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        from twinkle.dataset import Dataset

        meta = self._meta(payload.get("dataset_meta"))
        dataset = Dataset(meta)
        handle = uuid.uuid4().hex
        with self._lock:
            mine = self._datasets.setdefault(owner, OrderedDict())
            mine[handle] = dataset
            while len(mine) > self.max_datasets_per_tenant:
                mine.popitem(last=False)
        return self._summary(handle, dataset)

    def delete_dataset(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._dataset(owner, dict(payload))
        with self._lock:
            self._datasets[owner].pop(payload["dataset"], None)
        return {"deleted": payload["dataset"]}

    def _meta(self, wire: Any):
        from twinkle.dataset import DatasetMeta

        if not isinstance(wire, dict):
            raise BadRequest("dataset_meta must be an object with dataset_id or data")
        unknown = sorted(set(wire) - set(_META_KEYS))
        if unknown:
            raise BadRequest(f"unknown dataset_meta field(s) {unknown}; known: {list(_META_KEYS)}")
        values = {k: wire.get(k) for k in _META_KEYS if wire.get(k) is not None}
        if "dataset_id" not in values and "data" not in values:
            raise BadRequest("dataset_meta needs dataset_id or data")
        values["data_slice"] = _selection(wire.get("data_slice"))
        if "dataset_id" in values:
            self._check_source(str(values["dataset_id"]))
        return DatasetMeta(**values)

    def _check_source(self, dataset_id: str) -> None:
        if dataset_id.startswith(_HUB_SCHEMES):
            return
        if "://" in dataset_id:
            raise BadRequest(
                f"unsupported dataset scheme in {dataset_id!r}; use builtin://, ms:// or hf://"
            )
        if "\x00" in dataset_id or not dataset_id.isprintable():
            raise BadRequest(f"dataset_id {dataset_id!r} is not a printable path or hub id")
        path = Path(dataset_id).expanduser().resolve()
        if not any(path == d or d in path.parents for d in self.allowed_dirs):
            raise Forbidden(
                f"the server does not read local path {dataset_id!r}: send the rows with "
                f"DatasetMeta(data=[...]), or ask the operator to allow its directory ({ALLOWED_DIRS_ENV})"
            )

    # ------------------------------------------------------------------ operations
    def set_template(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        dataset = self._dataset(owner, payload)
        template = payload.pop("template", None)
        if not isinstance(template, str):
            raise BadRequest("template must be given by name over HTTP, e.g. 'Qwen3_5Template'")
        dataset.set_template(template, **payload)
        return self._summary(None, dataset)

    def map(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        dataset = self._dataset(owner, payload)
        name = payload.get("preprocessor")
        if not isinstance(name, str):
            raise BadRequest(
                "preprocessor must be a registered name over HTTP, e.g. 'SelfCognitionProcessor'"
            )
        init_args = payload.get("init_args") or {}
        if not isinstance(init_args, dict):
            raise BadRequest("init_args must be an object")
        dataset.map(
            name,
            init_args=init_args,
            load_from_cache_file=bool(payload.get("load_from_cache_file", True)),
            num_proc=self._num_proc(payload),
        )
        return self._summary(None, dataset)

    def filter(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        self._dataset(owner, payload)  # another key's handle is unknown (404), as everywhere
        raise BadRequest(
            "filter takes a Python function, and the processor runs no client code: filter rows "
            "before sending them, or use truncation_strategy='delete' for over-long samples"
        )

    def encode(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        dataset = self._dataset(owner, payload)
        dataset.encode(
            batched=bool(payload.get("batched", True)),
            num_proc=self._num_proc(payload),
            load_from_cache_file=bool(payload.get("load_from_cache_file", True)),
            add_generation_prompt=bool(payload.get("add_generation_prompt", False)),
        )
        return self._summary(None, dataset)

    def length(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._summary(None, self._dataset(owner, payload))

    def rows(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        dataset = self._dataset(owner, payload)
        indices = payload.get("indices")
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in indices
        ):
            raise BadRequest("indices must be a list of integers")
        if len(indices) > self.max_rows_per_request:
            raise BadRequest(
                f"at most {self.max_rows_per_request} rows per request, got {len(indices)}"
            )
        bad = [i for i in indices if not 0 <= i < len(dataset)]
        if bad:
            raise BadRequest(f"row indices {bad[:5]} out of range for {len(dataset)} rows")
        rows = dataset.__getitems__(indices) if indices else []
        return {"rows": [jsonable(dict(row)) for row in rows], "encoded": dataset._encoded}

    def _num_proc(self, payload: dict[str, Any]) -> int | None:
        num_proc = payload.get("num_proc")
        if num_proc is None:
            return None
        if not isinstance(num_proc, int) or num_proc < 1:
            raise BadRequest(f"num_proc must be a positive integer, got {num_proc!r}")
        capped = min(num_proc, self.max_num_proc)
        return capped if capped > 1 else None


def _selection(wire: Any) -> Any:
    if wire is None or isinstance(wire, list):
        return wire
    if isinstance(wire, dict) and len(wire) == 1:
        ((kind, bounds),) = wire.items()
        if kind in ("range", "slice") and isinstance(bounds, list) and len(bounds) == 3:
            if kind == "range":
                return range(*(int(b) for b in bounds))
            return slice(*bounds)
    raise BadRequest("data_slice must be a list of ints or {'range'|'slice': [start, stop, step]}")
