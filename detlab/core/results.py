"""The results the core computes, typed: a comparison of two runs (detlab.core.compare) and a train job's result,
a collective job's, a diagnosis job's, a bisect's. The server stores them as JSON and serves these models; the CLI
reads them back and says what they mean (summary, gate).

Rows whose keys vary by source (a collective cell, an effective-config flag) stay dicts."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# A key a model does not declare is dropped (a stored result from before a key was removed still loads); the test
# suite sets DETLAB_STRICT_RESULTS=1 (tests/conftest.py), so that a key a report writes undeclared fails there.
EXTRA: Literal["ignore", "forbid"] = "forbid" if os.environ.get("DETLAB_STRICT_RESULTS") == "1" else "ignore"


class Result(BaseModel):
    """A result or a row of one. Stored results (a JSON column) load from before a key was added: every key added
    later has a default. A key a model does not know (one an older report wrote, since dropped) is left out."""

    model_config = ConfigDict(extra=EXTRA)


class KeyDiff(Result):
    """A key whose value differs between A and B (a config's dotted key, a log fact)."""

    key: str
    a: Any
    b: Any


class ThroughputRow(Result):
    config_index: int
    name: str
    world_size: int | None = None  # the config's runs' (results stored before it was recorded lack it)
    samples_per_s: float | None
    spread: list[float] | None
    step_time_ms_median: float | None
    runs: int
    cost: float | None
    cost_interval: list[float] | None = None  # bootstrap 95 % interval of the cost
    within_noise: bool | None = None  # the interval spans 0
    cost_text: str = ""


class ReproducibilityRow(Result):
    config_index: int
    name: str
    repeats: int
    recorded: int
    comparable: int = 0  # repeats compared with the first that were identical or diverged
    identical_to_first: int
    incomplete: int = 0
    incomparable: int = 0
    rate: float | None  # identical_to_first / comparable
    first_divergent_step: int | None = None  # the earliest step a repeat parted from the first


class StepDiff(Result):
    """One step, or (thinned) the bucket of steps step..to_step: the most tensors differing at one of
    them and how many of its steps differ."""

    step: int
    tensors_differing: int | None
    to_step: int | None = None
    steps_differing: int | None = None
    steps: int | None = None


class Downsampled(Result):
    """How a comparison's per-step series were thinned: ask for a step window to see it in full."""

    steps: int
    points: int
    steps_per_point: int


class StepWindow(Result):
    from_step: int
    to_step: int


class DivergenceMap(Result):
    """Where the compared runs' per-tensor digests differ, tensor × step (detlab.core.divergence_map): only
    differing cells, tensors and steps capped (`truncated`, `note`); cells are [step, index into tensors,
    index into rank_sets]; rank sets are empty in rank-consensus mode."""

    mode: str
    steps: list[int]
    tensors: list[str]
    rank_sets: list[list[int]]
    cells: list[tuple[int, int, int]]
    steps_differing: int
    tensors_differing: int
    truncated: bool
    note: str | None = None


class DriftEstimate(Result):
    """How far the compared runs drift apart (detlab.core.drift): per sampled step the estimate of ‖A−B‖/‖A‖
    (`points`, the worst rank; `ranks` per rank where they differ) and |Δloss|, the dtype's one-ulp relative
    rounding level, and the verdict text; `available` false with `reason` when a run recorded no statistics."""

    available: bool
    reason: str | None = None
    version: str | None = None
    k: int | None = None
    relative_error: float | None = None
    points: list[tuple[int, float]] = Field(default_factory=list)
    ranks: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)
    loss_delta: list[tuple[int, float]] = Field(default_factory=list)
    dtype: str | None = None
    rounding_level: float | None = None
    max: float | None = None
    max_step: int | None = None
    sampled: bool = False
    verdict: str | None = None


class EnvFact(Result):
    key: str
    a: Any
    b: Any
    differs: bool


class CollectiveCalls(Result):
    """The runs' collective calls compared (detlab.core.collective_calls): `status` identical | differs |
    not-recorded | incomparable; `first`: the first call whose output differs, its cause (reduction-order,
    carried, calls-differ) and, for reduction-order, what the NCCL logs show NCCL chose at its size."""

    status: str
    calls_compared: int
    first: dict[str, Any] | None = None
    text: str | None = None


