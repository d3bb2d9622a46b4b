"""Security (issue 28 point 5): key rotation without restart, no secret in logs/spans/bodies,
no hub code under ``TWINKLE_TRUST_REMOTE_CODE=0``, per-key limits, direct-ingress binding."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from twinkle.server.config import parse_config  # noqa: E402
from twinkle.server.process.local import build_local_server  # noqa: E402
from twinkle.server.state import MemoryStore, tenant_id_for_key  # noqa: E402
from twinkle.server.testing import config_dict  # noqa: E402
from twinkle.server.web.auth import ApiKeyAuth, AuthError  # noqa: E402

OLD, NEW, STAYS = "rotate-old-key-0001", "rotate-new-key-0002", "rotate-stays-key-0003"
ME = "/api/v1/auth/apikey/me"


def write_keys(path: Path, *keys: str) -> None:
    """Replace the keys file atomically (temp file + rename), as docs/security.md asks."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# rotated\n" + "".join(f"{k}\n" for k in keys))
    os.replace(tmp, path)


def wait_for(condition, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        time.sleep(0.02)


def headers(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


# --- 1. key rotation --------------------------------------------------------------------------


@pytest.mark.unit
def test_keys_file_is_reread_at_most_every_interval(tmp_path):
    keys_file, now = tmp_path / "keys", [0.0]
    write_keys(keys_file, OLD, STAYS)
    auth = ApiKeyAuth(keys_file=keys_file, environ={}, reload_interval_s=5, clock=lambda: now[0])
    assert auth.authenticate(headers(OLD)).tenant_id == tenant_id_for_key(OLD)
    write_keys(keys_file, NEW, STAYS)
    now[0] = 4.9  # within the interval: the file is not even looked at
    assert auth.authenticate(headers(OLD)).tenant_id == tenant_id_for_key(OLD)
    now[0] = 5.0
    with pytest.raises(AuthError, match="invalid API key"):
        auth.authenticate(headers(OLD))
    assert auth.authenticate(headers(NEW)).tenant_id == tenant_id_for_key(NEW)
    assert auth.authenticate(headers(STAYS)).tenant_id == tenant_id_for_key(STAYS)
    assert auth.num_keys == 2


@pytest.mark.unit
def test_unreadable_or_emptied_keys_file(tmp_path):
    keys_file = tmp_path / "keys"
    write_keys(keys_file, OLD)
    auth = ApiKeyAuth(keys_file=keys_file, environ={}, reload_interval_s=0)
    keys_file.unlink()  # mid-replace or deleted: the keys in force stay, nothing opens up
    assert auth.reload() is False
    assert auth.authenticate(headers(OLD)).tenant_id == tenant_id_for_key(OLD)
    write_keys(keys_file)  # every key removed: everyone is refused, never anonymous
    assert auth.reload() is True and auth.num_keys == 0 and not auth.anonymous
    with pytest.raises(AuthError, match="invalid API key"):
        auth.authenticate(headers(OLD))


def _rotation_server(tmp_path, keys_file: Path, **auth):
    config = config_dict(backend="mock")
    config["auth"] = {"api_keys_file": str(keys_file), "api_keys_reload_s": 0.05, **auth}
    config["storage"] = {"root": str(tmp_path / "storage")}
    return build_local_server(parse_config(config), store=MemoryStore("sec:"))


@pytest.mark.integration
def test_rotation_without_restart_ends_the_old_keys_tokens(tmp_path):
    import httpx

    keys_file = tmp_path / "keys"
    write_keys(keys_file, OLD, STAYS)
    server = _rotation_server(tmp_path, keys_file)

    async def scenario():
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            minted = await http.post("/api/v1/auth/token", json={}, headers={"X-API-Key": OLD})
            assert minted.status_code == 200, minted.text
            token = minted.json()["jwt"]
            assert (await http.get(ME, headers=headers(token))).status_code == 200
            assert (await http.get(ME, headers=headers(NEW))).status_code == 401
            write_keys(keys_file, NEW, STAYS)
            deadline = time.monotonic() + 10
            while (await http.get(ME, headers=headers(OLD))).status_code != 401:
                assert time.monotonic() < deadline, "the removed key still works"
                await asyncio.sleep(0.02)
            by_token = await http.get(ME, headers=headers(token))
            assert by_token.status_code == 401
            assert "no longer accepted" in by_token.json()["error"]
            assert 'error="invalid_token"' in by_token.headers["www-authenticate"]
            new = await http.get(ME, headers=headers(NEW))
            assert new.status_code == 200
            assert new.json()["details"]["org_details"]["name"] == tenant_id_for_key(NEW)
            assert (await http.get(ME, headers=headers(STAYS))).status_code == 200

    asyncio.run(scenario())


@pytest.mark.unit
def test_launch_seals_the_file_keys_and_replicas_follow_the_file(tmp_path, monkeypatch):
    """``launch`` hands replicas digests; the path stays, so a replica that can read the file
    follows it, and one that cannot (another node) keeps the digests launch read."""
    from twinkle.server.context import build_context

    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "env-key-000000001")
    keys_file = tmp_path / "keys"
    write_keys(keys_file, OLD)
    config = config_dict(backend="mock")
    config["auth"] = {"api_keys_file": str(keys_file), "api_keys": [STAYS]}
    sealed = parse_config(config).auth.sealed()
    digest = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    assert sealed.api_keys == [] and sealed.api_keys_file == str(keys_file)
    assert sealed.api_key_sha256 == [digest(STAYS), digest("env-key-000000001")]
    assert sealed.api_keys_file_sha256 == [digest(OLD)]
    monkeypatch.delenv("TWINKLE_SERVER_API_KEYS")  # a replica's node need not have it
    replica_config = parse_config({**config, "auth": sealed.model_dump()})
    dumped = replica_config.model_dump_json()
    assert OLD not in dumped and STAYS not in dumped and "env-key" not in dumped

    def check(auth, key):
        try:
            return auth.authenticate(headers(key)).tenant_id
        except Exception:
            return None

    on_node = ApiKeyAuth(
        keys_file=sealed.api_keys_file,
        environ={},
        digests=sealed.api_key_sha256,
        file_digests=sealed.api_keys_file_sha256,
        reload_interval_s=0,
    )
    assert check(on_node, OLD) == tenant_id_for_key(OLD)
    assert check(on_node, "env-key-000000001") == tenant_id_for_key("env-key-000000001")
    write_keys(keys_file, NEW)
    assert on_node.reload() is True
    assert check(on_node, OLD) is None and check(on_node, NEW) == tenant_id_for_key(NEW)
    assert check(on_node, STAYS) == tenant_id_for_key(STAYS)

    keys_file.unlink()  # another node: no file there
    elsewhere = build_context(replica_config, store=MemoryStore("sec2:"))
    assert elsewhere.authenticate(headers(OLD)) == tenant_id_for_key(OLD)
    assert elsewhere.authenticate(headers(STAYS)) == tenant_id_for_key(STAYS)
    with pytest.raises(Exception, match="invalid API key"):
        elsewhere.authenticate(headers(NEW))


# --- 2. no key or token in logs, spans or bodies ---------------------------------------------


class _Records(__import__("logging").Handler):
    def __init__(self) -> None:
        import logging

        super().__init__(logging.DEBUG)
        self.texts: list[str] = []
        self.formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    def emit(self, record) -> None:
        # The formatted line with its traceback, and the raw arguments in case a handler
        # formats them differently.
        self.texts.append(self.format(record) + " " + repr(record.args))


@pytest.fixture
def telemetry_and_logs():
    import logging

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from twinkle.server.config import TelemetryConfig
    from twinkle.server.telemetry import setup_telemetry, shutdown_telemetry

    shutdown_telemetry()
    spans = InMemorySpanExporter()
    setup_telemetry(
        TelemetryConfig(enabled=True), "Gateway", metric_readers=[], span_exporters=[spans]
    )
    records, root = _Records(), logging.getLogger()
    names = ("", "twinkle", "httpx", "httpcore", "fastapi", "starlette", "asyncio", "ray")
    levels = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.DEBUG)
    root.addHandler(records)
    yield spans, records
    root.removeHandler(records)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    shutdown_telemetry()


