"""Run ModelScope Twinkle's own client scripts, unmodified, against a tiny Twinkle server offline.

Upstream's cookbook (``cookbook/client/twinkle/*.py``, ``cookbook/client/tinker/*.py``) is not
shipped here: point ``--scripts`` at a checkout of it. ``--suite conformance`` runs our own
scripts in upstream's style instead (``cookbook/client/conformance``), which check their values. This tool seeds the ModelScope cache with
tiny models and small synthetic datasets under the names those scripts use, starts its own Ray
and a Twinkle server on 127.0.0.1:8000 that serves them, runs each script in turn and prints one
JSON line per script (``rc``, seconds, the last lines of its output) and a summary line::

    python tools/upstream_scripts.py --scripts ~/src/twinkle/cookbook/client \
        --python /tmp/upstream-venv/bin/python

``--python`` is the interpreter that runs the scripts: a user's environment has packages that
ours does not need (``swanlab``, ``python-dotenv``); ``tools/make_upstream_venv.sh`` makes one
over this environment. Nothing reaches the network: a script that needs a real hub or a
checkpoint that only exists on upstream's own server must stop there with a clear message.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_SCRIPTS = [
    "twinkle/self_cognition.py",
    "twinkle/dpo.py",
    "twinkle/embedding.py",
    "twinkle/multi_modal.py",
    "twinkle/sample.py",
    "twinkle/short_math_grpo.py",
    "twinkle/grpo.py",
    "twinkle/multi_turn_rollout.py",
    "twinkle/upload_to_hub.py",
    "tinker/self_cognition.py",
    "tinker/dpo.py",
    "tinker/multi_modal.py",
    "tinker/sample.py",
    "tinker/short_math_grpo.py",
    "tinker/upload_to_hub.py",
]
REPO = Path(__file__).resolve().parents[1]
CONFORMANCE_DIR = REPO / "cookbook" / "client" / "conformance"
# upload_to_hub.py needs a hub (MODELSCOPE_ENDPOINT, MODELSCOPE_TOKEN): asked for by name.
CONFORMANCE_SCRIPTS = [
    "dpo.py",
    "grpo.py",
    "sample_logprobs.py",
    "embedding.py",
    "multi_modal.py",
    "multi_turn_rollout.py",
]
# Upstream names -> the offline tiny model served under that name.
MODELS = {
    "Qwen/Qwen3.5-4B": "tiny://qwen3.5-vl",
    "Qwen/Qwen2.5-3B-Instruct": "tiny://qwen3",
}
# Upstream dataset ids -> rows of the synthetic stand-in: few enough that each script's loop
# (it runs to the end of its data) finishes in minutes on 2 cores.
UPSTREAM_DATASETS = {
    "swift/self-cognition": None,
    "modelscope/gsm8k": 8,
    "hjh0119/shareAI-Llama3-DPO-zh-en-emoji": 16,
    "AI-ModelScope/LaTeX_OCR": 8,
    "zouxuhong/Countdown-Tasks-3to4": 8,
}
KEY = "EMPTY_TOKEN"  # what upstream's scripts send by default
PORT = 8000


def server_config(max_length: int) -> str:
    """A CPU config serving each model of ``MODELS`` (training and torch sampling)."""
    names = "\n".join(f"          - {name}" for name in MODELS)
    apps = []
    for name in MODELS:
        slug = name.replace("/", "-").lower()
        for kind, route, extra in (
            ("model", "model", "backend: transformers\n      max_loras: 8"),
            ("sampler", "sampler", "sampler_type: torch"),
        ):
            deployment = "ModelManagement" if kind == "model" else "SamplerManagement"
            apps.append(
                f"""
  - name: {kind}-{slug}
    route_prefix: /api/v1/{route}/{name}
    import_path: {kind}
    args:
      model_id: "ms://{name}"
      {extra}
      max_length: {max_length}
      device_group: {{name: {kind}, ranks: 0, device_type: cpu}}
    deployments:
      - name: {deployment}
        ray_actor_options: {{num_cpus: 0.1}}"""
            )
    return f"""proxy_location: HeadOnly
http_options: {{host: 127.0.0.1, port: {PORT}}}
persistence: {{mode: memory}}
applications:
  - name: server
    route_prefix: /api/v1
    import_path: server
    args:
      server_config:
        per_token_model_limit: 8
        supported_models:
{names}
    deployments:
      - name: TinkerCompatServer
        ray_actor_options: {{num_cpus: 0.1}}
{"".join(apps)}
  - name: processor
    route_prefix: /api/v1/processor
    import_path: processor
    args: {{ncpu_proc_per_node: 1}}
    deployments:
      - name: ProcessorManagement
        ray_actor_options: {{num_cpus: 0.1}}
