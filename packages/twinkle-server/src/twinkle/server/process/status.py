"""``twinkle-server status``: a live per-tenant table of a running server, for the caller's own runs.

Reads the gateway's capabilities, then each trainable model's ``GET /status``: the server returns
the caller's own adapters (steps, tokens/s, last loss, queued calls) plus the model's aggregate
queue depth, never another tenant's rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime
from typing import Any, TextIO

import httpx

from twinkle.server.env import TWINKLE_SERVER_TOKEN, TWINKLE_SERVER_URL

URL_ENV, TOKEN_ENV = TWINKLE_SERVER_URL.name, TWINKLE_SERVER_TOKEN.name
COLUMNS = ("MODEL", "ADAPTER", "RUN", "STEPS", "TOKENS", "TOKENS/S", "LAST LOSS", "QUEUE")
_CLEAR = "\x1b[2J\x1b[H"


class StatusError(Exception):
    """The server could not be read (unreachable, bad key, not a Twinkle server)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="twinkle-server status", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--url",
        default=TWINKLE_SERVER_URL.get(),
        help=f"server address (default: ${URL_ENV} or {TWINKLE_SERVER_URL.default})",
    )
    parser.add_argument(
        "--api-key", default=TWINKLE_SERVER_TOKEN.get(), help=f"API key (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--watch", type=float, metavar="SECONDS", default=None, help="refresh every SECONDS"
    )
    parser.add_argument(
        "--once", action="store_true", help="print once and exit (the default without --watch)"
    )
    parser.add_argument("--json", action="store_true", help="print the raw status as JSON")
    return parser


def api_root(url: str) -> str:
    """``http://host:8000``, ``http://host:8000/`` or ``http://host:8000/api/v1`` -> ``.../api/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/api/v1") else url + "/api/v1"


async def fetch_status(url: str, api_key: str | None, transport: Any = None) -> dict[str, Any]:
    """``{"url", "time", "models": [model status with the caller's "tenants" rows]}``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(
        base_url=api_root(url), headers=headers, timeout=10.0, transport=transport
    ) as http:
        caps = await _get(http, "/get_server_capabilities")
        trainable = [
            m["model_name"] for m in caps.get("supported_models", []) if m.get("trainable")
        ]
        models = [await _get(http, f"/model/{name}/status") for name in trainable]
    return {"url": url, "time": time.time(), "models": models}


async def _get(http: httpx.AsyncClient, path: str) -> dict[str, Any]:
    try:
        response = await http.get(path)
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot reach the Twinkle server at {http.base_url} ({exc})") from None
    if response.status_code == 401:
        raise StatusError(f"the server rejected the API key (pass --api-key or set {TOKEN_ENV})")
    if response.status_code != 200:
        raise StatusError(f"GET {path} answered {response.status_code}: {response.text[:200]}")
    return response.json()


def render(status: dict[str, Any]) -> str:
    """The status as a fixed-width table, one row per adapter, then each model's queue."""
    rows = [COLUMNS]
    for model in status["models"]:
        for t in model.get("tenants", []):
            rows.append(
                (
                    model["base_model"],
                    t["adapter_name"],
                    t["training_run_id"],
                    str(t["steps"]),
                    str(t["tokens"]),
                    _num(t.get("tokens_per_s"), ".1f"),
                    _num(t.get("last_loss"), ".4f"),
                    str(t["queue_depth"]),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    when = datetime.fromtimestamp(status["time"]).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"Twinkle server {status['url']}  {when}", ""]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    if len(rows) == 1:
        lines.append("(no adapters of yours are loaded)")
    lines.append("")
    for model in status["models"]:
        lines.append(
            f"{model['base_model']}: queue depth {model['queue_depth']} (all tenants), "
            f"adapters {model['adapters']}/{model['max_loras']}, "
            f"rate-limit rejections {model.get('rate_limit_rejections', 0)}"
        )
    return "\n".join(lines)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main(argv: list[str] | None = None, *, transport: Any = None, out: TextIO | None = None) -> int:
    """Run ``twinkle-server status``; returns the exit code (0 ok, 1 server error, 2 usage)."""
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    watch = None if args.once else args.watch
    try:
        while True:
            try:
                status = asyncio.run(fetch_status(args.url, args.api_key, transport))
            except StatusError as error:
                print(f"error: {error}", file=sys.stderr)
                return 1
            text = json.dumps(status, indent=2) if args.json else render(status)
            prefix = _CLEAR if watch is not None and out.isatty() else ""
            print(prefix + text, file=out, flush=True)
            if watch is None:
                return 0
            time.sleep(max(0.1, watch))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