class JobResult(Result):
    """A job's result as `detlab submit --wait` reads it back: what it says in a line or more, and why it fails
    `--check` / `--max-cost` (nothing: it passes). A cost fails only when its whole 95 % interval lies above the
    limit: noise never fails a gate."""

    def summary(self, *, job_id: int, status: str, verdict: str | None, url: str) -> list[str]:
        return [f"job {job_id} {status}: {verdict or 'nothing measured'}; {url}"]

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        return []


class ReplicaDisagreement(Result):
    """Within one run: the first step where ranks that must hold bit-equal copies of a tensor do not
    (detlab.core.shards), with each rank's digest."""

    run: int
    step: int
    tensor: str
    ranks: dict[int, str]


class PreflightNote(Result):
    """A preflight finding recorded in run A's or B's processes (detlab.core.preflight), with the ranks it was found
    on."""

    run: Literal["a", "b"]
    ranks: list[int]
    rule: str
    matched: str
    reason: str
    fix: str
    source: str

    def text(self) -> str:
        ranks = ", ".join(map(str, self.ranks))
        return f"preflight, run {self.run.upper()} (rank {ranks}): {self.matched} — {self.reason}. Fix: {self.fix}"


class DivergentComponent(Result):
    """The first part of the training state that differs at a step (detlab.core.components), in causal order:
    batch, rng, loss, gradients, parameters, optimizer, buffers."""

    component: str
    tensors: list[str] = Field(default_factory=list)  # the entries within it: tensors, generators, hyperparameters
    components: list[str] = Field(default_factory=list)  # every component that differs there, in causal order
    text: str  # `optimizer: fc1.weight.exp_avg`
    compared: list[str] = Field(default_factory=list)  # of batch, rng, optimizer: those both runs recorded there


class ResumeCheck(Result):
    """A resumed recording's first restore: whether the restored state equals the state saved at that step (None:
    the first process did not record that step) and which components differ."""

    run: int
    step: int
    exact: bool | None
    components: list[str] = Field(default_factory=list)
    tensors: list[str] = Field(default_factory=list)
    text: str | None = None
    restores: int = 1
    ranks: list[int] = Field(default_factory=list)


