"""Security (issue 28 point 5): key rotation without restart, no secret in logs/spans/bodies,
no hub code under ``TWINKLE_TRUST_REMOTE_CODE=0``, per-key limits, direct-ingress binding."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from inprocess import config_dict  # noqa: E402

from twinkle.server.auth import ApiKeyAuth, AuthError  # noqa: E402
from twinkle.server.config import parse_config  # noqa: E402
from twinkle.server.local import build_local_server  # noqa: E402
from twinkle.server.state import MemoryStore, tenant_id_for_key  # noqa: E402

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
