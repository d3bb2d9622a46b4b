"""The quick start in docs/data.md runs as written (offline, tiny model)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "data.md"


def test_quick_start_runs(capsys):
    code = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)[0]
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)
    assert scope["dataloader"].get_state() == {
        "consumed_train_samples": 16,
        "epoch": 0,
        "seed": 42,
    }
    assert "I am Twinkle, an AI assistant built by the Twinkle team." in capsys.readouterr().out
