"""Triton kernels under Triton's interpreter on the CPU: their logic checked on every CI run, where their GPU
tests need a GPU machine. The checks themselves are in kernels_interpret.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs Triton (its interpreter runs on CPU)")


def interpreted(kernel: str) -> None:
    """kernels_interpret.py's check of `kernel` (onepass, fingerprint, drift), in its own process: the interpreter is
    chosen when Triton is imported."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "tests/tensors/kernels_interpret.py", kernel], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