class RunComparison(Result):
    """Two runs compared (detlab.core.compare.compare_runs): the verdict, where they part, what is missing, how far
    they drift apart and what their collective calls say."""

    verdict: str | None
    reason: str | None
    mode: str | None = None
    run_a: int | None = None
    run_b: int | None = None
    first_divergent_step: int | None = None
    first_divergent_tensors: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    steps_differing: int = 0
    steps_compared: int = 0
    per_step: list[StepDiff] = Field(default_factory=list)
    loss: dict[str, list[tuple[int, float | None]]] = Field(default_factory=dict)
    missing: list[str] = Field(default_factory=list)
    # Replicas within either run that disagree (absent from results stored before they were checked)
    replica_disagreements: list[ReplicaDisagreement] = Field(default_factory=list)
    drift: DriftEstimate | None = None  # absent from results stored before drift was estimated
    collectives: CollectiveCalls | None = None  # null: neither run recorded its collective calls
    # Known-broken or no-op settings the runs' processes ran with (recorded by the SDK and the built-in ranks)
    preflight: list[PreflightNote] = Field(default_factory=list)


    # The first part of the state that differs at the first divergent step (absent from older results).
    first_divergent_component: DivergentComponent | None = None
    resume: ResumeCheck | None = None  # null: neither run was resumed from a recorded step

    def stored(self) -> dict[str, Any]:
        """As a report stores it (JSON: tuples as lists, NaN as null): the keys the comparison set, nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)


class Comparison(RunComparison):
    """Two runs of the server compared: the comparison, with where they part tensor × step, how their configs and
    environments differ, and how its per-step series were thinned."""

    divergence_map: DivergenceMap | None = None  # diverged pairs only
    config_diff: list[KeyDiff]
    environment: list[EnvFact] = Field(default_factory=list)
    downsampled: Downsampled | None = None  # per_step and loss thinned (null: in full)


class TrainResult(Comparison, JobResult):
    """GET /jobs/{id}/comparison: the verdict between the first runs of the first two configs, throughput
    and cost per config, reproducibility of repeats. A single-config job has no two-run keys (mode … missing,
    environment): they are absent, not null."""

    throughput: list[ThroughputRow]
    reproducibility: list[ReproducibilityRow]
    effective_mismatches: list[dict[str, Any]]
    window: StepWindow | None = None  # present when a step window was asked for

    def summary(self, *, job_id: int, status: str, verdict: str | None, url: str) -> list[str]:
        lines = [f"job {job_id} {status}: verdict {self.verdict}, first divergent step {self.first_divergent_step}, "
                 f"tensors {self.first_divergent_tensors}"]
        lines += [f"  missing: {missing}" for missing in self.missing]
        lines += [f"  config {row.config_index} {row.name}: cost {row.cost_text or '—'}" for row in self.throughput]
        return lines

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        failures = []
        if check and self.verdict is not None:  # two configs: their pair
            if self.verdict != "identical":
                failures.append(f"verdict {self.verdict}" + (f": {self.reason}" if self.reason else ""))
        elif check:  # one config: its repeats
            rows = self.reproducibility or [ReproducibilityRow(config_index=0, name="?", repeats=0, recorded=0,
                                                               identical_to_first=0, rate=None)]
            for row in rows:
                if not row.comparable:
                    failures.append(f"config {row.config_index} {row.name}: no comparable repeats")
                elif row.identical_to_first != row.comparable:
                    failures.append(f"config {row.config_index} {row.name}: {row.identical_to_first} of "
                                    f"{row.comparable} comparable repeats identical to the first")
        if max_cost is not None:
            for tp in self.throughput:
                if tp.config_index == 0:
                    continue
                if tp.cost_interval is None:
                    failures.append(f"config {tp.config_index} {tp.name}: cost {tp.cost_text}; no interval to "
                                    "hold against --max-cost")
                elif tp.cost_interval[0] * 100 > max_cost:
                    failures.append(f"config {tp.config_index} {tp.name}: {tp.cost_text}, above --max-cost "
                                    f"{max_cost:g}%")
        return failures


class CollectiveConfig(Result):
    index: int
    name: str
    env: dict[str, Any]


class EqualityRow(Result):
    op: str
    dtype: str
    bytes: int
    equal: list[list[bool | None]]


class CollectiveResult(JobResult):
    """GET /jobs/{id}/collective: per config × (op, dtype, size) cells, cross-config equality, effective
    settings from NCCL/RCCL logs, and the nccl-tests-style export."""

    world_size: int
    configs: list[CollectiveConfig]
    cells: list[dict[str, Any]]
    equality: list[EqualityRow]
    effective: list[dict[str, Any]]
    logs: list[dict[str, Any]]
    note: str | None
    export: dict[str, Any]

    def summary(self, *, job_id: int, status: str, verdict: str | None, url: str) -> list[str]:
        good = sum(bool(c.get("reproducible")) for c in self.cells)
        return [f"job {job_id} {status}: {good}/{len(self.cells)} cells reproducible; {url}"]

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        bad = [c for c in self.cells if not c.get("reproducible")]
        return [f"{len(bad)} of {len(self.cells)} cells not reproducible"] if check and (bad or not self.cells) else []


class InvarianceRow(Result):
    op: str
    dtype: str
    batch_size: int
    invariant: bool
    max_ulp: int


class FirstBreak(Result):
    op: str
    dtype: str
    first_break: int | None


class ModelInvariance(Result):
    workload: str
    batch_sizes: list[int]
    invariant: bool
    first_module: str | None
    first_break: int | None


class AuditOp(Result):
    op: str
    count: int
    nondeterministic: bool | None
    evidence: str


class DiagnosisConfig(Result):
    """One config of a diagnosis job: where it ran and under which flags, and what it measured (the keys of
    its kind: results/summary/model for batch-invariance, ops/ineffective for op-audit)."""

    index: int
    label: str
    device: str | None
    tf32: bool | None = None
    torch_flags: dict[str, Any] | None = None
    threads: int | None = None
    results: list[InvarianceRow] | None = None
    summary: list[FirstBreak] | None = None
    model: ModelInvariance | None = None
    ops: list[AuditOp] | None = None
    ineffective: list[str] | None = None


class DiagnosisResult(JobResult):
    """GET /jobs/{id}/diagnosis: a batch-invariance or op-audit job's result, per config."""

    kind: str  # the job's kind (batch-invariance, op-audit)
    workload: str | None
    configs: list[DiagnosisConfig]

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        if check and verdict not in ("invariant", "deterministic"):
            return [f"verdict {verdict or 'none: nothing was measured'}"]
        return []


