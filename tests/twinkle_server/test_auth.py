"""API-key authentication: key sources, headers, the tml- prefix, errors and the FastAPI dependency."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from fastapi import Depends, FastAPI

from twinkle.server.state import tenant_id_for_key
from twinkle.server.web.auth import (
    INVALID_KEY,
    MISSING_KEY,
    PUBLIC_PATHS,
    ApiKeyAuth,
    AuthConfigError,
    AuthError,
    Principal,
    is_public_path,
    require_principal,
)

KEY = "key-alpha-0123456789"
OTHER = "key-beta-9876543210"

pytestmark = pytest.mark.unit


@pytest.fixture
def auth() -> ApiKeyAuth:
    return ApiKeyAuth(keys=[KEY, OTHER], environ={})


def test_both_headers(auth):
    bearer = auth.authenticate({"Authorization": f"Bearer {KEY}"})
    api_key = auth.authenticate({"X-API-Key": KEY})
    assert bearer == api_key == Principal(tenant_id=tenant_id_for_key(KEY), key_hint="...6789")
    assert auth.authenticate({"authorization": f"bearer  {OTHER} "}).tenant_id == (
        tenant_id_for_key(OTHER)
    )
    assert auth.authenticate({"x-api-key": OTHER}).tenant_id != bearer.tenant_id


def test_tinker_prefix(auth):
    assert auth.authenticate({"X-API-Key": f"tml-{KEY}"}).tenant_id == tenant_id_for_key(KEY)
    prefixed = ApiKeyAuth(keys=["tml-configured-key-1"], environ={})
    assert prefixed.authenticate({"X-API-Key": "tml-configured-key-1"}).tenant_id == (
        tenant_id_for_key("tml-configured-key-1")
    )
    with pytest.raises(AuthError):
        auth.authenticate({"X-API-Key": f"tml-tml-{KEY}"})


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-API-Key": ""}, {"Authorization": "Bearer "}, {"Authorization": f"Basic {KEY}"}],
)
def test_missing_key(auth, headers):
    with pytest.raises(AuthError) as err:
        auth.authenticate(headers)
    assert (err.value.status_code, err.value.detail) == (401, MISSING_KEY)


@pytest.mark.parametrize("key", ["wrong", KEY[:-1], KEY + "x", KEY.upper(), "tml-", f" {KEY}x"])
def test_invalid_key(auth, key):
    with pytest.raises(AuthError) as err:
        auth.authenticate({"X-API-Key": key})
    assert (err.value.status_code, err.value.detail) == (401, INVALID_KEY)


def test_keys_from_file_and_env(tmp_path):
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("# team keys\nfile-key-1\n\n  file-key-2  \n  # old-key\n")
    auth = ApiKeyAuth(keys_file=keys_file, environ={"TWINKLE_SERVER_API_KEYS": "env-1, env-2,"})
    assert auth.num_keys == 4
    for key in ["file-key-1", "file-key-2", "env-1", "env-2"]:
        assert auth.authenticate({"X-API-Key": key}).tenant_id == tenant_id_for_key(key)
    for comment in ["# team keys", "# old-key", "old-key"]:
        with pytest.raises(AuthError):
            auth.authenticate({"X-API-Key": comment})
    custom = ApiKeyAuth(env_var="MY_KEYS", environ={"MY_KEYS": "k1"})
    assert custom.authenticate({"X-API-Key": "k1"}).key_hint == "***"


def test_env_var_read_from_process_environment(monkeypatch):
    monkeypatch.setenv("TWINKLE_SERVER_API_KEYS", "from-env-key")
    assert ApiKeyAuth().authenticate({"X-API-Key": "from-env-key"}).tenant_id == (
        tenant_id_for_key("from-env-key")
    )


def test_no_keys_refuses_to_start(tmp_path):
    with pytest.raises(AuthConfigError, match="no API keys configured"):
        ApiKeyAuth(environ={})
    with pytest.raises(AuthConfigError, match="no API keys configured"):
        ApiKeyAuth(keys=["", "  "], environ={"TWINKLE_SERVER_API_KEYS": ","})
    with pytest.raises(AuthConfigError, match="cannot read API keys file"):
        ApiKeyAuth(keys_file=tmp_path / "missing.txt", environ={})


def test_anonymous_opt_in_warns():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("twinkle.server.web.auth").addHandler(handler)
    try:
        auth = ApiKeyAuth(allow_anonymous=True, environ={})
    finally:
        logging.getLogger("twinkle.server.web.auth").removeHandler(handler)
    assert auth.authenticate({}).tenant_id == "anonymous"
    assert any(r.levelno == logging.WARNING for r in records)
    keyed = ApiKeyAuth(keys=[KEY], allow_anonymous=True, environ={})
    with pytest.raises(AuthError):
        keyed.authenticate({})


def test_public_paths():
    assert {"/healthz", "/api/v1/healthz", "/health"} <= PUBLIC_PATHS
    assert is_public_path("/healthz") and is_public_path("/api/v1/healthz/")
    assert not is_public_path("/api/v1/training_runs")
    assert not is_public_path("/api/v1/healthz/../training_runs")


def test_fastapi_dependency(auth):
    principal_dep = Depends(require_principal(auth))
    app = FastAPI(dependencies=[principal_dep])

    @app.get("/api/v1/whoami")
    async def whoami(principal: Principal = principal_dep):
        return {"tenant": principal.tenant_id}

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    asyncio.run(_check_app(app))


async def _check_app(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/api/v1/healthz")).json() == {"status": "ok"}
        missing = await client.get("/api/v1/whoami")
        assert missing.status_code == 401
        assert missing.json() == {"detail": MISSING_KEY}
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = await client.get("/api/v1/whoami", headers={"X-API-Key": "nope"})
        assert (wrong.status_code, wrong.json()) == (401, {"detail": INVALID_KEY})
        ok = await client.get("/api/v1/whoami", headers={"X-API-Key": f"tml-{KEY}"})
        assert ok.json() == {"tenant": tenant_id_for_key(KEY)}
