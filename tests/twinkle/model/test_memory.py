"""keep_freed_memory: glibc serves big blocks from its heap (reused step to step), not fresh mmaps.

Each case runs in a fresh interpreter: the setting is process-wide and sticks once applied.
"""

import ctypes
import os
import platform
import subprocess
import sys
import textwrap

import pytest


def _has_mallinfo2() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc >= 2.33


pytestmark = pytest.mark.skipif(
    not _has_mallinfo2(), reason="the setting exists only with glibc; the probe needs mallinfo2"
)

# Allocate 16 MiB (above glibc's default mmap threshold of 128 KiB) and report whether it came
# from a fresh mmap: mallinfo2().hblkhd counts the bytes in mmapped blocks.
PROBE = textwrap.dedent(
    """
    import ctypes
    from twinkle.model.memory import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    applied = keep_freed_memory()
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(16 << 20)
    mmapped = libc.mallinfo2().hblkhd - before
    libc.free(block)
    print(applied, mmapped >= 16 << 20)
    """
)


def _probe(**env: str) -> str:
    return _run(PROBE, **env).strip()


def _run(code: str, **env: str) -> str:
    """The stdout of ``code`` in a fresh interpreter with ``env`` added."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_big_blocks_come_from_the_heap_once_applied():
    assert _probe(TWINKLE_MALLOC_TUNING="1") == "True False"


def test_env_switch_leaves_glibc_defaults():
    assert _probe(TWINKLE_MALLOC_TUNING="0") == "False True"


@pytest.mark.parametrize(
    "options, expected",
    [("None", "True 2"), ("{'malloc_tuning': False, 'cpu_threads': 1}", "None 1")],
)
def test_a_local_model_applies_the_replicas_process_settings(options, expected):
    """A model built for local training sets what a server replica sets
    (``tests/twinkle_server/model/test_model_thread.py``): freed memory kept unless
    ``malloc_tuning=False``, and ``cpu_threads`` when given."""
    code = (
        "import torch\n"
        "torch.set_num_threads(2)\n"
        "from twinkle.model import MultiLoraTransformersModel\n"
        "from twinkle.model import memory\n"
        f"MultiLoraTransformersModel('tiny://qwen3.5', device='cpu', options={options})\n"
        "print(memory._applied, torch.get_num_threads())\n"
    )
    env = {**os.environ, "TWINKLE_MALLOC_TUNING": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == expected


RELEASE_PROBE = textwrap.dedent(
    """
    import ctypes
    from twinkle.model.memory import keep_freed_memory, release_freed_memory

    def rss_mib():
        fields = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
        return int(fields["VmRSS"].split()[0]) / 1024

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    applied = keep_freed_memory()
    base = rss_mib()
    blocks = [libc.malloc(1 << 20) for _ in range(256)]  # 256 MiB, touched
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    keep = libc.malloc(64)  # in use above the freed blocks: the heap's top cannot shrink
    for b in blocks:
        libc.free(b)
    kept = rss_mib() - base
    released = release_freed_memory()
    print(applied, released, round(kept), round(rss_mib() - base))
    """
)


def test_release_hands_the_kept_free_pages_back():
    """What the model replicas run between tasks at each adapter sweep: the freed memory the
    raised thresholds keep is returned, so a long-running server's RSS does not creep."""
    out = _run(RELEASE_PROBE, TWINKLE_MALLOC_TUNING="1").split()
    assert out[:2] == ["True", "True"]
    kept, after = int(out[2]), int(out[3])
    assert kept >= 200  # freed, yet kept in the process
    assert after <= 32  # handed back


def test_release_is_a_no_op_without_the_tuning():
    code = "from twinkle.model.memory import release_freed_memory; print(release_freed_memory())"
    assert _run(code, TWINKLE_MALLOC_TUNING="0").strip() == "False"


HEAP_PROBE = textwrap.dedent(
    """
    import ctypes
    from twinkle.model.memory import heap_stats, keep_freed_memory

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    keep_freed_memory()
    before = heap_stats()
    blocks = [libc.malloc(1 << 20) for _ in range(64)]  # 64 MiB in use
    held = heap_stats()
    keep = libc.malloc(64)  # above the freed blocks, so the heap keeps them
    for b in blocks:
        libc.free(b)
    freed = heap_stats()
    mib = lambda a, b, k: round((a[k] - b[k]) / 2**20)
    print(mib(held, before, "in_use"), mib(freed, before, "in_use"), mib(freed, held, "free_kept"))
    """
)


def test_heap_stats_tell_memory_in_use_from_freed_memory_kept():
    """What the soak reads inside the server to tell a leak (in use grows) from memory the
    heaps keep (free grows): 64 MiB allocated shows as in use, then, freed, as kept."""
    grown, after_free, kept = map(int, _run(HEAP_PROBE, TWINKLE_MALLOC_TUNING="1").split())
    assert grown == 64
    assert after_free == 0
    assert kept == 64
