"""State in one JSON file, shared by every process on the machine (e.g. Ray Serve replicas).

Every operation takes an ``fcntl`` lock on a sidecar ``<file>.lock`` (shared for reads, exclusive
for writes) and reads the file from disk, so a replica always sees the writes of the others. A write
goes to a temporary file in the same directory, is fsynced and renamed over the data file, so a
crash never leaves a half-written file behind. The lock lives on a separate file because the data
file is replaced by every write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twinkle.server.state.store import KVStore, Updater, decode_value, encode_value

_FORMAT_VERSION = 1


class FileStore(KVStore):
    """A :class:`KVStore` in the JSON file ``file_path`` (created with its directory on first write).

    Args:
        file_path: The data file. ``<file_path>.lock`` is created next to it.
        key_prefix: Namespace of this store inside the file.
    """

    def __init__(self, file_path: str | os.PathLike[str], key_prefix: str = "") -> None:
        super().__init__(key_prefix)
        self.file_path = Path(file_path).expanduser().absolute()
        self._lock_path = self.file_path.with_name(self.file_path.name + ".lock")
        # flock excludes other processes; the thread lock keeps this process's threads in line
        # without relying on per-descriptor flock semantics.
        self._thread_lock = threading.RLock()

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        self.file_path.parent.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(self._lock_path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[str, dict[str, Any]]:
        """The whole file, freshly parsed (so the values are private copies)."""
        try:
            text = self.file_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        return json.loads(text).get("data", {}) if text.strip() else {}

    def _write(self, data: dict[str, dict[str, Any]]) -> None:
        document = {"format_version": _FORMAT_VERSION, "data": dict(sorted(data.items()))}
        fd, tmp = tempfile.mkstemp(
            prefix=f".{self.file_path.name}.", suffix=".tmp", dir=self.file_path.parent
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(document, out, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.file_path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def get(self, key: str) -> dict[str, Any] | None:
        with self._locked(exclusive=False):
            return self._read().get(self.key_prefix + key)

    def put(self, key: str, value: dict[str, Any]) -> None:
        copy = decode_value(encode_value(value))
        with self._locked(exclusive=True):
            data = self._read()
            data[self.key_prefix + key] = copy
            self._write(data)

    def delete(self, key: str) -> bool:
        with self._locked(exclusive=True):
            data = self._read()
            if data.pop(self.key_prefix + key, None) is None:
                return False
            self._write(data)
            return True

    def scan(self, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        full, cut = self.key_prefix + prefix, len(self.key_prefix)
        with self._locked(exclusive=False):
            data = self._read()
        return [(k[cut:], v) for k, v in sorted(data.items()) if k.startswith(full)]

    def update(self, key: str, fn: Updater) -> dict[str, Any] | None:
        full = self.key_prefix + key
        with self._locked(exclusive=True):
            data = self._read()
            new = fn(data.get(full))
            if new is None:
                if data.pop(full, None) is not None:
                    self._write(data)
            else:
                data[full] = decode_value(encode_value(new))
                self._write(data)
            return new

    def clear(self) -> int:
        with self._locked(exclusive=True):
            data = self._read()
            doomed = [k for k in data if k.startswith(self.key_prefix)]
            for k in doomed:
                del data[k]
            if doomed:
                self._write(data)
            return len(doomed)
