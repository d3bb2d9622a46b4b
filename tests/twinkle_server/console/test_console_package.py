"""The console's assets are package data: found through importlib.resources, shipped in the
twinkle-server wheel, and self-contained (nothing fetched from another host)."""

from __future__ import annotations

import re
import zipfile
from importlib import resources
from pathlib import Path

from twinkle.server.console import admin_tenants_from_env, static_files
from twinkle.server.state.paths import tenant_id_for_key

ASSETS = {"index.html", "console.js", "console.css"}
SERVER_PACKAGE = Path(__file__).resolve().parents[3] / "packages" / "twinkle-server"


def test_the_assets_are_found_through_importlib_resources():
    folder = resources.files("twinkle.server.console") / "static"
    assert {entry.name for entry in folder.iterdir()} >= ASSETS
    files = static_files()
    assert set(files) == ASSETS
    assert files["index.html"] == (folder / "index.html").read_bytes()


def test_the_assets_reference_no_other_host():
    for name, content in static_files().items():
        text = content.decode("utf-8")
        # Only the SVG namespace (an identifier, never fetched) may look like a URL.
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (name, urls)
    page = static_files()["index.html"].decode()
    assert re.findall(r'(?:src|href)="([^"#]+)"', page) == [
        "static/console.css",
        "static/console.js",
    ]


def test_the_wheel_ships_the_assets(tmp_path):
    from hatchling.builders.wheel import WheelBuilder

    (wheel,) = WheelBuilder(str(SERVER_PACKAGE)).build(
        directory=str(tmp_path), versions=["standard"]
    )
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            Path(n).name: archive.read(n)
            for n in archive.namelist()
            if n.startswith("twinkle/server/console/static/")
        }
    assert shipped == static_files()


def test_admin_keys_are_keys_or_their_sha256_digests():
    import hashlib

    digest = hashlib.sha256(b"ops-key-2").hexdigest()
    environ = {"TWINKLE_CONSOLE_ADMIN_KEYS": f" ops-key-1 ,{digest},"}
    assert admin_tenants_from_env(environ) == {
        tenant_id_for_key("ops-key-1"),
        tenant_id_for_key("ops-key-2"),
    }
    assert admin_tenants_from_env({}) == frozenset()
