"""The client installs and imports like a small library: no torch, and a fast ``import``."""

from __future__ import annotations

import subprocess
import sys

CLIENT_MODULES = (
    "model",
    "sampler",
    "dataset",
    "dataloader",
    "processor",
    "data_format",
    "errors",
    "types",
)


def _python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_no_module_of_the_client_imports_torch_transformers_or_peft():
    imports = "; ".join(f"import twinkle_client.{m}" for m in CLIENT_MODULES)
    out = _python(
        f"import sys; {imports}; print(sorted({{'torch', 'transformers', 'peft'}} & set(sys.modules)))"
    )
    assert out == "[]"


def test_import_twinkle_client_is_fast():
    # Median of three fresh interpreters; measured ~1 ms for the package itself (its names load lazily)
    # and ~0.45 s for every submodule with numpy, httpx and pydantic. The bound is generous for slow CI.
    code = "import time; t = time.perf_counter(); import twinkle_client; print(time.perf_counter() - t)"
    times = sorted(float(_python(code)) for _ in range(3))
    assert times[1] < 1.0, times
    full = "; ".join(f"import twinkle_client.{m}" for m in CLIENT_MODULES)
    code = f"import time; t = time.perf_counter(); {full}; print(time.perf_counter() - t)"
    assert float(_python(code)) < 3.0