"""


def _gsm8k(i: int) -> dict:
    a, b = 3 + i % 7, 2 + i % 5
    return {
        "question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
        "answer": f"Tom has {a} + {b} = {a + b} apples.\n#### {a + b}",
    }


def _emoji_dpo(i: int) -> dict:
    return {
        "prompt": f"Say hello to friend number {i}.",
        "answer_zh": f"你好，朋友 {i}！😊",
        "answer_en": f"Hello friend {i}.",
    }


def _countdown(i: int) -> dict:
    nums = [2 + i % 5, 3 + i % 4, 4 + i % 3]
    return {"nums": nums, "target": nums[0] * nums[1] - nums[2]}


def _latex_ocr(rows: int, folder: Path) -> None:
    """``image`` (PIL images, as the hub's parquet holds them) and ``text`` (their LaTeX)."""
    import datasets
    from PIL import Image

    images, texts = [], []
    for i in range(rows):
        image = Image.new("RGB", (32, 16), color=(255, 255, 255))
        for x in range(4 + i % 20):
            image.putpixel((x + 4, 8), (0, 0, 0))
        images.append(image)
        texts.append(f"x^{{{i % 9 + 1}}} + {i}")
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    table = datasets.Dataset.from_dict({"image": images, "text": texts}, features=features)
    table.to_parquet(str(folder / "train.parquet"))


def write_dataset(repo: str, folder: Path) -> Path:
    """Write the small synthetic stand-in of upstream dataset ``repo`` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = UPSTREAM_DATASETS[repo]
    if repo == "AI-ModelScope/LaTeX_OCR":
        _latex_ocr(rows, folder)
        return folder
    if repo == "swift/self-cognition":
        from twinkle.dataset import BUILTIN_DATASETS

        source = BUILTIN_DATASETS["self-cognition"]
        (folder / "train.jsonl").write_bytes(source.read_bytes())
        return folder
    make = {
        "modelscope/gsm8k": _gsm8k,
        "hjh0119/shareAI-Llama3-DPO-zh-en-emoji": _emoji_dpo,
        "zouxuhong/Countdown-Tasks-3to4": _countdown,
    }[repo]
    target = folder / "main" if repo == "modelscope/gsm8k" else folder
    target.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(make(i), ensure_ascii=False) for i in range(rows)]
    (target / "train.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def offline_env(root: Path) -> dict[str, str]:
    """The environment of the server and the scripts: offline hubs, a seeded cache under root."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TWINKLE_SERVER_URL")}
    env.update(
        MODELSCOPE_CACHE=str(root / "modelscope"),
        TWINKLE_CACHE_DIR=str(root / "twinkle"),
        HF_HOME=str(root / "hf"),
        HF_HUB_OFFLINE="1",
        MODELSCOPE_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        TINKER_TELEMETRY="0",
        TWINKLE_SERVER_API_KEYS=KEY,
        TWINKLE_SERVER_URL=f"http://127.0.0.1:{PORT}",
        TWINKLE_SERVER_TOKEN=KEY,
    )
    return env


def seed(root: Path, env: dict[str, str]) -> None:
    """Tiny models and synthetic datasets into the ModelScope cache under upstream's names."""
    data = root / "data"
    seeds = [(f"ms://{name}", source, []) for name, source in MODELS.items()]
    for repo in UPSTREAM_DATASETS:
        folder = write_dataset(repo, data / repo.replace("/", "--"))
        seeds.append((f"ms://{repo}", str(folder), ["--dataset"]))
    for repo, source, flags in seeds:
        subprocess.run(
            [sys.executable, "-m", "twinkle.hub", "seed", repo, *flags, "--from", source],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )


@contextlib.contextmanager
def serving(config: Path, env: dict[str, str], log: Path, timeout_s: float = 600):
    """``twinkle-server launch -c config`` on its own Ray until it says it is ready."""
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", PORT)) == 0:
            raise SystemExit(f"port {PORT} is in use: upstream's scripts talk to localhost:{PORT}")
    launcher = [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)]
    with open(log, "wb") as out:
        server = subprocess.Popen(
            launcher, cwd=config.parent, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while "Twinkle server ready at" not in log.read_text(errors="replace"):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("server did not start:\n" + log.read_text()[-4000:])
            time.sleep(0.5)
        yield
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


def run_script(python: str, script: Path, cwd: Path, env: dict, timeout_s: float) -> dict:
    """Run one script; its outcome as a JSON-able dict."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [python, str(script)], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
        )  # fmt: skip
        rc, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        rc, output = "timeout", (exc.stdout or b"").decode(errors="replace")
    lines = [line for line in output.splitlines() if line.strip()]
    (cwd / "output.log").write_text(output)
    return {"rc": rc, "seconds": round(time.monotonic() - start, 1), "tail": lines[-6:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scripts",
        type=Path,
        default=None,
        help="upstream's cookbook/client folder (holding twinkle/ and tinker/)",
    )
    parser.add_argument("--suite", choices=("upstream", "conformance"), default="upstream",
                        help="upstream: their scripts from --scripts; conformance: ours")  # fmt: skip
    parser.add_argument("--only", nargs="*", default=None, help="scripts relative to --scripts")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the scripts")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per script")
    parser.add_argument("--max-length", type=int, default=1024, help="the models' max_length")
    parser.add_argument("--workdir", type=Path, default=None, help="keep everything here")
    args = parser.parse_args(argv)
    if args.suite == "conformance":
        args.scripts = args.scripts or CONFORMANCE_DIR
        default = CONFORMANCE_SCRIPTS
    elif args.scripts is None:
        parser.error("--scripts is required for the upstream suite")
    else:
        default = DEFAULT_SCRIPTS
    root = args.workdir or Path(tempfile.mkdtemp(prefix="upstream-"))
    root.mkdir(parents=True, exist_ok=True)
    env = offline_env(root)
    seed(root, env)
    config = root / "server_config.yaml"
    config.write_text(server_config(args.max_length))
    results = {}
    with serving(config, env, root / "server.log"):
        for name in args.only or default:
            cwd = root / "runs" / name.replace("/", "__").removesuffix(".py")
            cwd.mkdir(parents=True, exist_ok=True)
            result = run_script(args.python, args.scripts / name, cwd, env, args.timeout)
            results[name] = result
            print(json.dumps({"script": name, **result}), flush=True)
    passed = sorted(n for n, r in results.items() if r["rc"] == 0)
    print(json.dumps({"passed": len(passed), "of": len(results), "workdir": str(root)}))
    return 0 if args.suite == "upstream" or len(passed) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
