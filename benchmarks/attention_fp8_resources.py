"""Registers, spills, shared memory and programs per SM of the FP8-cache attention variants, compiled
for sm_90 on any machine (no GPU: ``triton.compile`` and the wheel's ``cuobjdump`` run on a CPU).

    python benchmarks/attention_fp8_resources.py            # the installed Triton
    PYTHONPATH=/tmp/t36 python benchmarks/attention_fp8_resources.py   # the device's (3.6.0)

(``pip install --no-deps --target /tmp/t36 triton==3.6.0`` gives the H200's compiler here.) It
compiles the committed forward (``attention_exact_triton._fwd_kernel``: BF16 K/V, and an FP8
cache with its ``LATE_V`` switch off and on, the tune sweep's launches) at Llama heads (D = 128), with the launch's
specialisation (16-byte-divisible pointers and strides), and prints one table. Programs per SM
are the smaller of the register and the shared-memory bounds of an H100/H200 SM (65,536 registers
allocated per warp in 256s; 228 KB of shared memory, 1 KB reserved per program). A static count,
not a timing: ``attention_fp8_tune.py`` times the same variants on the GPU.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).parent))
from attention_fp8_tune import VARIANTS  # this folder

from fp8rl.kernels import attention_exact_triton as att

SM_REGISTERS, SM_SHARED_KB, RESERVED_KB = 65536, 228, 1
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_forward(
    fp8: bool,
    stages: int,
    maxnreg: int | None,
    late_v: bool = False,
    warps: int = att.NUM_WARPS,
    bm: int = att.BLOCK_M,
):
    """Compile the committed forward for sm_90 at one launch (``bm`` rows a tile); the
    CompiledKernel."""
    fn = att._fwd_kernel
    kv = "*fp8e4nv" if fp8 else "*bf16"
    pointers = {"Q": "*bf16", "K": kv, "V": kv, "KS": "*fp32", "VS": "*fp32", "OUT": "*bf16"}
    pointers |= {"LSE": "*fp32", "NVIS": "*i32"}
    constants = {"D": 128, "BM": bm, "BN": att.BLOCK_N}
    constants |= {"KV_FP8": fp8, "LATE_V": late_v}
    signature = {
        name: pointers.get(name, "constexpr" if name in constants else "i32")
        for name in fn.arg_names
    }
    signature["qk_scale"] = "fp32"
    aligned = [n for n in fn.arg_names if n in pointers or n.startswith("s")]  # strides: s…
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    options = {"num_warps": warps, "num_stages": stages}
    options |= {} if maxnreg is None else {"maxnreg": maxnreg}
    source = ASTSource(fn, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def resources(kernel) -> tuple[int, int, int]:
    """(registers per thread, spill loads + stores in the SASS, shared memory KB) of a binary."""
    path = Path("/tmp/fp8rl-attention-resources.cubin")
    path.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([CUOBJDUMP, "-res-usage", path], capture_output=True, text=True).stdout
    sass = subprocess.run([CUOBJDUMP, "-sass", path], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    spills = len(re.findall(r"\b(?:STL|LDL)\b", sass))
    return regs, spills, kernel.metadata.shared // 1024


def programs_per_sm(regs: int, shared_kb: int, warps: int) -> tuple[int, int]:
    """(by registers, by shared memory) for ``warps``-warp programs on an H100/H200 SM."""
    per_warp = -(-regs * 32 // 256) * 256
    return SM_REGISTERS // (per_warp * warps), SM_SHARED_KB // (shared_kb + RESERVED_KB)


def main() -> None:
    rows = [("BF16 K/V (trainer)", False, s, None, False, att.NUM_WARPS) for s in (2, 3)]
    rows += [("FP8 cache", True, 2, None, False, att.NUM_WARPS)]
    rows += [(f"FP8 cache late_v={lv}", True, st, mr, lv, att.NUM_WARPS) for lv, st, mr in VARIANTS]
    print(f"Triton {triton.__version__}, sm_90, D = 128\n")
    print(
        "| kernel | warps | stages | maxnreg | regs | spill ops | smem KB | programs/SM (regs, smem) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, fp8, stages, maxnreg, late_v, warps in rows:
        regs, spills, shared = resources(compile_forward(fp8, stages, maxnreg, late_v, warps))
        by_regs, by_smem = programs_per_sm(regs, shared, warps)
        print(
            f"| {name} | {warps} | {stages} | {maxnreg or '-'} | {regs} | {spills} | {shared} | "
            f"**{min(by_regs, by_smem)}** ({by_regs}, {by_smem}) |"
        )


if __name__ == "__main__":
    main()
