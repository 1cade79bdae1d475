"""Compile the one-pass kernel (detlab.tensors.onepass_triton) for sm_90 on a machine without a GPU and print the
registers, stack and spills of each (dtype, full rows or not) kernel, as ptxas and cuobjdump (bundled with
Triton) report them. `python registers.py [tiles]`, tiles e.g. `2,4` (default: each dtype's own in KINDS)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

from detlab.core import sketch
from detlab.tensors import onepass_triton as op
from detlab.tensors.fingerprint.reference import DEFAULT_KEY

TOOLS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
POINTERS = {"prog_addr": "*i64", "prog_owner": "*i64", "prog_rot": "*i32", "prog_q": "*i32", "prog_start": "*i64",
            "prog_count": "*i32", "prog_slot": "*i64", "row_index": "*i64", "row_sign": "*fp64", "row_n": "*i64",
            "col_bucket": "*i32", "col_sign": "*fp32", "sums": "*i64", "per_prog": "*fp64", "prog0": "i32"}


def usage(binary: bytes, suffix: str, command: list[str]) -> str:
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(binary)
        f.flush()
        done = subprocess.run([*command, f.name], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def main() -> None:
    fn = op._onepass_kernel
    (a1, a2, a3, a4, a5), (b1, b2, b3, b4, b5) = DEFAULT_KEY.mixers
    tiles = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [0]
    for dtype, (elem, bits, per, chunk, own_tile) in op.KINDS.items():
        for full, tile in itertools.product((True, False), tiles):
            constants = dict(ELEM=elem, BITS=bits, PER=per, FULL=full, K=sketch.K, COLUMNS=sketch.COLUMNS,
                             CHUNK=chunk, ROW_TILE=tile or own_tile, A1=a1, A2=a2, A3=a3, A4=a4, A5=a5, B1=b1,
                             B2=b2, B3=b3, B4=b4, B5=b5)
            signature = {n: POINTERS.get(n, "constexpr") for n in fn.arg_names}
            kernel = triton_compile(ASTSource(fn, signature, constexprs=constants), target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": op.NUM_WARPS})
            ptxas = usage(kernel.asm["ptx"].encode(), ".ptx",
                          [os.path.join(TOOLS, "ptxas"), "-arch=sm_90a", "-v", "-o", os.devnull])
            resources = usage(kernel.asm["cubin"], ".cubin", [os.path.join(TOOLS, "cuobjdump"), "-res-usage"])
            spills = [line.strip() for line in ptxas.splitlines() if "spill" in line]
            regs = [line.strip() for line in resources.splitlines() if "REG:" in line]
            print(f"{dtype} {'full' if full else 'partial'} rows, tile {tile or own_tile}: "
                  f"{regs[0].split(' SHARED')[0] if regs else '?'}; {spills[0] if spills else '?'}")


if __name__ == "__main__":
    main()
