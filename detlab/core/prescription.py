"""The search of `detlab fix`, as pure functions: which trials to run next from the outcomes so far, and the result
(the cheapest reproducible config, each of its knobs with the run that shows it is needed).

The search, in rounds:
  0. the base config alone: reproducible → verdict `already`;
  1. candidates, cumulative in the catalogue's order (cheapest first): the base + the first knob, + the first two,
     … one per round, until one is reproducible or the budget (max_trials, the base included) is spent;
  2. minimality, cumulative cheapest-first again (`minimize`): the found set's last knob is necessary (the candidate
     before it was not reproducible); then that knob alone, + the cheapest other knob, … until reproducible, which
     shows the knob added last necessary and the rest unneeded, and so on. A knob stays only when a trial without
     it was not reproducible — that trial is its evidence. A set already run (the base, an earlier candidate) is not
     run again, and a knob that a reproducible trial without it shows unneeded gets no drop trial of its own: such
     a trial cannot be the answer (a set with that knob is dearer), and `not_tried` lists it with why.
A trial's `reproducible` is [k, n]: n its repeats (every run of the trial), k those bit-identical to its first repeat,
the first counting as itself (ARCHITECTURE: "the share of repeats identical to its first repeat"). A trial is
reproducible when k == n ≥ 2 and none of its runs failed: a repeat that is incomplete or incomparable is not identical,
so it keeps the trial from reproducible rather than being left out of n.

A trial whose run failed or was cancelled shows nothing about reproducibility (the workload raised, a rank died):
the search stops there and draws nothing from it. Before a reproducible candidate the verdict is `incomplete`, with
the failed trial; in minimality the reproducible set found stands, and the knobs not yet checked are kept, each
marked with the trial the search stopped at.

Pure: no database, no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["base", "candidate", "drop"]


@dataclass(frozen=True)
class Trial:
    """A config run with repeats: the base with these knobs; `dropped` names the knob a drop trial leaves out."""

    knobs: tuple[str, ...]
    role: Role
    dropped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"knobs": list(self.knobs), "role": self.role, "dropped": self.dropped}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trial:
        return cls(tuple(data["knobs"]), data["role"], data.get("dropped"))


@dataclass(frozen=True)
class Outcome:
    """What a trial's runs showed: of its `repeats`, how many are `identical` to the first (the first included),
    where they first parted, cost against the base (bootstrap interval), and the error of a run that failed."""

    identical: int
    repeats: int
    first_divergent_step: int | None = None
    cost: float | None = None
    cost_interval: list[float] | None = None
    within_noise: bool | None = None
    failed: str | None = None

    @property
    def reproducible(self) -> bool:
        return self.failed is None and self.repeats >= 2 and self.identical == self.repeats

    def closeness(self) -> tuple[float, int]:
        """How near reproducible: the share of identical repeats, then how late they part."""
        if self.failed is not None or not self.repeats:
            return (-1.0, -1)
        step = self.first_divergent_step if self.first_divergent_step is not None else 1 << 30
        return (self.identical / self.repeats, step)


Lookup = Callable[[tuple[str, ...]], tuple[int, Outcome] | None]


def _lookup(trials: list[Trial], outcomes: list[Outcome | None]) -> Lookup:
    """The first finished trial with this set of knobs (in any order), with its index."""
    def find(knobs: tuple[str, ...]) -> tuple[int, Outcome] | None:
        for i, (trial, outcome) in enumerate(zip(trials, outcomes, strict=True)):
            if set(trial.knobs) == set(knobs) and outcome is not None:
                return i, outcome
        return None

    return find


def _found(trials: list[Trial], outcomes: list[Outcome | None]) -> int | None:
    return next((i for i, (t, o) in enumerate(zip(trials, outcomes, strict=True))
                 if t.role == "candidate" and o is not None and o.reproducible), None)


@dataclass
class Minimal:
    """Where minimality stands: the knobs kept so far (a reproducible set that ran), each checked knob's evidence
    (None: not checked yet), the knobs shown unneeded (by the trial reproducible without them), the next trial."""

    knobs: list[str]
    necessary: dict[str, dict[str, Any] | None]
    dropped: dict[str, int]
    next: Trial | None


def _evidence(index: int, knobs: tuple[str, ...], outcome: Outcome) -> dict[str, Any]:
    return {"trial": index, "knobs": list(knobs), "reproducible": [outcome.identical, outcome.repeats],
            "first_divergent_step": outcome.first_divergent_step, "failed": outcome.failed}


def minimize(found: tuple[str, ...], find: Lookup) -> Minimal:
    """The found set cut to the knobs it needs, cheapest first and cumulative again: with `need` the knobs shown
    necessary and `rest` those not yet decided (need ∪ rest reproducible, it ran), try need + rest[:i] for
    i = 0, 1, …; the first reproducible one, at i, shows rest[i−1] necessary (need + rest[:i−1] was not: its
    evidence) and rest[i:] unneeded — none of them gets a drop trial of its own. At i = 0 the search is over.

    A one-knob fix (the last knob of the found set: the candidate before it was not reproducible) costs one trial
    (that knob alone), where dropping each knob in turn costs one per knob of the set."""
    need: list[str] = []
    rest = list(found)
    necessary: dict[str, dict[str, Any] | None] = {}
    dropped: dict[str, int] = {}

    def ordered(names: set[str]) -> tuple[str, ...]:
        return tuple(k for k in found if k in names)

    while True:
        at, index = len(rest), -1
        for i in range(len(rest) + 1):
            known = find(ordered({*need, *rest[:i]}))
            if known is None:
                left_out = [k for k in found if k not in need and k not in rest[:i]]
                return Minimal(list(ordered({*need, *rest})), {**necessary, **{k: None for k in rest}}, dropped,
                               Trial(ordered({*need, *rest[:i]}), "drop", ", ".join(left_out)))
            if known[1].failed is not None:  # nothing to learn from it: what is left stays, unchecked
                return Minimal(list(ordered({*need, *rest})), {**necessary, **{k: None for k in rest}}, dropped,
                               None)
            if known[1].reproducible or i == len(rest):  # need ∪ rest is reproducible: it is the found set or a
                at, index = i, known[0]                  # trial of an earlier pass that was
                break
        for knob in rest[at:]:
            dropped[knob] = index
        if at == 0:
            break
        knob = rest[at - 1]
        without = ordered({*need, *rest[:at - 1]})
        before = find(without)
        assert before is not None  # tried at i = at − 1 in the loop above
        necessary[knob] = _evidence(before[0], without, before[1])
        need.append(knob)
        rest = rest[:at - 1]
    kept = ordered(set(need))
    for knob in need:  # the most direct evidence where it ran: the kept set without just this knob
        direct = find(tuple(k for k in kept if k != knob))
        if direct is not None and direct[1].failed is None and not direct[1].reproducible:
            necessary[knob] = _evidence(direct[0], tuple(k for k in kept if k != knob), direct[1])
    return Minimal(list(kept), {k: necessary[k] for k in kept}, dropped, None)


def next_trials(trials: list[Trial], outcomes: list[Outcome | None], order: list[str], max_trials: int) -> list[Trial]:
    """The next round: the trials to run now, or none when the search is over (or a trial is still running)."""
    if not trials:
        return [Trial((), "base")]
    if any(o is None or o.failed is not None for o in outcomes) or len(trials) >= max_trials:
        return []
    base = outcomes[0]
    if base is not None and base.reproducible:
        return []
    found = _found(trials, outcomes)
    if found is None:
        tried = sum(t.role == "candidate" for t in trials)
        return [Trial(tuple(order[:tried + 1]), "candidate")] if tried < len(order) else []
    step = minimize(trials[found].knobs, _lookup(trials, outcomes)).next
    return [step] if step else []


def _row(index: int, trial: Trial, outcome: Outcome | None, name: str) -> dict[str, Any]:
    row: dict[str, Any] = {"index": index, "config": name, **trial.to_json(), "reproducible": None,
                           "first_divergent_step": None, "cost": None, "cost_interval": None, "within_noise": None,
                           "failed": None}
    if outcome is not None:
        row.update(reproducible=[outcome.identical, outcome.repeats],
                   first_divergent_step=outcome.first_divergent_step, cost=outcome.cost,
                   cost_interval=outcome.cost_interval, within_noise=outcome.within_noise, failed=outcome.failed)
    return row


def _prescribed(index: int, trial: Trial, outcome: Outcome, body: dict[str, Any]) -> dict[str, Any]:
    return {"trial": index, "config": body, "knobs": list(trial.knobs),
            "reproducible": [outcome.identical, outcome.repeats], "cost": outcome.cost,
            "cost_interval": outcome.cost_interval, "within_noise": outcome.within_noise}


def result(*, trials: list[Trial], outcomes: list[Outcome | None], bodies: list[dict[str, Any]], order: list[str],
           skipped: list[dict[str, str]], max_trials: int, stack: str | None) -> dict[str, Any]:
    """The fix job's result as it stands: verdict (None while the search runs), the prescription, each kept knob's
    evidence, every trial, what was not tried with why, and the trial whose failed run stopped the search."""
    rows = [_row(i, t, o, str(b.get("name"))) for i, (t, o, b) in enumerate(zip(trials, outcomes, bodies,
                                                                                    strict=True))]
    out: dict[str, Any] = {"verdict": None, "stack": stack, "max_trials": max_trials, "order": order,
                           "prescription": None, "closest": None, "necessary": {}, "unnecessary": {},
                           "trials": rows, "not_tried": list(skipped), "failed": None}
    done = bool(trials) and all(o is not None for o in outcomes) and not next_trials(trials, outcomes, order,
                                                                                       max_trials)
    used = {k for t in trials for k in t.knobs}
    if not done:
        return out
    base = outcomes[0]
    assert base is not None
    found = _found(trials, outcomes)
    stopped = next((i for i, o in enumerate(outcomes) if o is not None and o.failed is not None), None)
    if stopped is not None:
        out["failed"] = rows[stopped]
    if found is None and stopped is not None:
        out["verdict"] = "incomplete"
        out["not_tried"] += [{"knob": k, "reason": f"the search stopped at trial {stopped}"}
                             for k in order if k not in used]
        return out
    if base.reproducible:
        out["verdict"] = "already"
        out["prescription"] = _prescribed(0, trials[0], base, bodies[0])
        out["not_tried"] += [{"knob": k, "reason": "not needed: the base config is reproducible"} for k in order]
        return out
    if found is None:
        out["verdict"] = "none"
        best = max(range(len(trials)), key=lambda i: (outcomes[i].closeness(), -i))  # type: ignore[union-attr]
        out["closest"] = rows[best]
        reason = "budget: max_trials reached" if len(trials) >= max_trials else "never reached"
        out["not_tried"] += [{"knob": k, "reason": reason} for k in order if k not in used]
        return out
    find = _lookup(trials, outcomes)
    state = minimize(trials[found].knobs, find)
    final = find(tuple(state.knobs))
    index, outcome = final if final is not None else (found, outcomes[found])
    assert outcome is not None
    out["verdict"] = "found"
    out["prescription"] = _prescribed(index, trials[index], outcome, bodies[index])
    unchecked_why = "budget: max_trials reached" if stopped is None else f"the search stopped at trial {stopped}"
    out["necessary"] = {k: v if v is not None else {"trial": None, "unchecked": unchecked_why}
                        for k, v in state.necessary.items()}
    out["unnecessary"] = {k: {"trial": i, "knobs": list(trials[i].knobs)} for k, i in state.dropped.items()}
    out["not_tried"] += [{"knob": k, "reason": "not needed: a cheaper candidate was reproducible"}
                         for k in order if k not in used]
    found_set = trials[found].knobs
    for knob, i in state.dropped.items():
        drop = tuple(k for k in found_set if k != knob)
        if find(drop) is None:
            out["not_tried"].append({"knob": knob, "knobs": list(drop), "reason": (
                f"the found set without {knob}, not run: trial {i} ({', '.join(trials[i].knobs) or 'the base'}) is "
                f"reproducible without {knob}, so a set with it cannot be the cheapest answer")})
    unchecked = [k for k, v in state.necessary.items() if v is None]
    if state.next is not None:  # the budget cut minimality short: what it would have run next, and what stays
        out["not_tried"].append({"knob": None, "knobs": list(state.next.knobs),
                                 "reason": "budget: max_trials reached (the next trial of minimality)"})
        out["not_tried"] += [{"knob": k, "reason": "budget: max_trials reached before it was checked: kept"}
                             for k in unchecked]
    return out
