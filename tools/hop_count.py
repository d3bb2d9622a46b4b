"""How many layers a ``forward_backward`` crosses from ``twinkle_client`` to the fused step.

Starts the tiny in-process server (``twinkle.server.process.local``) on a loopback port, trains one
``twinkle_client`` step, and records, with a profile hook, the stack of product frames (functions
of ``twinkle``, ``twinkle.server`` and ``twinkle_client``) at three points of the call:

- the client, when it hands the request to httpx (``httpx.Client.send``);
- the server's request side, when the call is queued for the model thread
  (``FairScheduler.submit``);
- the model thread, when the fused step starts (``fused_forward_backward``).

Prints one JSON line: the frames at each point, their sum, and the two boundaries crossed (HTTP,
the model-thread hand-off). Run it on two checkouts to compare layouts:

    PYTHONPATH=<checkout>/packages/twinkle/src:<...>/twinkle-server/src:<...>/twinkle-client/src \\
        python tools/hop_count.py [--frames]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

KEY = "hop-count-key-1"
BASE = "tiny/qwen3"
ROWS = [{"input_ids": list(range(10, 26)), "labels": list(range(10, 26))}]
PRODUCT = (
    f"{os.sep}twinkle{os.sep}",
    f"{os.sep}twinkle_client{os.sep}",
)


def _config(storage: Path) -> dict:
    return {
        "auth": {"api_keys": [KEY]},
        "storage": {"root": str(storage)},
        "applications": [
            {"name": "server", "route_prefix": "/api/v1", "import_path": "server", "args": {}},
            {
                "name": "model",
                "route_prefix": f"/api/v1/model/{BASE}",
                "import_path": "model",
                "args": {"backend": "transformers", "model_id": "tiny://qwen3", "max_loras": 2},
            },
        ],
    }


def _product_frames(frame) -> list[str]:
    """``module:function`` of every product frame on ``frame``'s stack, outermost first."""
    out = []
    while frame is not None:
        path = frame.f_code.co_filename
        if any(part in path for part in PRODUCT) and f"{os.sep}tools{os.sep}" not in path:
            module = frame.f_globals.get("__name__", path)
            out.append(f"{module}:{frame.f_code.co_qualname}")
        frame = frame.f_back
    return out[::-1]


class StackProbe:
    """A profile hook that keeps the product stack at the first call of each named function."""

    def __init__(self, targets: dict[str, str]) -> None:
        self.targets = targets  # label -> co_qualname to catch
        self.stacks: dict[str, list[str]] = {}
        self.armed = False

    def __call__(self, frame, event, arg):
        if event != "call" or not self.armed:
            return
        name = frame.f_code.co_qualname
        for label, qualname in self.targets.items():
            if label not in self.stacks and name == qualname:
                if label == "client" and "httpx" not in frame.f_code.co_filename:
                    continue
                self.stacks[label] = _product_frames(frame.f_back if label == "client" else frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", action="store_true", help="print each point's frames too")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("RAY_ADDRESS", "local")

    import uvicorn

    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    probe = StackProbe(
        {
            "client": "Client.send",
            "server": "FairScheduler.submit",
            "model_thread": "fused_forward_backward",
        }
    )
    # Every thread the server starts (the model thread, the web server's) inherits the hook; it
    # records only while armed.
    threading.setprofile(probe)
    sys.setprofile(probe)
    with tempfile.TemporaryDirectory(prefix="hops") as tmp:
        server = build_local_server(
            parse_config(_config(Path(tmp) / "storage")), store=MemoryStore("hops:")
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        uv = uvicorn.Server(
            uvicorn.Config(
                server.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"
            )
        )
        threading.Thread(target=uv.run, daemon=True).start()
        while not uv.started:
            time.sleep(0.05)
        client = TwinkleClient(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0)
        model = MultiLoraTransformersModel(model_id="tiny://qwen3", client=client)
        model.add_adapter_to_model("hops", {"r": 4, "lora_alpha": 8})
        model.set_optimizer("Adam", lr=1e-3, adapter_name="hops")
        model.forward_backward(inputs=ROWS, adapter_name="hops")  # warm: first-call setup

        probe.armed = True
        model.forward_backward(inputs=ROWS, adapter_name="hops")
        probe.armed = False
        sys.setprofile(None)
        threading.setprofile(None)
        uv.should_exit = True

    missing = [label for label in probe.targets if label not in probe.stacks]
    counts = {label: len(stack) for label, stack in probe.stacks.items()}
    report = {
        "bench": "hop_count",
        "op": "forward_backward",
        "frames": counts,
        "product_frames": sum(counts.values()),
        "boundaries": ["http", "model_thread"],
        "missing": missing,
    }
    if args.frames:
        report["stacks"] = probe.stacks
    print(json.dumps(report))


if __name__ == "__main__":
    main()
