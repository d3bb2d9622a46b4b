"""What a valid config still needs before it can launch: the checks ``check-config`` and ``launch`` share.

Schema validation (``load_config``) knows only the file. These checks also look at the machine the
server starts from: where API keys come from, which optional packages are installed, whether the
model's architecture suits its backend (when the model is already in a local cache; nothing is
downloaded here). ``launch`` runs them before Ray starts, so a config that cannot serve fails in
seconds with the field and the fix, not minutes later as a failed deployment.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path

from twinkle.env import environ as process_environ
from twinkle.server.config import ApplicationConfig, ServerConfig

NO_KEYS = (
    "auth: no API key source: the server refuses to start without keys. Give keys in one of three "
    "ways: (1) the environment variable {env} (comma-separated, e.g. export {env}=EMPTY_API_KEY), "
    "(2) auth.api_keys_file: a file with one key per line, (3) auth.api_keys: [...] in the config "
    "(or auth.api_key_sha256 with their digests). For local development only: "
    "auth.allow_anonymous: true"
)


def preflight_problems(config: ServerConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every reason ``config`` cannot launch from this machine, as ``'<where>: <what and fix>'``."""
    environ = process_environ() if environ is None else environ
    problems = _auth_problems(config, environ)
    served = set()
    for app in config.applications:
        where = f"applications[{app.name}]"
        if app.import_path == "model":
            served.add(app.args.base_model_name)
            problems += [f"{where}.args.{p}" for p in _model_problems(app)]
        elif app.import_path == "sampler":
            problems += [f"{where}.args.{p}" for p in _sampler_problems(app)]
    supported = config.server_application.args.server_config.supported_models
    for name in supported:
        if name not in served:
            problems.append(
                f"applications[{config.server_application.name}].args.server_config."
                f"supported_models: '{name}' is served by no model application (served: "
                f"{', '.join(sorted(served)) or 'none'}); add a model application with model_id "
                f"'{_model_id_for(name)}' or remove it from the list"
            )
    return problems


def _model_id_for(name: str) -> str:
    return f"tiny://{name[5:]}" if name.startswith("tiny/") else f"ms://{name}"


def _auth_problems(config: ServerConfig, environ: Mapping[str, str]) -> list[str]:
    auth = config.auth
    if auth.allow_anonymous:
        return []
    if auth.api_keys_file and not Path(auth.api_keys_file).expanduser().is_file():
        return [f"auth.api_keys_file: {auth.api_keys_file} does not exist on this machine"]
    if auth.key_digests(environ):
        return []
    return [NO_KEYS.format(env=auth.api_keys_env)]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _model_problems(app: ApplicationConfig) -> list[str]:
    args, mesh = app.args, app.args.device_mesh
    problems = []
    dp = mesh.dp_size if mesh is not None else 1
    if args.backend == "megatron":
        if not _installed("megatron.core"):
            problems.append(
                "backend: 'megatron' needs megatron-core (pip install megatron-core==0.16.1); "
                "or use backend: transformers"
            )
        problems += _megatron_mesh_problems(mesh)
    if args.backend == "mock" and dp > 1:
        problems.append(
            f"device_mesh.dp_size: {dp} > 1 needs backend 'transformers' (the mock backend runs "
            "in one process); set dp_size: 1"
        )
    tp = mesh.tp_size if mesh is not None else 1
    pp = mesh.pp_size if mesh is not None else 1
    ep = mesh.ep_size if mesh is not None else 1
    problems += _architecture_problems(args.backend, args.model_id, tp, pp, ep)
    return problems


#: What the megatron backend builds of ``ep_size`` > 1 (tp_size and pp_size: worker ranks of one
#: world; dp_size: Ray replicas at tp = pp = 1, else dp groups of that world).
EP_BUILT = (
    "served expert parallel is built as dp_size == ep_size at tp = pp = 1 (megatron carves the "
    "expert groups from the data-parallel ranks): one world of ep_size ranks, each holding "
    "1/ep_size of a Qwen3-MoE model's experts and running its share of the rows"
)


def _megatron_mesh_problems(mesh) -> list[str]:
    if mesh is None or mesh.ep_size == 1:
        return []
    if mesh.tp_size == 1 and mesh.pp_size == 1 and mesh.dp_size == mesh.ep_size:
        return []
    return [
        f"device_mesh.ep_size: {mesh.ep_size} with dp_size {mesh.dp_size}, tp_size "
        f"{mesh.tp_size}, pp_size {mesh.pp_size} is refused by backend 'megatron': {EP_BUILT}"
    ]


def _sampler_problems(app: ApplicationConfig) -> list[str]:
    args = app.args
    problems = []
    if args.sampler_type == "vllm" and not _installed("vllm"):
        problems.append(
            "sampler_type: 'vllm' but vllm is not installed on this machine (pip install vllm; "
            "the vLLM sampler needs GPUs); "
            "or use sampler_type: torch, e.g. twinkle-server launch -c <file> "
            f"--set applications.{app.name}.args.sampler_type=torch"
        )
    tp = args.device_mesh.tp_size if args.device_mesh is not None else 1
    given = args.engine_args.get("tensor_parallel_size")
    if given is not None and tp > 1 and given != tp:
        problems.append(
            f"engine_args.tensor_parallel_size: {given} contradicts device_mesh.tp_size {tp}"
        )
    return problems


def _cached_model_dir(model_id: str) -> Path | None:
    """The model's directory if it is available without a download, else ``None``."""
    from twinkle.hub import resolve_model_dir
    from twinkle.hub._cache import find_huggingface, find_modelscope

    try:
        if model_id.startswith("ms://"):
            return find_modelscope(model_id.removeprefix("ms://"))
        if model_id.startswith("hf://"):
            return find_huggingface(model_id.removeprefix("hf://"))
        if model_id.startswith(("tiny://", "tiny/")) or Path(model_id).expanduser().is_dir():
            return resolve_model_dir(model_id)
    except Exception:  # an unknown scheme or tiny name is the schema's and the loader's to report
        return None
    return None


def _architecture_problems(
    backend: str, model_id: str, tp_size: int = 1, pp_size: int = 1, ep_size: int = 1
) -> list[str]:
    if backend != "megatron":
        return []
    model_dir = _cached_model_dir(model_id)
    if model_dir is None or not (model_dir / "config.json").is_file():
        return []
    from transformers import AutoConfig

    from twinkle.model.megatron._build import check_supported, check_tp

    hf_config = AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    try:
        check_supported(hf_config, model_id)
    except ValueError as error:
        return [f"backend: {error}"]
    try:
        check_tp(hf_config, model_id, tp_size)
    except ValueError as error:
        return [f"device_mesh.tp_size: {error}"]
    from twinkle.model.megatron._pp import check_pp

    try:
        check_pp(hf_config, model_id, pp_size)
    except ValueError as error:
        return [f"device_mesh.pp_size: {error}"]
    if ep_size > 1:
        from twinkle.model.megatron._moe import check_moe

        try:
            check_moe(hf_config, model_id, tp_size, ep_size)
        except ValueError as error:
            return [f"device_mesh.ep_size: {error}"]
    return []
