"""The Triton kernels compile for real GPUs, on a machine without one.

The interpreter tests (``test_triton_lora.py``) check what the kernels compute, but the
interpreter never runs Triton's compiler. This test runs all of it (TTIR, TTGIR, LLVM IR, PTX,
and a cubin from the ``ptxas`` that ships with Triton) for every kernel variant a training step
launches, for sm_80 (A100) and sm_90 (H100/H200). A kernel that only works interpreted fails
here rather than on the first GPU run.

The compiler runs in a child process: once Triton has been imported with ``TRITON_INTERPRET=1``
(as the test session does on a machine without CUDA), its own library functions are interpreted
ones, and its compiler refuses them.
"""

import itertools
import json
import os
import subprocess
import sys
import warnings

import pytest

pytestmark = pytest.mark.unit

# (kernel, what it computes, the weight layout, scaled?): the four launches of _SegmentedLoraFn.
# Shrinks write the fp32 packed buffer (h, dh); expands read it and write x's dtype (y, dx).
LAUNCHES = [
    ("shrink", "forward h = x @ A_k.T", True, False),
    ("expand", "forward y = s_k h @ B_k.T", False, True),
    ("shrink", "backward dh = s_k dy @ B_k", False, True),
    ("expand", "backward dx = dh @ A_k", True, False),
]
# x's dtype -> DOT_F32 as the launcher picks it on a GPU (exact fp32 dots only for fp32)
DTYPES = {"fp32": True, "bf16": False, "fp16": False}
BLOCK_RS = (16, 64)  # the smallest and the largest rank block


def _signature(fn, kind: str, dtype: str, constexprs: dict) -> dict:
    """Each parameter's type, in the kernel's own order."""
    reads, writes = (dtype, "fp32") if kind == "shrink" else ("fp32", dtype)
    types = {"inp_ptr": f"*{reads}", "w_ptr": f"*{dtype}", "out_ptr": f"*{writes}"}
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in types:
            signature[name] = types[name]
        elif name == "seg_scale_ptr":
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i64"  # the int64 block and segment tables
        else:
            signature[name] = "i32"  # K or N, and a row stride
    return signature


def compile_all(arch: int) -> None:
    """Compile every variant for ``sm_<arch>``; one JSON line each (run in the child)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        print(json.dumps({"skip": f"no Triton ahead-of-time compiler: {exc}"}))
        return
    if "nvidia" not in triton.backends.backends:
        print(json.dumps({"skip": "this Triton build has no NVIDIA backend"}))
        return
    from twinkle.model.lora import triton_kernel

    shrink, expand = triton_kernel._kernels()
    kernels = {"shrink": shrink, "expand": expand}
    for (kind, what, rank_major, scale), (dtype, dot_f32), block_r in itertools.product(
        LAUNCHES, DTYPES.items(), BLOCK_RS
    ):
        fn = kernels[kind]
        blocks = {"BLOCK_K": 64} if kind == "shrink" else {"BLOCK_N": 64}
        constexprs = dict(
            W_RANK_MAJOR=rank_major,
            APPLY_SCALE=scale,
            DOT_F32=dot_f32,
            BLOCK_M=64,
            BLOCK_R=block_r,
            **blocks,
        )
        src = ASTSource(
            fn=fn,
            signature=_signature(fn, kind, dtype, constexprs),
            constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()},
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Triton 3.9's notice about its FP-fusion default
            kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        print(
            json.dumps(
                {
                    "variant": f"{what}, {dtype}, BLOCK_R={block_r}",
                    "ptx_target": f".target sm_{arch}" in kernel.asm["ptx"],
                    "cubin_bytes": len(kernel.asm["cubin"]),
                }
            )
        )


@pytest.mark.parametrize("arch", [80, 90])
def test_every_launched_variant_compiles_to_a_cubin(arch, tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a real compile every time, nothing left in ~
    result = subprocess.run(
        [sys.executable, __file__, str(arch)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if lines and "skip" in lines[0]:
        pytest.skip(lines[0]["skip"])
    assert len(lines) == len(LAUNCHES) * len(DTYPES) * len(BLOCK_RS)
    assert len({line["variant"] for line in lines}) == len(lines)
    for line in lines:
        assert line["ptx_target"], line
        assert line["cubin_bytes"] > 1000, line
    assert any(tmp_path.iterdir())  # compiled here, not read from an older cache


if __name__ == "__main__":
    compile_all(int(sys.argv[1]))