def _span_texts(spans) -> list[str]:
    texts = []
    for span in spans.get_finished_spans():
        texts.append(f"{span.name} {dict(span.attributes or {})} {span.status.description}")
        texts += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
        texts.append(str(dict(span.resource.attributes)))
    return texts


@pytest.mark.integration
def test_no_key_or_token_in_logs_spans_or_bodies(tmp_path, telemetry_and_logs):
    import httpx

    from twinkle.server.testing import KEYS

    spans, records = telemetry_and_logs
    server = build_local_server(
        parse_config({**config_dict(backend="mock"), "storage": {"root": str(tmp_path / "s")}}),
        store=MemoryStore("leak:"),
    )
    alice, bob = KEYS["alice"], KEYS["bob"]
    wrong = ["wrong-secret-key-77777", "tml-wrong-secret-key-88888"]
    bodies: list[str] = []
    minted: list[str] = []
    secrets = [alice, bob, *wrong]

    async def call(http, method, path, key, scheme="bearer", **kwargs):
        sent = {"X-API-Key": key} if scheme == "x-api-key" else {"Authorization": f"Bearer {key}"}
        if scheme == "basic":
            sent = {"Authorization": f"Basic {key}"}
        response = await http.request(method, path, headers=sent, **kwargs)
        text = f"{response.status_code} {dict(response.headers)} {response.text}"
        if path.endswith("/auth/token") and response.status_code == 200:
            minted.append(response.json()["jwt"])
            text = text.replace(minted[-1], "<the minted token, its one legitimate place>")
        bodies.append(text)
        return response

    async def scenario():
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            token = await call(http, "POST", "/api/v1/auth/token", f"tml-{alice}", json={})
            token = token.json()["jwt"]
            head, body, signature = token.split(".")
            forged = f"{head}.{body}.{signature[::-1]}"
            secrets.extend([token, forged, signature, body])
            for key in (alice, f"tml-{bob}", token):
                assert (await call(http, "GET", ME, key)).status_code == 200
                assert (await call(http, "GET", ME, key, "x-api-key")).status_code == 200
            for key in (*wrong, forged, f"{head}.{body}"):
                assert (await call(http, "GET", ME, key)).status_code == 401
            assert (await call(http, "GET", ME, alice, "basic")).status_code == 401
            # A token cannot mint a token; a token on a wrong route is still only a 401/404.
            assert (
                await call(http, "POST", "/api/v1/auth/token", token, json={})
            ).status_code == 401
            session = await call(
                http,
                "POST",
                "/api/v1/create_session",
                token,
                json={
                    "tags": [],
                    "user_metadata": {},
                    "sdk_version": "0.38.0",
                    "type": "create_session",
                },
            )
            assert session.status_code == 200, session.text
            sid = session.json()["session_id"]
            created = await call(
                http,
                "POST",
                "/api/v1/create_model",
                token,
                json={
                    "session_id": sid,
                    "model_seq_id": 0,
                    "base_model": "tiny/qwen3",
                    "lora_config": {"rank": 4},
                },
            )
            assert created.status_code == 200, created.text
            request_id = created.json()["request_id"]
            deadline = time.monotonic() + 30
            while True:
                got = await call(
                    http, "POST", "/api/v1/retrieve_future", alice, json={"request_id": request_id}
                )
                if got.status_code == 200 and got.json().get("type") != "try_again":
                    break
                assert time.monotonic() < deadline, got.text
                await asyncio.sleep(0.05)
            bad = await call(http, "POST", "/api/v1/create_model", token, json={"session_id": sid})
            assert bad.status_code == 400
            other = await call(
                http, "POST", "/api/v1/retrieve_future", bob, json={"request_id": request_id}
            )
            assert other.status_code == 404

    asyncio.run(scenario())
    span_texts, log_texts = _span_texts(spans), records.texts
    assert span_texts and log_texts and len(bodies) > 15
    assert any("401" in t or "auth" in t.lower() for t in span_texts + log_texts)
    for where, texts in (("log record", log_texts), ("span", span_texts), ("response", bodies)):
        for text in texts:
            for secret in secrets:
                assert secret not in text, f"a secret ({secret[:6]}...) is in a {where}: {text}"


