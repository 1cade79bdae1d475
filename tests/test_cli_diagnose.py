"""`detlab batch-invariance` and `detlab audit` as users run them: real ranks on the CPU, JSON shapes, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.e2e.test_browser_diagnosis import SCATTER_OPS


def detlab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_batch_invariance_json_has_a_row_per_cell_a_first_break_per_op_and_an_exit_code_to_match() -> None:
    out = detlab("batch-invariance", "--device", "cpu", "--ops", "mm,softmax", "--dtypes", "float32,bfloat16",
                 "--batch-sizes", "4,1,2", "--features", "64", "--json")
    result = json.loads(out.stdout)
    assert set(result) == {"results", "summary", "device", "tf32", "model"}
    assert [(r["op"], r["dtype"], r["batch_size"]) for r in result["results"]] == [
        (op, dtype, b) for dtype in ("float32", "bfloat16") for op in ("mm", "softmax") for b in (1, 2, 4)]
    assert all(set(r) == {"op", "dtype", "batch_size", "invariant", "max_ulp"} for r in result["results"])
    for s in result["summary"]:
        broken = [r["batch_size"] for r in result["results"]
                  if (r["op"], r["dtype"]) == (s["op"], s["dtype"]) and not r["invariant"]]
        assert s["first_break"] == (min(broken) if broken else None)
    assert result["device"].startswith("cpu") and result["tf32"] is True  # the default preset's flag, as in effect
    everything_invariant = all(r["invariant"] for r in result["results"])
    assert out.returncode == (0 if everything_invariant else 1), out.stderr


def test_batch_invariance_of_a_single_batch_size_one_is_invariant_and_exits_0() -> None:
    out = detlab("batch-invariance", "--device", "cpu", "--ops", "sum", "--batch-sizes", "1", "--features", "16",
                 "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["summary"] == [{"op": "sum", "dtype": "float32", "first_break": None}]


@pytest.mark.parametrize(("args", "message"), [
    (["batch-invariance", "--ops", "conv2d"], "detlab batch-invariance: error: --ops: Input should be 'mm'"),
    (["batch-invariance", "--features", "5000"], "detlab batch-invariance: error: arguments: features must be a "
                                                 "multiple of 16"),
    (["batch-invariance", "--batch-sizes", "1,two"], "detlab batch-invariance: error: argument --batch-sizes: "),
    (["batch-invariance", "--frobnicate"], "detlab batch-invariance: error: No such option: --frobnicate"),
    (["audit"], "detlab audit: error: Missing option '--workload'"),
    (["audit", "--workload", "nope"], "detlab audit: error: --workload: unknown 'nope'; known: mlp"),
    (["audit", "--workload", "mlp", "--reruns", "1"], "detlab audit: error: --reruns: Input should be greater"),
    (["audit", "--workload", "mlp", "--config", "no-such-preset"], "detlab audit: error: --config: "),
])
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = detlab(*args, timeout=60)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith(message), out.stderr
    assert out.stdout == ""


def test_audit_of_scatter_at_two_threads_finds_its_accumulating_ops_nondeterministic_and_exits_1() -> None:
    out = detlab("audit", "--workload", "scatter", "--device", "cpu", "--threads", "2", "--reruns", "10", "--json")
    assert out.returncode == 1, out.stderr
    result = json.loads(out.stdout)
    ops = {o["op"]: o for o in result["ops"]}
    assert set(result["ops"][0]) == {"op", "count", "nondeterministic", "evidence"}
    # Which of its racing ops a run catches varies with the machine's load; only they ever differ.
    nondeterministic = {name for name, o in ops.items() if o["nondeterministic"]}
    assert nondeterministic and nondeterministic <= SCATTER_OPS
    assert all(ops[name]["evidence"].startswith("re-run: ") for name in nondeterministic)
    assert ops["aten.addmm"]["count"] >= 8 and ops["aten.addmm"]["nondeterministic"] is False
    assert (result["workload"], result["threads"], result["ineffective"]) == ("scatter", 2, [])


def test_audit_under_deterministic_mode_finds_no_op_nondeterministic_and_exits_0() -> None:
    out = detlab("audit", "--workload", "scatter", "--device", "cpu", "--threads", "2", "--config",
                 "torch-deterministic", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert not any(o["nondeterministic"] for o in result["ops"]) and result["ineffective"] == []
    assert result["torch_flags"]["deterministic_algorithms"] is True and result["torch_flags"]["num_threads"] == 2
