"""The ModelScope and Hugging Face caches: find a cached repo with the hub's own client, or seed one.

Looking up goes through each hub's library (``modelscope`` / ``huggingface_hub``) with local files
only, so every on-disk layout those libraries read is found and nothing is guessed here. Seeding
writes a directory into the cache in the layout the library itself writes, so that a machine with
no network (CI, an air-gapped cluster) can serve ``ms://Qwen/Qwen3.5-4B`` from weights copied in by
hand; the tests use it to put a tiny model under a real model's name.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Literal

from twinkle.env import MODELSCOPE_CACHE

RepoType = Literal["model", "dataset"]
MODELSCOPE_REVISION = "master"  # what modelscope resolves when no revision is given
HF_SEED_COMMIT = "0" * 40  # a seeded snapshot has no upstream commit; refs/main points here


def modelscope_cache_root() -> Path:
    """``$MODELSCOPE_CACHE``, else ``~/.cache/modelscope/hub`` (modelscope's own default)."""
    cache = MODELSCOPE_CACHE.get()
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "modelscope" / "hub"


def _quiet_modelscope() -> None:
    # modelscope logs each cache miss at WARNING and retries listing; the caller reports misses.
    for name in ("modelscope", "modelscope_hub", "modelscope_hub.legacy_api"):
        logging.getLogger(name).setLevel(logging.ERROR)


def find_modelscope(repo_id: str, repo_type: RepoType = "model") -> Path | None:
    """The cached snapshot of a ModelScope repo, or ``None`` (never touches the network)."""
    from modelscope.hub.snapshot_download import snapshot_download

    _quiet_modelscope()
    try:
        # The cache root is passed explicitly: modelscope reads $MODELSCOPE_CACHE once at import.
        path = snapshot_download(
            repo_id, repo_type=repo_type, local_files_only=True, cache_dir=modelscope_cache_root()
        )
    except Exception:  # modelscope raises its own CacheNotFound / ValueError kinds
        return None
    return Path(path) if path and Path(path).is_dir() else None


def download_modelscope(repo_id: str, repo_type: RepoType = "model") -> Path:
    """Download a ModelScope repo into the cache (network)."""
    from modelscope.hub.snapshot_download import dataset_snapshot_download, snapshot_download

    root = modelscope_cache_root()
    if repo_type == "dataset":
        return Path(dataset_snapshot_download(repo_id, cache_dir=root))
    return Path(snapshot_download(repo_id, cache_dir=root))


def find_huggingface(repo_id: str, repo_type: RepoType = "model") -> Path | None:
    """The cached snapshot of a Hugging Face repo, or ``None`` (never touches the network)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError and friends
        return None


def seed_modelscope_cache(
    repo_id: str,
    source_dir: str | os.PathLike[str],
    *,
    repo_type: RepoType = "model",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Copy ``source_dir`` into the ModelScope cache as ``repo_id`` and return the snapshot dir.

    The layout is modelscope's: ``<cache>/<type>s/<org>--<name>/snapshots/master/``.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else modelscope_cache_root()
    org, _, name = _split(repo_id)
    target = root / f"{repo_type}s" / f"{org}--{name}" / "snapshots" / MODELSCOPE_REVISION
    _copy_tree(Path(source_dir), target)
    return target


def seed_huggingface_cache(
    repo_id: str,
    source_dir: str | os.PathLike[str],
    *,
    repo_type: RepoType = "model",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Copy ``source_dir`` into the Hugging Face cache as ``repo_id``; returns the snapshot dir.

    The layout is huggingface_hub's: ``<cache>/<type>s--<org>--<name>/snapshots/<commit>/`` with
    ``refs/main`` naming the commit (the default cache is ``$HF_HUB_CACHE``).
    """
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = constants.HF_HUB_CACHE
    org, _, name = _split(repo_id)
    repo_dir = Path(cache_dir).expanduser() / f"{repo_type}s--{org}--{name}"
    target = repo_dir / "snapshots" / HF_SEED_COMMIT
    _copy_tree(Path(source_dir), target)
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(HF_SEED_COMMIT)
    return target


def _split(repo_id: str) -> tuple[str, str, str]:
    org, sep, name = repo_id.strip("/").partition("/")
    if not (org and sep and name) or "/" in name:
        raise ValueError(f"{repo_id!r}: expected <org>/<name>")
    return org, sep, name


def _copy_tree(source: Path, target: Path) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"not a directory: {source}")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".twinkle-*"))
