"""The seed's spelling of ``self_cognition.py``: runs that script (one copy of the code).

python cookbook/client/twinkle/self_host/self_congnition.py
"""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("self_cognition.py")), run_name="__main__")
