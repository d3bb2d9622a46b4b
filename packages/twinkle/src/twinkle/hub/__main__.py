"""``python -m twinkle.hub seed``: put a model or dataset directory into a hub cache under a name.

Example (an offline CPU machine serving the seed's config with the tiny model's weights)::

    python -m twinkle.hub seed ms://Qwen/Qwen3.5-4B --from tiny://qwen3.5
    python -m twinkle.hub seed ms://swift/self-cognition --dataset --from builtin://self-cognition
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from twinkle.hub._cache import seed_huggingface_cache, seed_modelscope_cache
from twinkle.hub._resolve import resolve_model_dir


def _source_dir(source: str, dataset: bool, scratch: Path) -> Path:
    if dataset and source.startswith("builtin://"):
        from twinkle.dataset._sources import BUILTIN_DATASETS

        name = source.removeprefix("builtin://")
        if name not in BUILTIN_DATASETS:
            raise SystemExit(f"error: unknown built-in dataset {source!r}")
        (scratch / BUILTIN_DATASETS[name].name).write_bytes(BUILTIN_DATASETS[name].read_bytes())
        return scratch
    if dataset:
        path = Path(source).expanduser()
        if not path.exists():
            raise SystemExit(f"error: {source!r} does not exist")
        if path.is_file():
            (scratch / path.name).write_bytes(path.read_bytes())
            return scratch
        return path
    return resolve_model_dir(source)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m twinkle.hub")
    commands = parser.add_subparsers(dest="command", required=True)
    seed = commands.add_parser("seed", help="copy a directory into a hub cache under a repo id")
    seed.add_argument("repo", help="ms://<org>/<name> or hf://<org>/<name>")
    seed.add_argument("--from", dest="source", required=True,
                      help="a model id (tiny://qwen3.5, a directory) or, with --dataset, a data "
                           "file, directory or builtin://<name>")  # fmt: skip
    seed.add_argument("--dataset", action="store_true", help="seed a dataset repo")
    seed.add_argument("--cache-dir", default=None, help="the cache root (default: the hub's own)")
    args = parser.parse_args(argv)
    scheme, _, repo_id = args.repo.partition("://")
    seeders = {"ms": seed_modelscope_cache, "hf": seed_huggingface_cache}
    if scheme not in seeders or not repo_id:
        parser.error(f"repo must be ms://<org>/<name> or hf://<org>/<name>, got {args.repo!r}")
    repo_type = "dataset" if args.dataset else "model"
    with tempfile.TemporaryDirectory() as scratch:
        source = _source_dir(args.source, args.dataset, Path(scratch))
        target = seeders[scheme](repo_id, source, repo_type=repo_type, cache_dir=args.cache_dir)
    print(f"seeded {args.repo} ({repo_type}) at {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
