"""Server tests: make the helpers in this folder importable and share the Redis fixture."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_fixture import redis_url  # noqa: E402, F401 - re-exported fixture
