"""The execution options are declared once: the library's ``ExecutionOptions`` dataclass. The
server's ``execution:`` block (``ExecutionConfig``) and the table of docs/server_config.md must
list the same fields, with compatible types and defaults; these tests fail when one drifts."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import pytest

from twinkle.model.options import ExecutionOptions
from twinkle.server.config.args import ExecutionConfig

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = {f.name: f for f in dataclasses.fields(ExecutionOptions)}
HINTS = typing.get_type_hints(ExecutionOptions)

pytestmark = pytest.mark.unit


def _without_none(annotation: object) -> frozenset:
    """The alternatives of ``annotation`` other than ``None`` (``int | None`` -> {int})."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return frozenset(a for a in typing.get_args(annotation) if a is not type(None))
    return frozenset({annotation})


def test_the_server_block_has_the_librarys_fields_in_its_order():
    assert list(ExecutionConfig.model_fields) == list(LIBRARY)


@pytest.mark.parametrize("name", list(LIBRARY))
def test_each_server_field_is_the_library_type_made_optional_with_no_default(name):
    field = ExecutionConfig.model_fields[name]
    # None: the library's default (or the environment's, read once) applies.
    assert field.default is None
    assert type(None) in typing.get_args(field.annotation), f"{name} must accept null"
    assert _without_none(field.annotation) == _without_none(HINTS[name])


def test_the_library_defaults_pass_the_server_block_and_come_back_unchanged():
    defaults = ExecutionOptions()
    block = ExecutionConfig(**dataclasses.asdict(defaults))
    assert block.options() == defaults


def _documented_rows() -> dict[str, str]:
    """``field -> default`` of the table under "The ``execution`` block" of server_config.md."""
    text = (ROOT / "docs/server_config.md").read_text()
    section = text.split("#### The `execution` block", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| [^|]*(?:\\\|[^|]*)* \| ([^|]*) \|", section, re.MULTILINE)
    return {name: default.strip() for name, default in rows}


def test_the_docs_table_lists_every_field_with_the_librarys_literal_defaults():
    documented = _documented_rows()
    assert list(documented) == list(LIBRARY)
    for name, field in LIBRARY.items():
        default = field.default
        if default is None:
            continue  # decided at run time (the device's, every core...): described in words
        literal = str(default).lower() if isinstance(default, bool) else str(default)
        assert documented[name] == f"`{literal}`", name