# --- 3. TWINKLE_TRUST_REMOTE_CODE=0 runs no hub code -----------------------------------------

EVIL_REPO = "evil-org/custom-code"
MARKER_CODE = """import pathlib
pathlib.Path({marker!r}).write_text(__name__)
"""


@pytest.fixture
def custom_code_model(tmp_path, monkeypatch):
    """``ms://evil-org/custom-code`` in a seeded ModelScope cache: the tiny model with an unknown
    ``model_type`` whose config, model and tokenizer classes live in the repo's own modules (each
    writes the marker file when imported)."""
    import json
    import shutil

    from twinkle.hub import resolve_model_dir
    from twinkle.hub._cache import seed_modelscope_cache

    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "modelscope"))
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "0")
    source, marker = tmp_path / "evil", tmp_path / "code-ran"
    shutil.copytree(resolve_model_dir("tiny://qwen3"), source)
    config = json.loads((source / "config.json").read_text())
    config["model_type"] = "evil_custom"
    config["architectures"] = ["EvilForCausalLM"]
    config["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
    }
    (source / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    tokenizer_config["tokenizer_class"] = "EvilTokenizer"
    (source / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for module in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (source / f"{module}.py").write_text(MARKER_CODE.format(marker=str(marker)))
    seed_modelscope_cache(EVIL_REPO, source)
    return f"ms://{EVIL_REPO}", marker


def _loaders():
    from twinkle.hub import load_config, load_tokenizer
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.sampler.torch_sampler import TorchSampler

    return {
        "load_config": load_config,
        "load_tokenizer": load_tokenizer,
        "MultiLoraTransformersModel": MultiLoraTransformersModel,
        "TorchSampler": TorchSampler,
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    "loader", ["load_config", "load_tokenizer", "MultiLoraTransformersModel", "TorchSampler"]
)
def test_custom_code_model_is_refused_and_its_code_never_runs(custom_code_model, loader):
    from twinkle.hub import RemoteCodeRefusedError

    model_id, marker = custom_code_model
    with pytest.raises(RemoteCodeRefusedError, match="TWINKLE_TRUST_REMOTE_CODE is off") as refused:
        _loaders()[loader](model_id)
    assert "modeling_evil.py" in str(refused.value)
    assert not marker.exists()


@pytest.mark.integration
def test_a_server_with_a_custom_code_model_does_not_start(custom_code_model, tmp_path):
    from twinkle.hub import RemoteCodeRefusedError

    model_id, marker = custom_code_model
    config = config_dict(model_id=model_id)
    config["storage"] = {"root": str(tmp_path / "storage")}
    with pytest.raises(RemoteCodeRefusedError, match="TWINKLE_TRUST_REMOTE_CODE=1 only for"):
        build_local_server(parse_config(config), store=MemoryStore("rc:"))
    assert not marker.exists()


@pytest.mark.unit
def test_the_marker_does_detect_code_that_runs(custom_code_model, tmp_path, monkeypatch):
    """The control: with the switch on, transformers imports the repository's module."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setenv("TWINKLE_TRUST_REMOTE_CODE", "1")
    model_id, marker = custom_code_model
    with pytest.raises(Exception):  # noqa: B017 - the module defines no EvilConfig; it ran first
        _loaders()["load_config"](model_id)
    assert marker.read_text().endswith("configuration_evil")


# --- 4. request size and rate limits, per key ------------------------------------------------

NATIVE_MODEL = "/api/v1/model/tiny/qwen3"
ROWS = [{"input_ids": [5, 6, 7, 8, 9], "labels": [-100, 6, 7, 8, 9]}]
SESSION = {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"}


def _limited_server(tmp_path, server_args=None, **model_args):
    from twinkle.server.testing import local_server

    return local_server(tmp_path, backend="mock", server_args=server_args, **model_args)


@pytest.mark.integration
def test_gateway_rate_limit_is_per_key(tmp_path):
    from twinkle.server.testing import client

    # One request per 5 s and a burst of 1: the second request of a key within the test's
    # few milliseconds is over, whatever the machine's speed.
    server = _limited_server(tmp_path, server_args={"rps_limit_per_key": 0.2})

    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            first = await alice.get(ME)
            over = await alice.get("/api/v1/sessions")
            others = [await bob.get(ME), (await bob.get("/api/v1/healthz"))]
            again = await bob.get(ME)
            return first, over, others, again

    first, over, (bob_first, health), bob_again = asyncio.run(scenario())
    assert first.status_code == 200 and bob_first.status_code == 200
    assert over.status_code == 429 and "rps_limit_per_key=0.2" in over.json()["error"]
    assert 4 <= float(over.headers["retry-after"]) <= 5
    assert health.status_code == 200  # health checks are not a key's requests
    assert bob_again.status_code == 429


@pytest.mark.integration
def test_model_rate_limit_is_per_key(tmp_path):
    from twinkle.server.testing import client

    server = _limited_server(tmp_path, queue_config={"rps_limit": 0.2})

    async def scenario():
        statuses = {}
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            for http in (alice, bob):
                added = await http.post(
                    f"{NATIVE_MODEL}/add_adapter_to_model",
                    json={"adapter_name": "a", "config": {"r": 4}},
                )
                assert added.status_code == 200, added.text
            for name, http in (("alice", alice), ("alice", alice), ("bob", bob)):
                answer = await http.post(
                    f"{NATIVE_MODEL}/forward_only", json={"adapter_name": "a", "inputs": ROWS}
                )
                statuses.setdefault(name, []).append(answer.status_code)
        return statuses

    assert asyncio.run(scenario()) == {"alice": [200, 429], "bob": [200]}


@pytest.mark.integration
def test_request_size_bound_on_every_entry_changes_nothing(tmp_path):
    from twinkle.server.testing import client

    server = _limited_server(tmp_path, server_args={"max_request_bytes": 4096})
    padding = {"user_metadata": {"pad": "x" * 5000}}

    async def scenario():
        async with client(server, "alice") as alice, client(server, "bob") as bob:
            before = (await alice.get("/api/v1/sessions")).json()
            big_session = await alice.post("/api/v1/create_session", json={**SESSION, **padding})
            big_model = await alice.post(
                f"{NATIVE_MODEL}/add_adapter_to_model",
                json={"adapter_name": "a", "config": {"r": 4}, **padding},
            )
            after = (await alice.get("/api/v1/sessions")).json()
            small = await bob.post("/api/v1/create_session", json=SESSION)
            return before, big_session, big_model, after, small

    before, big_session, big_model, after, small = asyncio.run(scenario())
    for refused in (big_session, big_model):
        assert refused.status_code == 413, refused.text
        assert "max_request_bytes" in refused.json()["error"] or "4096" in refused.json()["error"]
    assert before == after
    assert small.status_code == 200


# --- 5. direct ingress ports: loopback unless configured -------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("http", "serves"),
    [
        ({}, True),  # the default host, 127.0.0.1
        ({"host": "localhost"}, True),
        ({"host": "::1"}, True),
        ({"host": "127.0.0.2"}, True),
        ({"host": "0.0.0.0"}, False),  # Ray binds the replicas' ports to the proxy's host
        ({"host": "::"}, False),
        ({"host": "10.1.2.3"}, False),
        ({"host": "0.0.0.0", "direct_ingress": True}, True),
        ({"host": "127.0.0.1", "direct_ingress": False}, False),
    ],
)
def test_direct_ingress_only_on_loopback_unless_configured(http, serves):
    from twinkle.server.config import HttpOptions

    assert HttpOptions(**http).serves_direct_ingress() is serves


@pytest.mark.unit
@pytest.mark.parametrize(("host", "expected"), [("0.0.0.0", "0"), ("127.0.0.1", "1")])
def test_launch_starts_ray_with_direct_ingress_as_the_host_allows(monkeypatch, host, expected):
    import twinkle.server.process.launch as launch_module

    for name in launch_module.LOCAL_RAY_ENV:  # recorded, so the test leaves the environment as is
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    started: list[str | None] = []

    def fake_init_ray(namespace=None, direct_ingress=True, address=None):
        # What the local Ray's processes would inherit.
        launch_module.use_local_ray_env(direct_ingress)
        started.append(os.environ.get("RAY_SERVE_ENABLE_DIRECT_INGRESS"))
        return launch_module.OWN_RAY

    monkeypatch.setattr(launch_module, "init_ray", fake_init_ray)
    monkeypatch.setattr(
        launch_module, "deploy", lambda config, timeout, replace=False: "http://x/api/v1"
    )
    config = parse_config({**config_dict(backend="mock"), "http_options": {"host": host}})
    launch_module.launch(config, blocking=False)
    assert started == [expected]
    # An operator's own setting wins over the default.
    monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    launch_module.use_local_ray_env(direct_ingress=False)
    assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
