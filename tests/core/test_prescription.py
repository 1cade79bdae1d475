"""The search of `detlab fix` as pure functions, driven by an oracle of which knob sets are reproducible: the
rounds it runs, minimality, the budget, and the catalogue's rules of where a knob applies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from detlab.core import configs, knobs
from detlab.core.prescription import Outcome, Trial, next_trials, result
from detlab.core.results import FixResult

Oracle = Callable[[frozenset[str]], bool]


def search(order: list[str], oracle: Oracle, max_trials: int = 20,
           fails: Oracle = lambda s: False) -> tuple[list[list[Trial]], dict[str, Any]]:
    """Run the search to its end (a set `fails` says yes to has a run that fails); returns its rounds and result."""
    trials: list[Trial] = []
    outcomes: list[Outcome | None] = []
    rounds = []
    while batch := next_trials(trials, outcomes, order, max_trials):
        rounds.append(batch)
        for trial in batch:
            trials.append(trial)
            if fails(frozenset(trial.knobs)):
                outcomes.append(Outcome(0, 2, failed="run 9 failed: rank 1 exited 1"))
                continue
            ok = oracle(frozenset(trial.knobs))
            outcomes.append(Outcome(identical=2 if ok else 1, repeats=2, first_divergent_step=None if ok else 3,
                                    cost=0.1 * len(trial.knobs), cost_interval=[0.0, 0.2], within_noise=True))
    bodies = [{"name": "+".join(t.knobs) or "base"} for t in trials]
    out = result(trials=trials, outcomes=outcomes, bodies=bodies, order=order, skipped=[], max_trials=max_trials,
                 stack="cpu")
    FixResult.model_validate(out)  # every key the search writes is declared (the suite runs strict)
    return rounds, out


def test_a_reproducible_base_is_already_and_runs_nothing_else() -> None:
    rounds, out = search(["a", "b"], lambda s: True)
    assert [[t.knobs for t in r] for r in rounds] == [[()]]
    assert out["verdict"] == "already" and out["prescription"]["knobs"] == []


def test_candidates_are_cumulative_cheapest_first_and_the_last_knob_needs_no_extra_run() -> None:
    rounds, out = search(["a", "b", "c"], lambda s: "b" in s)
    assert [[t.knobs for t in r] for r in rounds] == [[()], [("a",)], [("a", "b")], [("b",)]]
    assert out["verdict"] == "found"
    assert out["prescription"]["knobs"] == ["b"]
    # b's evidence is the base, run already: dropping b from {b} runs nothing new
    assert out["necessary"] == {"b": {"trial": 0, "knobs": [], "reproducible": [1, 2], "first_divergent_step": 3,
                                      "failed": None}}
    assert out["unnecessary"] == {"a": {"trial": 3, "knobs": ["b"]}}
    assert {"knob": "c", "reason": "not needed: a cheaper candidate was reproducible"} in out["not_tried"]


def test_a_knob_that_does_nothing_is_never_in_the_prescription() -> None:
    for needed in ({"b"}, {"c"}, {"a", "c"}, {"b", "d"}):
        _, out = search(["a", "b", "c", "d"], lambda s, n=needed: n <= s)  # type: ignore[misc]
        assert out["verdict"] == "found"
        assert set(out["prescription"]["knobs"]) == needed, needed
        assert set(out["necessary"]) == needed
        for knob, evidence in out["necessary"].items():  # each kept knob: a trial without it that diverged
            assert knob not in evidence["knobs"] and evidence["reproducible"] == [1, 2]


def test_a_single_knob_fix_takes_two_rounds() -> None:
    rounds, out = search(["deterministic-algorithms", "threads-1"], lambda s: "deterministic-algorithms" in s)
    assert len(rounds) == 2 and out["verdict"] == "found"
    assert out["necessary"]["deterministic-algorithms"]["trial"] == 0  # the base is its evidence
    assert out["prescription"]["trial"] == 1


def test_the_budget_stops_the_search_with_none_and_lists_what_was_not_tried() -> None:
    rounds, out = search(["a", "b"], lambda s: "b" in s, max_trials=1)
    assert len(rounds) == 1 and out["verdict"] == "none"
    assert out["closest"]["index"] == 0
    assert out["not_tried"] == [{"knob": "a", "reason": "budget: max_trials reached"},
                                {"knob": "b", "reason": "budget: max_trials reached"}]


def test_nothing_works_names_the_closest_candidate() -> None:
    trials = [Trial((), "base"), Trial(("a",), "candidate"), Trial(("a", "b"), "candidate")]
    outcomes: list[Outcome | None] = [Outcome(1, 3, 0), Outcome(2, 3, 5), Outcome(1, 3, 9)]
    assert next_trials(trials, outcomes, ["a", "b"], 10) == []
    out = result(trials=trials, outcomes=outcomes, bodies=[{"name": "x"}] * 3, order=["a", "b"], skipped=[],
                 max_trials=10, stack="cpu")
    assert out["verdict"] == "none" and out["closest"]["knobs"] == ["a"]


def test_a_running_trial_holds_the_next_round_and_the_verdict() -> None:
    trials = [Trial((), "base")]
    assert next_trials(trials, [None], ["a"], 5) == []
    out = result(trials=trials, outcomes=[None], bodies=[{"name": "b"}], order=["a"], skipped=[], max_trials=5,
                 stack=None)
    assert out["verdict"] is None and out["trials"][0]["reproducible"] is None


def test_a_failed_trial_is_not_reproducible() -> None:
    assert not Outcome(2, 2, failed="rank 0 exited 1").reproducible
    assert not Outcome(0, 0).reproducible


def test_k_of_n_counts_every_repeat_and_the_first_as_itself() -> None:
    assert Outcome(3, 3).reproducible
    assert not Outcome(2, 3).reproducible  # one repeat parted (or was incomplete): it stays in n
    assert not Outcome(1, 1).reproducible  # one repeat shows nothing


def test_on_cpu_only_deterministic_algorithms_and_threads_are_tried() -> None:
    base = configs.resolve({"preset": "default", "threads": 2})
    order, skipped = knobs.plan(base, knobs.Stack("cpu", 1))
    assert order == ["deterministic-algorithms", "threads-1"]
    assert {s["knob"] for s in skipped} == {k.name for k in knobs.CATALOGUE} - set(order)
    order, _ = knobs.plan(base, knobs.Stack("cuda", 1))
    assert "nccl-proto-simple" not in order and "threads-1" not in order and "tf32-off" in order
    order, _ = knobs.plan(configs.preset("torch-deterministic"), knobs.Stack("cuda", 2))
    assert "deterministic-algorithms" not in order and "nccl-one-channel" in order


def test_knobs_apply_to_the_base_config() -> None:
    base = configs.resolve({"preset": "default", "threads": 2, "env": {"NCCL_DEBUG": "WARN"}})
    body = knobs.apply(base, ["deterministic-algorithms", "threads-1", "nccl-one-channel"])
    assert body.torch.deterministic_algorithms and body.threads == 1 and body.env["NCCL_MAX_NCHANNELS"] == "1"
    assert body.env["NCCL_DEBUG"] == "WARN" and body.name.startswith("fix.")
    assert knobs.apply(base, []).name == "fix.base"
    long = knobs.apply(base, [k.name for k in knobs.CATALOGUE])
    assert configs.NAME_RE.fullmatch(long.name)


def test_the_summary_says_the_prescription_and_each_knobs_evidence() -> None:
    _, out = search(["deterministic-algorithms", "threads-1"], lambda s: "deterministic-algorithms" in s)
    lines = FixResult.model_validate(out).summary(job_id=7, status="succeeded", verdict="found", url="u")
    assert lines[:3] == ["job 7 succeeded: fix verdict found on cpu",
                         "  prescription: deterministic-algorithms — 2 of 2 repeats identical to the first, 10.0% "
                         "slower than the base (within noise)",
                         "  deterministic-algorithms: needed — without it, trial 0: 1 of 2 repeats identical to the "
                         "first, first divergent step 3"]
    _, out = search(["a"], lambda s: False, max_trials=1)
    lines = FixResult.model_validate(out).summary(job_id=7, status="succeeded", verdict="none", url="u")
    assert lines[1] == "  closest: the base — 1 of 2 repeats identical to the first, first divergent step 3"


def test_a_one_knob_fix_found_last_costs_one_trial_after_the_candidates() -> None:
    """scatter on the H200: three knobs that do nothing, then deterministic algorithms. The last knob is needed (the
    candidate before it was not reproducible); it alone is tried next, reproducible: no drop trial per knob."""
    order = ["cudnn-benchmark-off", "cudnn-deterministic", "cublas-workspace", "deterministic-algorithms"]
    rounds, out = search(order, lambda s: "deterministic-algorithms" in s)
    assert [t.knobs for r in rounds for t in r] == [(), *(tuple(order[:i]) for i in range(1, 5)),
                                                   ("deterministic-algorithms",)]
    assert out["prescription"]["knobs"] == ["deterministic-algorithms"]
    assert out["necessary"]["deterministic-algorithms"]["trial"] == 0
    assert out["unnecessary"] == {k: {"trial": 5, "knobs": ["deterministic-algorithms"]} for k in order[:3]}
    skipped = [n for n in out["not_tried"] if n.get("knobs") is not None]
    assert [(n["knob"], n["knobs"]) for n in skipped] == [(k, [o for o in order if o != k]) for k in order[:3]]
    assert all("cannot be the cheapest answer" in n["reason"] for n in skipped)


def test_the_budget_cuts_minimality_short_and_says_what_it_did_not_run() -> None:
    order = ["a", "b", "c"]
    rounds, out = search(order, lambda s: "c" in s, max_trials=4)  # base, a, ab, abc: no trial left for {c}
    assert out["verdict"] == "found" and out["prescription"]["knobs"] == ["a", "b", "c"]
    assert out["necessary"]["c"]["trial"] == 2
    assert out["necessary"]["a"] == {"trial": None, "unchecked": "budget: max_trials reached"}
    assert {"knob": None, "knobs": ["c"], "reason": "budget: max_trials reached (the next trial of minimality)"} \
        in out["not_tried"]
    assert {"knob": "b", "reason": "budget: max_trials reached before it was checked: kept"} in out["not_tried"]


def test_a_failed_base_stops_the_search_incomplete() -> None:
    """A run that failed shows nothing about reproducibility: no candidate is run on the strength of it."""
    rounds, out = search(["a", "b"], lambda s: "b" in s, fails=lambda s: not s)
    assert [[t.knobs for t in r] for r in rounds] == [[()]]
    assert out["verdict"] == "incomplete" and out["prescription"] is None and out["closest"] is None
    assert out["failed"]["index"] == 0 and out["failed"]["failed"] == "run 9 failed: rank 1 exited 1"
    assert [n for n in out["not_tried"] if n["knob"] in ("a", "b")] == [
        {"knob": "a", "reason": "the search stopped at trial 0"},
        {"knob": "b", "reason": "the search stopped at trial 0"}]


def test_a_failed_candidate_stops_the_search_before_any_knob_is_judged() -> None:
    rounds, out = search(["a", "b"], lambda s: "b" in s, fails=lambda s: s == {"a"})
    assert [t.knobs for r in rounds for t in r] == [(), ("a",)]
    assert out["verdict"] == "incomplete" and out["necessary"] == {} and out["failed"]["knobs"] == ["a"]
    lines = FixResult.model_validate(out).summary(job_id=7, status="failed", verdict="incomplete", url="u")
    assert lines[:2] == ["job 7 failed: fix verdict incomplete on cpu",
                         "  stopped at trial 1 (a): run 9 failed: rank 1 exited 1"]
    assert FixResult.model_validate(out).gate(check=True, max_cost=None, verdict="incomplete") == [
        "the search stopped at trial 1: run 9 failed: rank 1 exited 1"]


def test_a_failed_drop_trial_keeps_the_found_set_and_no_knob_is_called_needed_on_it() -> None:
    """base, a, a+b (reproducible), then b alone fails: b is needed (trial 1, a alone, diverged), a is kept unchecked
    — a failed run is no evidence that a set without a is not reproducible."""
    rounds, out = search(["a", "b"], lambda s: "b" in s, fails=lambda s: s == {"b"})
    assert [t.knobs for r in rounds for t in r] == [(), ("a",), ("a", "b"), ("b",)]
    assert out["verdict"] == "found" and out["prescription"]["knobs"] == ["a", "b"]
    assert out["necessary"]["b"]["trial"] == 1
    assert out["necessary"]["a"] == {"trial": None, "unchecked": "the search stopped at trial 3"}
    assert out["failed"]["index"] == 3
