"""The first divergent component in causal order (detlab.core.components) and the resume kind's CLI summary."""

from __future__ import annotations

from detlab.cli.summaries import gate_failures, job_lines, typed_result
from detlab.core import components


def test_the_first_component_is_the_earliest_in_causal_order() -> None:
    found = components.summary({"buffers": {"bn.running_mean"}, "optimizer": {"w.exp_avg"}, "rng": {"numpy"}})
    assert found is not None
    assert (found["component"], found["components"], found["text"]) == ("rng", ["rng", "optimizer", "buffers"],
                                                                        "rng: numpy")


def test_a_lost_resume_is_summarised_and_fails_the_check() -> None:
    result = {"job": {"result_path": "/api/v1/jobs/3/resume"}, "verdict": "lost", "steps": 4, "stop_at": 2,
              "comparison": {"verdict": "diverged", "reason": None, "first_divergent_step": 3,
                             "first_divergent_component": {"component": "batch", "text": "batch: x"},
                             "resume": {"run": 2, "step": 2, "exact": True}}}
    typed = typed_result(result)
    assert job_lines(typed, {"id": 3, "status": "succeeded"}, "http://h")[:3] == [
        "job 3 succeeded: resume at step 2 of 4: lost", "  first divergent step 3, component batch: x",
        "  restored state at step 2: matched the saved step"]
    assert gate_failures(typed, {"verdict": "lost"}, check=True, max_cost=None) == ["resume lost: batch: x"]
