"""The one segment validator both multi-LoRA kernels use, and the order of the op's modules."""

import subprocess
import sys
import textwrap

import pytest
import torch

from twinkle.model.lora.ops import segmented_lora
from twinkle.model.lora.segments import LoraSegment, validate_segments

IN, OUT = 8, 6


def _seg(start: int, end: int, rank: int = 4, in_f: int = IN, out_f: int = OUT) -> LoraSegment:
    return LoraSegment(start, end, torch.zeros(rank, in_f), torch.zeros(out_f, rank), 1.0)


def test_sorted_non_overlapping_segments_with_gaps_and_empties_pass():
    x = torch.zeros(10, 3, IN)
    validate_segments(x, [_seg(0, 2), _seg(2, 2), _seg(3, 7, rank=8), _seg(9, 10)], OUT)
    validate_segments(x, [], OUT)


@pytest.mark.parametrize(
    "segments, message",
    [
        ([_seg(0, 6), _seg(5, 10)], r"non-overlapping; segment 5:10 overlaps 0:6"),
        ([_seg(4, 6), _seg(0, 3)], r"sorted by start .*segment 0:3 comes after 4:6"),
        ([_seg(0, 11)], r"segment 0:11 is not a row range within the input's 10 rows"),
        ([_seg(3, 2)], r"segment 3:2 is not a row range"),
        ([_seg(0, 4, in_f=IN + 1)], r"lora_A \(4, 9\) / lora_B \(6, 4\) do not fit in=8, out=6"),
        ([_seg(0, 4, out_f=OUT + 1)], r"lora_B \(7, 4\) do not fit in=8, out=6"),
    ],
    ids=["overlapping", "unsorted", "past the rows", "reversed", "wrong in", "wrong out"],
)
def test_bad_segments_are_refused_with_a_clear_message(segments, message):
    x = torch.zeros(10, IN)
    with pytest.raises(ValueError, match=message):
        validate_segments(x, segments, OUT)
    with pytest.raises(ValueError, match=message):  # the op checks them the same way
        segmented_lora(x, segments, OUT, kernel="torch")


def test_a_one_dimensional_input_is_refused():
    with pytest.raises(ValueError, match=r"x must be \[rows, ..., in\]"):
        validate_segments(torch.zeros(IN), [], OUT)


def test_rank_mismatch_between_a_and_b_is_refused():
    seg = LoraSegment(0, 2, torch.zeros(4, IN), torch.zeros(OUT, 5), 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        validate_segments(torch.zeros(2, IN), [seg], OUT)


LAYERS = [  # lowest first: each module may import only those before it
    "segments",
    "direct_grads",
    "torch_kernel",
    "triton_kernel",
    "ops",
    "spec",
    "layer",
    "experts",
    "inject",
]


def test_each_module_imports_only_the_layers_below_it():
    """Imported one by one in layer order (without the package ``__init__``, which imports them
    all), no module pulls in one above it."""
    script = textwrap.dedent(
        f"""
        import importlib, pathlib, sys, types
        import twinkle
        root = pathlib.Path(twinkle.__file__).parent / "model" / "lora"
        for name in [m for m in sys.modules if m.startswith("twinkle.model.lora")]:
            del sys.modules[name]
        stub = types.ModuleType("twinkle.model.lora")
        stub.__path__ = [str(root)]
        sys.modules["twinkle.model.lora"] = stub
        layers = {LAYERS!r}
        for i, name in enumerate(layers):
            importlib.import_module("twinkle.model.lora." + name)
            prefix = "twinkle.model.lora."
            loaded = {{m[len(prefix):] for m in sys.modules if m.startswith(prefix)}}
            above = loaded - set(layers[: i + 1])
            assert not above, f"{{name}} imports {{sorted(above)}}"
        print("OK")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK"
