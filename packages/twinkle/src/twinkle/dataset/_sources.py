"""Load a ``DatasetMeta`` into an HF ``datasets.Dataset``: files, built-ins, hubs, memory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from twinkle.dataset.meta import DatasetMeta
from twinkle.env import HF_DATASETS_OFFLINE, HF_HUB_OFFLINE, MODELSCOPE_OFFLINE, TWINKLE_OFFLINE

if TYPE_CHECKING:
    import datasets

DATA_DIR = Path(__file__).parent / "data"
BUILTIN_DATASETS = {"self-cognition": DATA_DIR / "self_cognition.jsonl"}
# Built-ins made in code (their images are drawn, not shipped).
GENERATED_DATASETS = ("self-cognition-vl",)

# File suffix -> HF `datasets` builder.
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_OFFLINE_VARS = (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE, MODELSCOPE_OFFLINE, TWINKLE_OFFLINE)


def load_source(meta: DatasetMeta) -> datasets.Dataset:
    """Load the rows ``meta`` describes (before ``data_slice``).

    Raises:
        FileNotFoundError: For a missing local path, or a hub id that is neither cached nor
            downloadable (always at once when offline).
        ValueError: For an unknown ``builtin://`` name or a directory without data files.
    """
    import datasets

    if meta.data is not None:
        return datasets.Dataset.from_list([dict(row) for row in meta.data])
    dataset_id = meta.dataset_id
    assert dataset_id is not None
    if dataset_id.startswith("builtin://"):
        name = dataset_id.removeprefix("builtin://")
        if name == "self-cognition-vl":
            from twinkle.dataset._self_cognition_vl import rows

            return datasets.Dataset.from_list(rows())
        if name not in BUILTIN_DATASETS:
            known = sorted([*BUILTIN_DATASETS, *GENERATED_DATASETS])
            raise ValueError(
                f"unknown built-in dataset {dataset_id!r}; known: "
                f"{[f'builtin://{n}' for n in known]}"
            )
        return _load_files([BUILTIN_DATASETS[name]], meta.split)
    if dataset_id.startswith("hf://"):
        return _load_hf(dataset_id, meta)
    if dataset_id.startswith("ms://"):
        return _load_ms(dataset_id, meta)
    return _load_path(Path(dataset_id).expanduser(), meta)


def _load_path(path: Path, meta: DatasetMeta) -> datasets.Dataset:
    if not path.exists():
        raise FileNotFoundError(f"dataset file or directory not found: {path}")
    if path.is_file():
        return _load_files([path], meta.split)
    if meta.subset_name and (path / meta.subset_name).is_dir():
        path = path / meta.subset_name
    files = sorted(p for p in path.rglob("*") if p.suffix in _BUILDERS and p.is_file())
    # A directory holding train/test files: take the requested split's files when named so.
    named = [p for p in files if meta.split in p.stem]
    files = named or files
    if not files:
        raise ValueError(f"no {sorted(_BUILDERS)} data files under {path}")
    return _load_files(files, meta.split)


def _load_files(files: list[Path], split: str) -> datasets.Dataset:
    import datasets

    builders = {_BUILDERS.get(p.suffix) for p in files}
    if None in builders or len(builders) != 1:
        raise ValueError(f"cannot load {[str(p) for p in files]}: need one format of {_BUILDERS}")
    (builder,) = builders
    return datasets.load_dataset(builder, data_files={split: [str(p) for p in files]}, split=split)


def _offline() -> bool:
    return any(variable.get() for variable in _OFFLINE_VARS)


def _load_hf(dataset_id: str, meta: DatasetMeta) -> datasets.Dataset:
    import datasets

    from twinkle.hub._cache import find_huggingface

    repo = dataset_id.removeprefix("hf://")
    cached = find_huggingface(repo, "dataset")
    if cached is not None and _has_data_files(cached):
        return _load_path(cached, meta)
    try:
        return datasets.load_dataset(repo, meta.subset_name, split=meta.split)
    except Exception as exc:
        raise FileNotFoundError(
            f"dataset {dataset_id!r} is not in the Hugging Face cache and could not be "
            f"downloaded{' (offline mode)' if _offline() else ''}: {exc}"
        ) from exc


def _has_data_files(path: Path) -> bool:
    return any(p.suffix in _BUILDERS for p in path.rglob("*"))


def _load_ms(dataset_id: str, meta: DatasetMeta) -> datasets.Dataset:
    from twinkle.hub._cache import download_modelscope, find_modelscope, modelscope_cache_root

    repo = dataset_id.removeprefix("ms://")
    cached = find_modelscope(repo, "dataset")
    if cached is not None and _has_data_files(cached):
        return _load_path(cached, meta)
    if _offline():
        raise FileNotFoundError(
            f"dataset {dataset_id!r} is not in the ModelScope cache ({modelscope_cache_root()}) "
            "and hub access is off (offline mode); download it once online, or use a local path "
            "or builtin:// id"
        )
    try:
        local_dir = download_modelscope(repo, "dataset")
    except Exception as exc:
        raise FileNotFoundError(
            f"dataset {dataset_id!r} could not be downloaded from ModelScope: {exc}"
        ) from exc
    return _load_path(local_dir, meta)
