"""The model replica: one torch thread for everything, and its CPU thread count."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from twinkle.server.config import parse_config
from twinkle.server.context import build_context
from twinkle.server.model import deployment
from twinkle.server.process import threads
from twinkle.server.process.threads import cpu_threads

TINY = Path(__file__).resolve().parents[3] / "cookbook/client/server/tiny/server_config.yaml"


def tiny_config_data() -> dict:
    return yaml.safe_load(TINY.read_text())


def model_app(data: dict):
    config = parse_config(data)
    return config, next(a for a in config.applications if a.import_path == "model")


def test_cpu_threads_default_to_the_cores_unless_configured():
    data = tiny_config_data()
    _, app = model_app(data)
    assert cpu_threads(app) == len(os.sched_getaffinity(0))

    raw = next(a for a in data["applications"] if a["import_path"] == "model")
    raw["deployments"][0]["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": 1}}
    _, app = model_app(data)
    assert cpu_threads(app) is None  # the deployment's own setting stands

    raw["args"]["cpu_threads"] = 3
    _, app = model_app(data)
    assert cpu_threads(app) == 3

    raw["args"]["cpu_threads"] = 0
    with pytest.raises(Exception, match="cpu_threads"):
        model_app(data)


def served_config(tmp_path, import_path: str, **args):
    """The tiny config with keys and storage, ``args`` set on the ``import_path`` application."""
    data = tiny_config_data()
    next(a for a in data["applications"] if a["import_path"] == import_path)["args"].update(args)
    data["storage"] = {"root": str(tmp_path)}
    data["auth"] = {"api_keys": ["k"]}
    config = parse_config(data)
    return config, next(a for a in config.applications if a.import_path == import_path)


def record_threads(monkeypatch, module, factory: str) -> list[threading.Thread]:
    """Wrap ``module.factory`` so each call records the thread it ran on."""
    threads: list[threading.Thread] = []
    real = getattr(module, factory)

    def recording(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, factory, recording)
    return threads


def test_the_model_is_built_on_the_thread_that_runs_its_calls(monkeypatch, tmp_path):
    config, app = served_config(tmp_path, "model", backend="mock", cpu_threads=1)
    built_on = record_threads(monkeypatch, deployment, "create_backend")
    service = deployment.build_service(app, build_context(config))
    try:
        runs_on = service.scheduler._executor.submit(threading.current_thread).result()
        assert built_on == [runs_on] and runs_on is not threading.current_thread()
        assert service.scheduler.fuse_wait_s == pytest.approx(0.02)  # the default 20 ms
    finally:
        service.scheduler.close()


def test_an_in_process_sampler_is_built_on_the_thread_that_samples(monkeypatch, tmp_path):
    from twinkle.server.sampler import deployment as sampler_deployment

    config, app = served_config(tmp_path, "sampler", sampler_type="mock")
    built_on = record_threads(monkeypatch, sampler_deployment, "create_sampler")
    service = sampler_deployment.build_sampler_service(app, build_context(config))
    runs_on = service._executor.submit(threading.current_thread).result()
    assert built_on == [runs_on] and runs_on is not threading.current_thread()


@pytest.mark.parametrize(
    ("backend", "keeps"), [("transformers", True), ("megatron", True), ("mock", False)]
)
def test_a_torch_model_replica_keeps_freed_memory(monkeypatch, tmp_path, backend, keeps):
    """The server owns its replica processes: torch backends turn on glibc's memory reuse
    (``tests/twinkle/model/test_memory.py`` checks what the setting does); the mock backend does not."""
    calls: list[bool] = []
    monkeypatch.setattr(threads, "keep_freed_memory", lambda: calls.append(True) or True)
    real = deployment.create_backend
    monkeypatch.setattr(
        deployment, "create_backend", lambda _b, model_id, **_: real("mock", model_id)
    )
    config, app = served_config(tmp_path, "model", backend=backend, cpu_threads=1)
    service = deployment.build_service(app, build_context(config))
    service.scheduler.close()
    assert calls == ([True] if keeps else [])


@pytest.mark.parametrize(("sampler_type", "keeps"), [("torch", True), ("mock", False)])
def test_a_torch_sampler_replica_keeps_freed_memory(monkeypatch, tmp_path, sampler_type, keeps):
    from twinkle.server.sampler import deployment as sampler_deployment

    calls: list[bool] = []
    monkeypatch.setattr(threads, "keep_freed_memory", lambda: calls.append(True) or True)
    _, mock_app = served_config(tmp_path, "sampler", sampler_type="mock")
    real = sampler_deployment.create_sampler
    monkeypatch.setattr(
        sampler_deployment, "create_sampler", lambda _app, root, *rest: real(mock_app, root, *rest)
    )
    config, app = served_config(tmp_path, "sampler", sampler_type=sampler_type)
    sampler_deployment.build_sampler_service(app, build_context(config))
    assert calls == ([True] if keeps else [])


def test_blocking_work_runs_on_a_fixed_pool_started_whole():
    """The web handlers' blocking work (model facts, image expansion, checkpoint packing) runs on
    ``IO_THREADS`` threads that all exist from the first call: the thread count does not creep
    up as concurrency peaks later in a run, as the event loop's default executor's does."""
    import asyncio

    def io_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("twinkle-io")]

    async def burst(n: int) -> list[str]:
        gate = threading.Barrier(threads.IO_THREADS, timeout=10)

        def work(i: int) -> str:
            if i < threads.IO_THREADS:
                gate.wait()  # IO_THREADS calls at once: every thread is busy together
            return f"{i}:{threading.current_thread().name}"

        return await asyncio.gather(*(threads.off_loop(work, i) for i in range(n)))

    async def first_call() -> int:
        await threads.off_loop(int, "1")
        return len(io_threads())

    assert asyncio.run(first_call()) == threads.IO_THREADS
    results = asyncio.run(burst(3 * threads.IO_THREADS))
    assert [r.split(":")[0] for r in results] == [str(i) for i in range(3 * threads.IO_THREADS)]
    assert {r.split(":")[1] for r in results[: threads.IO_THREADS]} == {
        t.name for t in io_threads()
    }
    assert len(io_threads()) == threads.IO_THREADS
