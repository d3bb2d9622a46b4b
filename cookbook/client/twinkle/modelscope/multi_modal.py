"""Image + text SFT through the Twinkle client against the Twinkle service hosted on ModelScope.

The same code as ``../self_host/multi_modal.py``, run with the hosted service's address and your
ModelScope token as the API key::

    export TWINKLE_SERVER_URL=https://...   # the hosted service's address
    export MODELSCOPE_TOKEN=ms-...          # your ModelScope access token
    python cookbook/client/twinkle/modelscope/multi_modal.py

TWINKLE_BASE_MODEL (default Qwen/Qwen3.5-4B) and TWINKLE_MAX_STEPS as in the self_host script.
"""

import os
import runpy
from pathlib import Path

for name in ("TWINKLE_SERVER_URL", "MODELSCOPE_TOKEN"):
    if not os.environ.get(name):
        raise SystemExit(f"error: set {name} (the hosted service's address and your token)")
os.environ["TWINKLE_SERVER_TOKEN"] = os.environ["MODELSCOPE_TOKEN"]

runpy.run_path(str(Path(__file__).parents[1] / "self_host" / "multi_modal.py"), run_name="__main__")