class BisectEntry(Result):
    """The first differing entry of a bisect's probe step in execution order (detlab.core.bisect.diagnose)."""

    entry: str
    index: int
    phase: str
    name: str
    call: int | None = None
    slot: str | None = None
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""
    ranks: list[int]
    explanation: str | None = None


class BisectModule(Result):
    """The first divergent module call of a bisect: introduced (its inputs matched) or carried (they did not)."""

    module: str
    shown: str
    type: str | None = None
    phase: str
    call: int | None = None
    entry: str
    ranks: list[int]
    differing_inputs: list[str] = Field(default_factory=list)
    differing_outputs: list[str] = Field(default_factory=list)
    inputs_matched: bool = True
    verdict: Literal["introduced", "carried"] | None = None
    own_state_differs: bool = False
    arose_in: list[str] | None = None  # set when the difference arose outside any module call


class ModuleRow(Result):
    """One module of the model's tree: depth, class, calls made at the probe step, and its status."""

    module: str
    shown: str
    depth: int
    type: str
    calls: int
    status: Literal["equal", "differs", "first difference", "not called"]
    state_differs: bool
    verdict: Literal["introduced", "carried"] | None = None
    differing: list[str]


class Diagnosis(Result):
    first: BisectEntry | None
    first_module: BisectModule | None
    state_differs: list[str]
    tree: list[ModuleRow]
    entries: int
    entries_differing: int
    summary: str


class BisectResult(JobResult):
    """GET /jobs/{id}/bisect: the replay's verdict (as a train pair's), and where in the step the runs part."""

    verdict: str
    reason: str | None
    mode: str | None = None
    run_a: int | None = None
    run_b: int | None = None
    first_divergent_step: int | None = None
    ranks: list[int] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    source: dict[str, Any]
    step: int
    diagnosis: Diagnosis | None
    config_diff: list[KeyDiff]
    environment: list[EnvFact] = Field(default_factory=list)


class FixTrial(Result):
    """One trial of a fix search: the base with these knobs (a drop trial: without `dropped`), run with repeats."""

    index: int
    config: str
    knobs: list[str]
    role: Literal["base", "candidate", "drop"]
    dropped: str | None = None
    # [k, n]: n repeats, k of them bit-identical to the first (the first counts as itself); null: running
    reproducible: list[int] | None
    first_divergent_step: int | None = None
    cost: float | None = None  # against the base (1 - samples/s ÷ the base's)
    cost_interval: list[float] | None = None  # bootstrap 95 %
    within_noise: bool | None = None
    failed: str | None = None  # a run of the trial failed: its error


class Prescription(Result):
    """The cheapest reproducible config the search found (the base itself when `already`)."""

    trial: int
    config: dict[str, Any]
    knobs: list[str]
    reproducible: list[int]  # [k, n] as FixTrial's: k == n
    cost: float | None = None
    cost_interval: list[float] | None = None
    within_noise: bool | None = None


class NotTried(Result):
    """A knob not tried (`knob`), or a trial not run (`knobs`: its set; with `knob`, the knob its run would have
    checked), with why."""

    knob: str | None
    reason: str
    knobs: list[str] | None = None

    def describe(self) -> str:
        trial = f"trial {', '.join(self.knobs) or 'the base'}" if self.knobs is not None else None
        return " — ".join(x for x in (self.knob, trial) if x)


def _k_of_n(k_n: list[int]) -> str:
    """How [k, n] reads everywhere (CLI, page): '2 of 3 repeats identical to the first'."""
    return f"{k_n[0]} of {k_n[1]} repeats identical to the first"


