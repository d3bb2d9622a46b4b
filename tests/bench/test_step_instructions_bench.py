"""bench/step_instructions.py: callgrind's total read back, and one steady step from two runs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import step_instructions  # noqa: E402

# The tail of a callgrind run's stderr (the figures of this repository's first run).
STDERR = """==10933== Events    : Ir
==10933== Collected : 22397608682
==10933==
==10933== I   refs:      22,397,608,682
"""


def test_the_total_is_read_from_callgrinds_summary():
    assert [int(n.replace(",", "")) for n in step_instructions.REFS.findall(STDERR)] == [
        22_397_608_682
    ]


def test_a_steady_step_is_the_difference_of_the_two_runs_over_the_extra_steps():
    counted = {
        ("fused", 1): 21_602_814_198,
        ("fused", 11): 22_397_608_682,
        ("peft", 1): 21_731_660_684,
        ("peft", 11): 22_592_102_242,
    }
    assert step_instructions.steady_step(counted, ["fused", "peft"], 10) == {
        "fused": 79_479_448,
        "peft": 86_044_156,
    }
