"""Reading a record directory (detlab.sdk.store.load_run): what a crash leaves and what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import detlab
from detlab.core.compare import compare_runs
from detlab.core.runs import RunData
from detlab.sdk import RecordsError, load_run


def compared(a: RunData, b: RunData) -> dict[str, Any]:
    """The comparison as a report stores it (detlab.core.results.RunComparison.stored)."""
    return compare_runs(a, b).stored()


def recording(out: Path, steps: int = 3, *, close: bool = True) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    rec = detlab.Recorder(out=out)
    for step in range(steps):
        with torch.no_grad():
            model.weight.add_(0.5)
        rec.step(step, model, loss=float(step))
    if close:
        rec.close()
    else:
        rec._drain()  # what interpreter exit does for a run that never closed
    return out


def test_a_recording_loads_as_run_data(tmp_path: Path) -> None:
    run = load_run(recording(tmp_path / "a"), run_id=7)
    assert (run.run_id, run.world_size, run.steps(), run.ranks()) == (7, 1, [0, 1, 2], [0])
    assert run.tensors == [("weight", [2, 3], "float32"), ("bias", [2], "float32")]
    assert run.records[(2, 0)].loss == 2.0 and run.status == "succeeded"


def test_a_last_line_cut_short_is_skipped_and_the_run_is_incomplete(tmp_path: Path) -> None:
    a, b = recording(tmp_path / "a"), recording(tmp_path / "b")
    data = (b / "rank0.jsonl").read_bytes()
    (b / "rank0.jsonl").write_bytes(data[: len(data) - 40])  # the rank died writing step 2
    assert load_run(b).steps() == [0, 1]
    result = compared(load_run(a, 1), load_run(b, 2))
    assert (result["verdict"], result["missing"]) == ("incomplete", ["run 2 lacks 1 of 3 steps (2)"])


def test_a_bad_line_before_the_last_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    out = recording(tmp_path / "a")
    rows = (out / "rank0.jsonl").read_text().splitlines()
    rows[2] = rows[2].replace('"step":0', '"step":-1')
    (out / "rank0.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(RecordsError, match=r"rank0.jsonl:3: not a detlab record: step.step: Input should be greater"):
        load_run(out)


def test_a_run_that_never_closed_compares_incomplete(tmp_path: Path) -> None:
    a, b = recording(tmp_path / "a"), recording(tmp_path / "b", close=False)
    assert json.loads((b / "run.json").read_text())["status"] == "running"
    assert load_run(b).steps() == [0, 1, 2]  # every record handed over reached the file
    result = compared(load_run(a, 1), load_run(b, 2))
    assert result["verdict"] == "incomplete"
    assert result["missing"] == ["run 2 did not close (crashed, still running, or rec.close() was not called)"]


def test_a_rank_file_outside_the_world_size_is_refused(tmp_path: Path) -> None:
    out = recording(tmp_path / "a")
    (out / "rank1.jsonl").write_bytes((out / "rank0.jsonl").read_bytes())
    with pytest.raises(RecordsError, match=r"rank file\(s\) \[1\] lie outside the run's world size 1"):
        load_run(out)


def test_ranks_with_different_tensor_lists_load_each_with_its_own(tmp_path: Path) -> None:
    out = recording(tmp_path / "a")
    manifest = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**manifest, "world_size": 2}))
    rows = (out / "rank0.jsonl").read_text().replace('"rank":0', '"rank":1').replace('"bias"', '"other"')
    (out / "rank1.jsonl").write_text(rows)
    run = load_run(out)
    assert [[t.name for t in run.rank_tensors[r]] for r in (0, 1)] == [["weight", "bias"], ["weight", "other"]]
    assert run.tensors == [("weight", [2, 3], "float32"), ("bias", [2], "float32")]  # the lowest rank's


def test_a_step_with_more_digests_than_tensors_is_refused(tmp_path: Path) -> None:
    out = recording(tmp_path / "a")
    rows = (out / "rank0.jsonl").read_text().splitlines()
    record = json.loads(rows[2])
    record["digests"] = "0" * 32 + record["digests"]
    rows[2] = json.dumps({**record, "drift": None})  # a record as written before drift data
    (out / "rank0.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(RecordsError, match=r"rank0.jsonl: step 0 holds 3 digests for 2 tensors"):
        load_run(out)


def test_a_step_whose_drift_data_describe_other_tensors_than_its_digests_is_refused(tmp_path: Path) -> None:
    out = recording(tmp_path / "a")
    rows = (out / "rank0.jsonl").read_text().splitlines()
    rows[2] = rows[2].replace('"digests":"', '"digests":"' + "0" * 32)
    (out / "rank0.jsonl").write_text("\n".join(rows) + "\n")
    with pytest.raises(RecordsError, match=r"rank0.jsonl:3: not a detlab record: step: drift describes 2 tensors"):
        load_run(out)


def test_a_script_that_never_closes_keeps_its_records_at_exit(tmp_path: Path) -> None:
    import subprocess
    import sys

    # Each record is held back 0.2 s in the writer, so the loop ends long before they are written.
    script = ("import sys, time, torch, detlab\n"
              "rec = detlab.Recorder(out=sys.argv[1])\n"
              "rec.step(0, torch.nn.Linear(64, 64))\n"
              "put = rec._spool.put\n"
              "rec._spool.put = lambda job: put(lambda: (time.sleep(0.2), job())[1])\n"
              "for step in range(1, 4):\n"
              "    rec.step(step, torch.nn.Linear(64, 64))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    run = load_run(tmp_path / "a")
    assert run.steps() == [0, 1, 2, 3] and run.status is not None and run.status.startswith("did not close")
