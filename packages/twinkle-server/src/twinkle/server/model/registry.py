"""Where a model deployment records training runs and checkpoints.

The deployment needs a narrow slice of the server state: create runs, count a tenant's active
adapters, register checkpoints and resolve ``twinkle://`` paths back to directories, always within
one tenant. :class:`RunRegistry` is that slice; ``twinkle.server.state`` provides the persistent
implementation, :class:`InMemoryRunRegistry` serves tests and single-process use.
"""

from __future__ import annotations

import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Protocol

from twinkle.server.errors import BadRequest, NotFound

_PATH = re.compile(
    r"^(?:twinkle|tinker)://(?P<run>[A-Za-z0-9_.:\-]+)/(?P<kind>weights|sampler_weights)/(?P<name>[^/]+)$"
)
_NAME = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}$")


def validate_name(name: str) -> str:
    """One plain path component: letters, digits, ``-_.``; no leading dot, no ``..``."""
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise BadRequest(
            f"invalid checkpoint name {name!r}: use letters, digits, '-', '_' and '.' only"
        )
    return name


def parse_path(path: str) -> tuple[str, str, str]:
    """``twinkle://<run>/<weights|sampler_weights>/<name>`` -> (run, kind, name)."""
    match = _PATH.match(path or "")
    if not match:
        raise BadRequest(
            f"not a checkpoint path: {path!r} (expected twinkle://<run>/weights/<name>)"
        )
    return match["run"], match["kind"], validate_name(match["name"])


class RunRegistry(Protocol):
    def create_run(
        self,
        owner: str,
        *,
        adapter_name: str,
        base_model: str,
        lora_rank: int,
        lora_config: dict,
        session_id: str | None,
    ) -> str: ...
    def count_active_runs(self, owner: str) -> int: ...
    def set_run_status(self, owner: str, run_id: str, status: str) -> None: ...
    def checkpoint_dir(self, owner: str, run_id: str, kind: str, name: str) -> Path: ...
    def add_checkpoint(self, owner: str, run_id: str, kind: str, name: str) -> str: ...
    def resolve_checkpoint(self, owner: str, path: str) -> Path: ...


class InMemoryRunRegistry:
    """A process-local :class:`RunRegistry` over a storage root (``<root>/<owner>/<run>/<kind>/<name>``)."""

    def __init__(self, storage_root: str | Path) -> None:
        self.root = Path(storage_root).expanduser().resolve()
        self.runs: dict[str, dict] = {}
        self.checkpoints: dict[tuple[str, str], dict] = {}

    def create_run(self, owner, *, adapter_name, base_model, lora_rank, lora_config, session_id):
        run_id = f"{adapter_name}-{uuid.uuid4().hex[:8]}"
        self.runs[run_id] = {
            "owner": owner,
            "status": "active",
            "base_model": base_model,
            "lora_rank": lora_rank,
            "created_at": time.time(),
        }
        return run_id

    def count_active_runs(self, owner):
        return sum(1 for r in self.runs.values() if r["owner"] == owner and r["status"] == "active")

    def set_run_status(self, owner, run_id, status):
        if self.runs.get(run_id, {}).get("owner") == owner:
            self.runs[run_id]["status"] = status

    def checkpoint_dir(self, owner, run_id, kind, name):
        validate_name(name)
        tenant_root = (self.root / owner).resolve()
        path = (tenant_root / run_id / kind / name).resolve()
        if tenant_root not in path.parents:
            raise BadRequest(f"checkpoint path escapes the tenant's storage: {name!r}")
        return path

    def add_checkpoint(self, owner, run_id, kind, name):
        path = f"twinkle://{run_id}/{kind}/{name}"
        self.checkpoints[(owner, path)] = {
            "dir": str(self.checkpoint_dir(owner, run_id, kind, name))
        }
        return path

    def resolve_checkpoint(self, owner, path):
        parse_path(path)
        normalised = "twinkle://" + path.split("://", 1)[1]
        record = self.checkpoints.get((owner, normalised))
        if record is None:
            raise NotFound(f"no checkpoint {path!r} for this API key")
        return Path(record["dir"])

    def delete_dir(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


class StateRunRegistry:
    """The persistent :class:`RunRegistry`: runs and checkpoints in the shared ``ServerState``.

    Args:
        state: The server state (memory actor, file or Redis).
        storage_root: Root of the per-tenant checkpoint directories.
        keep_last: Checkpoints kept per run and kind (older ones are deleted, files included).
        checkpoint_ttl_s: Default time to live of new checkpoints.
    """

    def __init__(
        self,
        state,
        storage_root: str | Path,
        keep_last: int | None = None,
        checkpoint_ttl_s: float | None = None,
    ) -> None:
        self.state = state
        self.root = Path(storage_root).expanduser().resolve()
        self.keep_last, self.checkpoint_ttl_s = keep_last, checkpoint_ttl_s

    def create_run(self, owner, *, adapter_name, base_model, lora_rank, lora_config, session_id):
        if not session_id:
            session_id = self.state.create_session(owner, tags=["implicit"]).session_id
        run_id = f"{adapter_name}-{uuid.uuid4().hex[:8]}"
        self.state.create_run(
            owner,
            session_id,
            base_model,
            lora_rank,
            lora_config=lora_config,
            training_run_id=run_id,
        )
        return run_id

    def count_active_runs(self, owner):
        runs, _ = self.state.list_runs(owner, limit=10**6)
        return sum(1 for r in runs if r.status == "active")

    def set_run_status(self, owner, run_id, status):
        self.state.update_run(owner, run_id, status="unloaded" if status == "removed" else status)

    def checkpoint_dir(self, owner, run_id, kind, name):
        from twinkle.server.state import checkpoint_dir

        return checkpoint_dir(self.root, owner, run_id, kind, name)

    def add_checkpoint(self, owner, run_id, kind, name):
        directory = self.checkpoint_dir(owner, run_id, kind, name)
        size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        record, evicted = self.state.add_checkpoint(
            owner,
            run_id,
            kind,
            name,
            str(directory),
            size_bytes=size,
            ttl_seconds=self.checkpoint_ttl_s,
            keep_last=self.keep_last,
        )
        for old in evicted:
            shutil.rmtree(old.local_dir, ignore_errors=True)
        return record.path

    def resolve_checkpoint(self, owner, path):
        record = self.state.resolve_checkpoint_path(owner, path, allow_public=True)
        return Path(record.local_dir)
