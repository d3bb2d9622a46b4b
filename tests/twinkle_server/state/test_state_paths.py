"""Checkpoint names, checkpoint directories and tenant ids."""

from __future__ import annotations

import hashlib
import os

import pytest

from twinkle.server.state import (
    BadRequestError,
    ForbiddenError,
    checkpoint_dir,
    parse_checkpoint_id,
    tenant_id_for_key,
    validate_checkpoint_name,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["step-1", "final", "v1.2_best", "A" * 128, "a.b.c", "0"])
def test_valid_names(name):
    assert validate_checkpoint_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        "a..b",
        "../x",
        "/abs",
        "a/b",
        "a\\b",
        ".x",
        ".",
        "A" * 129,
        "a\uff0fb",  # fullwidth solidus
        "a\u2215b",  # division slash
        "\uff0e\uff0e",  # fullwidth full stops
        "caf\u00e9",
        "a b",
        "a\x00b",
        "a\nb",
        "~root",
        None,
        5,
    ],
)
def test_invalid_names(name):
    with pytest.raises(BadRequestError):
        validate_checkpoint_name(name)


def test_parse_checkpoint_id():
    assert parse_checkpoint_id("weights/a") == ("weights", "a")
    assert parse_checkpoint_id("sampler_weights/b") == ("sampler_weights", "b")
    for bad in ["weights", "weights/", "other/a", "weights/a/b", "weights/.."]:
        with pytest.raises(BadRequestError):
            parse_checkpoint_id(bad)


def test_checkpoint_dir_inside_tenant_root(tmp_path):
    path = checkpoint_dir(tmp_path, "t1", "sess-1:train:0", "weights", "step-1")
    assert path == (tmp_path / "t1" / "sess-1:train:0" / "weights" / "step-1").resolve()


@pytest.mark.parametrize(
    ("owner", "run", "kind", "name"),
    [
        ("t1", "r", "weights", "../../t2"),
        ("t1", "..", "weights", "x"),
        ("t1", "r/../../t2", "weights", "x"),
        ("t1", "/etc", "weights", "x"),
        ("../t2", "r", "weights", "x"),
        ("t1", "r", "../..", "x"),
        ("", "r", "weights", "x"),
    ],
)
def test_checkpoint_dir_refuses_bad_components(tmp_path, owner, run, kind, name):
    with pytest.raises(BadRequestError):
        checkpoint_dir(tmp_path, owner, run, kind, name)


def test_checkpoint_dir_refuses_symlink_escape(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "root" / "t1").mkdir(parents=True)
    os.symlink(outside, tmp_path / "root" / "t1" / "run")
    with pytest.raises(ForbiddenError) as err:
        checkpoint_dir(tmp_path / "root", "t1", "run", "weights", "x")
    assert err.value.status_code == 403


def test_tenant_id_is_a_short_hash():
    tenant = tenant_id_for_key("secret-key")
    assert tenant == hashlib.sha256(b"secret-key").hexdigest()[:16]
    assert "secret" not in tenant
    assert tenant_id_for_key("other-key") != tenant
