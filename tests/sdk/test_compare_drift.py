"""`detlab compare A B` says how far two recordings drift apart (text and JSON), from the Recorder's statistics
and sketches; a recording made without them gives no estimate and says why."""

from __future__ import annotations

import json
from pathlib import Path

from detlab.core import drift
from detlab.sdk import load_run
from tests.sdk.test_compare import compare, record


def test_a_flipped_element_is_estimated_with_its_growth_in_text_and_json(tmp_path: Path) -> None:
    a, b = record(tmp_path / "a"), record(tmp_path / "b", flip="2:0:0.weight")
    text = compare(a, b)
    assert text.returncode == 1
    line = next(x for x in text.stdout.splitlines() if "drift" in x)
    assert line.startswith("  drift (‖A−B‖/‖A‖, estimated): ")
    done = compare(a, b, "--json")
    drift = json.loads(done.stdout)["drift"]
    assert drift["available"] and drift["dtype"] == "float32" and drift["max"] > 0 and drift["max_step"] >= 2
    assert drift["verdict"] in line and drift["k"] == 16
    assert "points" not in drift  # the summary; the points grow with the run


def test_a_recording_without_drift_data_gives_no_estimate_and_says_why(tmp_path: Path) -> None:
    a, b = record(tmp_path / "a"), record(tmp_path / "b", "--no-drift", flip="2:0:0.weight")
    assert "drift: not estimated: run 2 recorded no parameter statistics" in compare(a, b).stdout
    drift = json.loads(compare(a, b, "--json").stdout)["drift"]
    assert drift["available"] is False and drift["max"] is None


def test_runs_sketched_at_other_cadences_are_estimated_at_the_steps_both_sketched(tmp_path: Path) -> None:
    a = record(tmp_path / "a", "--steps", "7", "--drift", "2")  # sketched at steps 0, 2, 4, 6
    b = record(tmp_path / "b", "--steps", "7", "--drift", "3", flip="2:0:0.weight")  # at 0, 3, 6
    summary = json.loads(compare(a, b, "--json").stdout)["drift"]
    assert summary["available"] and summary["max"] > 0 and summary["max_step"] == 6
    points = drift.compare(load_run(a), load_run(b, 2), per_rank=False, diverged_at=2)["points"]
    assert [step for step, _ in points] == [0, 6] and points[0][1] == 0.0


def test_runs_that_part_after_the_last_step_both_sketched_say_the_drift_was_not_estimated(tmp_path: Path) -> None:
    """Recorder()'s cadence (every tenth step) on a run of 6 steps: only step 0 is sketched, before the flip."""
    a = record(tmp_path / "a", "--drift", "10")
    b = record(tmp_path / "b", "--drift", "10", flip="2:0:0.weight")
    line = next(x for x in compare(a, b).stdout.splitlines() if "drift" in x)
    assert line.endswith("not estimated after the divergence at step 2: the last step both runs sketched is 0 "
                         "(distance 0 there); Recorder(drift=True) sketches every step"), line