class FixResult(JobResult):
    """GET /jobs/{id}/fix: the verdict of a fix search (found | already | none | incomplete: a trial's run failed
    or was cancelled before any candidate was reproducible; null while it runs), the prescription, each kept knob's
    evidence (the trial without it, which was not reproducible), every trial, what was not tried, and the trial the
    search stopped at."""

    verdict: Literal["found", "already", "none", "incomplete"] | None
    stack: str | None = None
    max_trials: int
    order: list[str]  # the knobs tried on this stack, in the order they are added
    prescription: Prescription | None
    closest: FixTrial | None = None  # `none`: the trial nearest to reproducible
    necessary: dict[str, dict[str, Any]] = Field(default_factory=dict)
    unnecessary: dict[str, dict[str, Any]] = Field(default_factory=dict)
    trials: list[FixTrial]
    not_tried: list[NotTried] = Field(default_factory=list)
    failed: FixTrial | None = None

    def summary(self, *, job_id: int, status: str, verdict: str | None, url: str) -> list[str]:
        lines = [f"job {job_id} {status}: fix verdict {self.verdict or 'pending'} "
                 f"on {self.stack or 'an unknown stack'}"]
        if self.failed is not None:
            lines.append(f"  stopped at trial {self.failed.index} ({', '.join(self.failed.knobs) or 'the base'}): "
                         f"{self.failed.failed}")
        if self.prescription is not None:
            p = self.prescription
            cost = "not measured" if p.cost is None else \
                f"{abs(p.cost):.1%} {'faster' if p.cost < 0 else 'slower'}"
            lines.append(f"  prescription: {', '.join(p.knobs) or 'the base config as it is'} — "
                         f"{_k_of_n(p.reproducible)}, {cost} than the base"
                         f"{' (within noise)' if p.within_noise else ''}")
        if self.closest is not None:
            c, k_n = self.closest, self.closest.reproducible or [0, 0]
            shown = c.failed or _k_of_n(k_n)
            lines.append(f"  closest: {', '.join(c.knobs) or 'the base'} — {shown}, first divergent step "
                         f"{c.first_divergent_step}")
        for knob, ev in self.necessary.items():
            seen = ev.get("reproducible")
            why = ev.get("failed") or (f"{_k_of_n(seen)}, first divergent step {ev.get('first_divergent_step')}"
                                       if seen else None)
            lines.append(f"  {knob}: needed — without it, trial {ev['trial']}: {why}" if ev.get("trial") is not None
                         else f"  {knob}: kept, not checked ({ev.get('unchecked')})")
        lines += [f"  not tried: {n.describe()} ({n.reason})" for n in self.not_tried]
        return lines

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        if check and self.verdict == "incomplete" and self.failed is not None:
            return [f"the search stopped at trial {self.failed.index}: {self.failed.failed}"]
        return ["no reproducible config found"] if check and self.verdict == "none" else []


# The result each report path serves (GET /jobs/{id}/<path>; a job names its own: JobRead.result).
class ResumeResult(JobResult):
    """GET /jobs/{id}/resume: a workload run straight for `steps` steps against the same run stopped after `stop_at`,
    checkpointed and continued in a fresh process. `verdict`: exact (the two runs are identical), lost (they part:
    `comparison.first_divergent_component` names what the resume lost, `comparison.resume` whether the restored
    state matched the saved step), or the comparison's own verdict (incomplete, incomparable); null until both ran."""

    verdict: str | None
    steps: int
    stop_at: int
    lose: str | None = None  # the part of the state the job was asked to leave out of the restore (a check)
    straight_run: int | None = None
    resumed_run: int | None = None
    comparison: RunComparison | None = None

    def summary(self, *, job_id: int, status: str, verdict: str | None, url: str) -> list[str]:
        lines = [f"job {job_id} {status}: resume at step {self.stop_at} of {self.steps}: {self.verdict or 'pending'}"]
        cmp = self.comparison
        if cmp is not None and cmp.first_divergent_component is not None:
            lines.append(f"  first divergent step {cmp.first_divergent_step}, component "
                         f"{cmp.first_divergent_component.text}")
        if cmp is not None and cmp.resume is not None:
            said = {True: "matched the saved step", False: f"did not match the saved step ({cmp.resume.text})",
                    None: "not checked"}[cmp.resume.exact]
            lines.append(f"  restored state at step {cmp.resume.step}: {said}")
        lines += [f"  missing: {m}" for m in (cmp.missing if cmp else [])]
        return lines + [f"  {url}"]

    def gate(self, *, check: bool, max_cost: float | None, verdict: str | None) -> list[str]:
        if check and self.verdict is not None and self.verdict != "exact":
            what = self.comparison.first_divergent_component if self.comparison else None
            return [f"resume {self.verdict}" + (f": {what.text}" if what else "")]
        return []


RESULTS: dict[str, type[JobResult]] = {"comparison": TrainResult, "collective": CollectiveResult,
                                       "diagnosis": DiagnosisResult, "bisect": BisectResult,
                                       "fix": FixResult, "resume": ResumeResult}

