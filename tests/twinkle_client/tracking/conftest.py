import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "twinkle_server"))

from redis_fixture import redis_url  # noqa: E402, F401 - re-exported fixture
