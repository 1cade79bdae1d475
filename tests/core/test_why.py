"""The why-report's checklist from crafted plain data: each item's pass / fail / not checked / not applicable."""

from __future__ import annotations

from typing import Any

import pytest

from detlab.core import commlog, why
from detlab.core.why import AuditJob, RunFacts, WhyInput


def env(rank: int, **kw: Any) -> dict[str, Any]:
    flags = {"deterministic_algorithms": False, "cudnn_deterministic": False, "cudnn_benchmark": False,
             "allow_tf32": False, "num_threads": 1}
    return {"rank": rank, "host": "node1", "device": "cpu (x86_64)", "driver": None, "cuda": None, "hip": None,
            "torch": "2.13.0", "nccl": None, "backend": "gloo", "effective_env": {"NCCL_DEBUG": "INFO"},
            "torch_flags": flags, **kw}


def run(side: str, world: int = 2, envs: list[dict[str, Any]] | None = None, **kw: Any) -> RunFacts:
    fields: dict[str, Any] = {"run_id": 1 if side == "A" else 2, "job_id": 7, "side": side,
                              "config_name": "default", "config_hash": "h-default", "config": {"env": {}},
                              "workload": "mlp", "world_size": world,
                              "envs": [env(r) for r in range(world)] if envs is None else envs}
    return RunFacts(**{**fields, **kw})


def log(*choices: tuple[str, int, str, str], **kw: Any) -> dict[str, Any]:
    parsed = commlog.empty_result()
    parsed.update(library="NCCL", version="2.28.9", versions=["2.28.9"], nranks=2, nchannels=2, **kw)
    parsed["choices"] = [{"op": op, "bytes": n, "algo": algo, "proto": proto, "channels": [0, 1]}
                         for op, n, algo, proto in choices]
    return parsed


RING = ("AllReduce", 1048576, "RING", "SIMPLE")
TREE = ("AllReduce", 1048576, "TREE", "SIMPLE")


def item(data: WhyInput, key: str) -> dict[str, Any]:
    return next(i for i in why.build(data)["items"] if i["key"] == key)


def pair(a: RunFacts | None = None, b: RunFacts | None = None, **kw: Any) -> WhyInput:
    return WhyInput(a=a or run("A"), b=b or run("B"), verdict=kw.pop("verdict", "diverged"), job_id=7, **kw)


# ---- the checklist as a whole ---------------------------------------------------------------------------

def test_the_items_come_in_the_debug_order_of_the_notes() -> None:
    report = why.build(pair())
    assert [(i["step"], i["key"]) for i in report["items"]] == [
        (1, "logs"), (2, "env"), (3, "ops"), (4, "stack"), (5, "batch"), (6, "data")]
    assert report["note"] is None and all(i["status"] in why.STATUSES for i in report["items"])


def test_a_pair_that_did_not_diverge_says_the_checklist_is_for_divergences() -> None:
    assert "this pair is identical" in why.build(pair(verdict="identical"))["note"]


# ---- 1. logs ----------------------------------------------------------------------------------------------

def test_gloo_without_logs_is_not_applicable_never_pass() -> None:
    found = item(pair(), "logs")
    assert (found["status"], found["found"]) == ("not-applicable", "not applicable (gloo: no NCCL)")


def test_nccl_runs_without_logs_are_not_checked() -> None:
    nccl = [env(r, backend="nccl", device="NVIDIA H200") for r in range(2)]
    found = item(pair(run("A", envs=nccl), run("B", envs=nccl)), "logs")
    assert found["status"] == "not-checked" and found["found"].startswith("no logs recorded")


def test_logs_of_one_run_only_are_not_checked() -> None:
    found = item(pair(run("A", logs={0: log(RING)})), "logs")
    assert found["status"] == "not-checked" and "no logs recorded for B" in found["found"]


def test_another_algorithm_for_a_size_fails_naming_the_size_and_rank() -> None:
    found = item(pair(run("A", logs={0: log(RING), 1: log(RING)}), run("B", logs={0: log(TREE), 1: log(TREE)})),
                 "logs")
    assert found["status"] == "fail"
    assert found["found"].startswith("AllReduce 1048576 B differs (A vs B, rank 0): RING/SIMPLE/0..1 vs TREE/SIMPLE")
    assert found["differences"] == 2 and found["evidence"][0]["href"] == "/api/v1/runs/1/logdiff/2"
    assert found["evidence"][1]["href"] == "/api/v1/runs/1/commlog/0"


def test_ranks_of_one_run_that_chose_differently_fail() -> None:
    found = item(pair(run("A", logs={0: log(RING), 1: log(TREE)}), run("B", logs={0: log(RING), 1: log(TREE)})),
                 "logs")
    assert found["status"] == "fail" and "across A's ranks" in found["found"]


def test_a_requested_algorithm_the_log_contradicts_fails() -> None:
    tree = {"env": {"NCCL_ALGO": "Tree"}}
    found = item(pair(run("A", config=tree, logs={0: log(RING)}), run("B", config=tree, logs={0: log(RING)})), "logs")
    assert found["status"] == "fail" and "NCCL_ALGO differs (A asked Tree)" in found["found"]


def test_the_same_choices_on_every_rank_pass() -> None:
    found = item(pair(run("A", logs={0: log(RING), 1: log(RING)}), run("B", logs={0: log(RING), 1: log(RING)})),
                 "logs")
    assert found["status"] == "pass" and "1 logged size(s) on 2 rank log(s)" in found["found"]


def test_logs_without_choices_are_not_checked() -> None:
    found = item(pair(run("A", logs={0: log()}), run("B", logs={0: log()})), "logs")
    assert found["status"] == "not-checked"


# ---- 2. env parity ---------------------------------------------------------------------------------------

def test_a_variable_that_differs_between_the_runs_fails_naming_it() -> None:
    b_envs = [env(r, effective_env={"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree"}) for r in range(2)]
    found = item(pair(b=run("B", envs=b_envs)), "env")
    assert found["status"] == "fail"
    assert found["found"] == "NCCL_ALGO differs (A vs B): unset vs Tree"
    assert found["evidence"][1]["href"] == "/api/v1/runs/2/envs"


def test_a_difference_the_configs_ask_for_is_the_experiment_not_a_failure() -> None:
    b_envs = [env(r, effective_env={"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Tree"}) for r in range(2)]
    found = item(pair(b=run("B", envs=b_envs, config={"env": {"NCCL_ALGO": "Tree"}})), "env")
    assert found["status"] == "pass"
    assert found["found"].startswith("only the differences their configs ask for: NCCL_ALGO (A: unset, B: Tree); ")
    assert found["details"] == [{"key": "NCCL_ALGO", "where": "A vs B, as their configs ask", "a": "unset",
                                 "b": "Tree"}]


def test_asked_differences_do_not_hide_an_unasked_one() -> None:
    flags = {**env(0)["torch_flags"], "deterministic_algorithms": True, "num_threads": 4}
    b_envs = [env(r, effective_env={"NCCL_DEBUG": "WARN"}, torch_flags=flags) for r in range(2)]
    b = run("B", envs=b_envs, config={"env": {}, "torch": {"deterministic_algorithms": True}, "threads": 4})
    found = item(pair(b=b), "env")
    assert found["status"] == "fail"
    assert found["found"] == ("NCCL_DEBUG differs (A vs B): INFO vs WARN; their configs' own difference(s) besides: "
                              "torch.deterministic_algorithms, torch.num_threads")


def test_a_value_the_config_asked_for_but_the_rank_did_not_get_fails() -> None:
    b_envs = [env(r, effective_env={"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"}) for r in range(2)]
    found = item(pair(b=run("B", envs=b_envs, config={"env": {"NCCL_ALGO": "Tree"}})), "env")
    assert found["status"] == "fail"
    assert found["found"] == "NCCL_ALGO differs (A vs B): unset vs Ring (their configs ask A: unset, B: Tree)"


def test_a_variable_that_differs_between_ranks_of_one_run_fails() -> None:
    envs = [env(0), env(1, effective_env={"NCCL_DEBUG": "WARN"})]
    found = item(pair(a=run("A", envs=envs)), "env")
    assert found["status"] == "fail"
    assert found["details"][0] == {"key": "NCCL_DEBUG", "where": "across A's ranks",
                                   "a": "rank 0: INFO · rank 1: WARN", "b": ""}


def test_variables_the_worker_sets_per_rank_are_not_parity_failures() -> None:
    envs = [env(r, effective_env={"NCCL_DEBUG_FILE": f"/tmp/nccl-rank{r}.log", "RANK": str(r)}) for r in range(2)]
    found = item(pair(run("A", envs=envs), run("B", envs=envs)), "env")
    assert found["status"] == "pass"


def test_another_collective_library_version_fails() -> None:
    found = item(pair(b=run("B", envs=[env(r, nccl="2.27.5") for r in range(2)])), "env")
    assert found["status"] == "fail" and found["found"].startswith("collective library version differs")


def test_a_torch_flag_that_differs_fails() -> None:
    flags = {**env(0)["torch_flags"], "deterministic_algorithms": True}
    found = item(pair(b=run("B", envs=[env(r, torch_flags=flags) for r in range(2)])), "env")
    assert found["status"] == "fail" and "torch.deterministic_algorithms" in found["found"]


def test_equal_environments_pass() -> None:
    assert item(pair(), "env")["status"] == "pass"


def test_no_environment_recorded_is_not_checked() -> None:
    assert item(pair(b=run("B", envs=[])), "env")["status"] == "not-checked"


# ---- 3. nondeterministic ops (op-audit) -----------------------------------------------------------------

def audit(*configs: dict[str, Any], hashes: list[str] | None = None) -> AuditJob:
    return AuditJob(job_id=40, kind="op-audit", config_hashes=hashes or ["h-default"] * len(configs),
                    result={"kind": "op-audit", "workload": "mlp", "configs": list(configs)})


def audit_config(*ops: tuple[str, bool | None], index: int = 0, device: str = "cpu", **kw: Any) -> dict[str, Any]:
    return {"index": index, "label": kw.pop("label", "default"), "device": device, "torch_flags": {},
            "threads": None, "ineffective": [],
            "ops": [{"op": op, "count": 3, "nondeterministic": nd, "evidence": "re-run: 3 distinct results in 5"
                     if nd else "re-run: 1 result in 5"} for op, nd in ops], **kw}


def test_no_op_audit_is_not_checked_with_the_form_prefilled() -> None:
    found = item(pair(), "ops")
    assert found["status"] == "not-checked" and "no finished op-audit job of workload mlp" in found["found"]
    assert found["evidence"] == [{"text": "new op-audit job of mlp", "href": "/?kind=op-audit&workload=mlp"}]


@pytest.mark.parametrize("key", ["ops", "batch"])
def test_sdk_recordings_are_offered_no_job_of_another_workload(key: str) -> None:
    """The submit form does not know workload `sdk` and would show its first workload (mlp) instead: no link."""
    found = item(pair(run("A", workload="sdk"), run("B", workload="sdk")), key)
    assert found["status"] == "not-checked"
    assert found["found"].startswith("not checked: run 1 (A) is an SDK recording")
    assert found["evidence"] == []


def test_a_nondeterministic_op_fails_naming_it_its_config_and_device() -> None:
    found = item(pair(op_audit=audit(audit_config(("aten::linear", False), ("aten::index_add_", True)))), "ops")
    assert found["status"] == "fail"
    assert found["found"] == ("aten::index_add_ nondeterministic (re-run: 3 distinct results in 5); "
                              "job #40, config default on cpu")
    assert found["evidence"][0]["href"] == "/jobs/40" and found["source"]["same_config"] is True


def test_an_op_that_ignores_the_determinism_claim_fails() -> None:
    config = audit_config(("aten::linear", False), ineffective=["aten::scatter_add_"])
    assert item(pair(op_audit=audit(config)), "ops")["status"] == "fail"


def test_deterministic_ops_pass_and_name_what_could_not_be_checked() -> None:
    found = item(pair(op_audit=audit(audit_config(("aten::linear", False), ("aten::mm", None)))), "ops")
    assert found["status"] == "pass"
    assert found["found"].startswith("none of 1 op call(s) checked is nondeterministic; "
                                     "1 could not be checked: aten::mm")


def test_an_audit_that_checked_nothing_is_not_checked() -> None:
    assert item(pair(op_audit=audit(audit_config(("aten::mm", None)))), "ops")["status"] == "not-checked"


def test_the_compared_runs_config_is_preferred_over_others() -> None:
    other = audit_config(("aten::index_add_", True), index=0, label="other")
    ours = audit_config(("aten::linear", False), index=1)
    found = item(pair(op_audit=audit(other, ours, hashes=["h-other", "h-default"])), "ops")
    assert found["status"] == "pass" and "config default on cpu" in found["found"]


def test_evidence_from_another_config_says_so() -> None:
    found = item(pair(op_audit=audit(audit_config(("aten::linear", False)), hashes=["h-other"])), "ops")
    assert "not the compared runs' configs" in found["found"] and found["source"]["same_config"] is False


def test_an_audit_on_another_device_is_not_checked() -> None:
    found = item(pair(op_audit=audit(audit_config(("aten::linear", False), device="NVIDIA H200"))), "ops")
    assert found["status"] == "not-checked" and "measured NVIDIA H200; the runs ran on cpu (x86_64)" in found["found"]


@pytest.mark.parametrize("audit_device, run_device, same", [
    ("cpu", "cpu (x86_64)", True), ("cuda:0", "NVIDIA H200", True), ("NVIDIA H200", "NVIDIA H200", True),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA H200", False), ("cuda", "cpu (x86_64)", False), (None, "cpu", False)])
def test_devices_match_by_kind_and_name(audit_device: str | None, run_device: str, same: bool) -> None:
    assert why.facts.same_device(audit_device, run_device) is same


# ---- 4. stack and topology --------------------------------------------------------------------------------

def test_another_device_fails() -> None:
    found = item(pair(b=run("B", envs=[env(r, device="cpu (aarch64)") for r in range(2)])), "stack")
    assert found["status"] == "fail"
    assert found["found"].startswith("device differs (A vs B): cpu (x86_64) vs cpu (aarch64)")


def test_another_world_size_fails() -> None:
    found = item(pair(b=run("B", world=4)), "stack")
    assert found["status"] == "fail" and found["details"][0]["key"] == "world size"


def test_another_ring_in_the_logs_fails() -> None:
    a = run("A", logs={0: log(RING, ring_orders=[[0, 1]])})
    b = run("B", logs={0: log(RING, ring_orders=[[1, 0]])})
    found = item(pair(a, b), "stack")
    assert found["status"] == "fail" and found["details"][0]["key"] == "ring_orders"


def test_the_same_stack_passes_and_says_topology_was_not_compared_without_logs() -> None:
    found = item(pair(), "stack")
    assert found["status"] == "pass" and "rings and transports not compared" in found["found"]


# ---- 5. batch invariance ------------------------------------------------------------------------------------

def batch_job(invariant: bool | None, workload: str = "mlp") -> AuditJob:
    model = {"workload": workload, "batch_sizes": [1, 2, 4, 8], "invariant": invariant,
             "first_module": None if invariant else "0", "first_break": None if invariant else 4}
    config = {"index": 0, "label": "default", "device": "cpu", "tf32": False, "results": [], "summary": [],
              "model": model}
    return AuditJob(job_id=41, kind="batch-invariance", config_hashes=["h-default"],
                    result={"kind": "batch-invariance", "workload": None, "configs": [config]})


def test_a_model_that_is_not_batch_invariant_fails_naming_the_size_and_module() -> None:
    found = item(pair(b=run("B", world=4), batch_invariance=batch_job(False)), "batch")
    assert found["status"] == "fail"
    assert found["found"] == ("the model's output changes with the batch size: first at batch size 4 in 0 "
                              "(job #41, config default on cpu); the compared runs split the batch over 2 vs 4 ranks")


def test_a_batch_invariant_model_passes() -> None:
    found = item(pair(batch_invariance=batch_job(True)), "batch")
    assert found["status"] == "pass" and "batch sizes 1, 2, 4, 8" in found["found"]


def test_no_batch_invariance_job_is_not_checked() -> None:
    found = item(pair(), "batch")
    assert found["status"] == "not-checked"
    assert found["evidence"][0]["href"] == "/?kind=batch-invariance&workload=mlp"


def test_a_batch_invariance_job_of_another_model_is_not_checked() -> None:
    assert item(pair(batch_invariance=batch_job(True, workload="tiny-lm")), "batch")["status"] == "not-checked"


# ---- 6. data order ----------------------------------------------------------------------------------------

def test_a_batch_that_parts_first_is_named_as_the_data_order() -> None:
    found = item(pair(first_divergent_step=3, first_component={"component": "batch", "tensors": ["x"],
                                                                "compared": ["batch", "rng"]}), "data")
    assert found["status"] == "fail" and found["found"].startswith("data order differs: the runs read other "
                                                                   "batches at step 3 (x)")


def test_equal_batches_pass_and_unrecorded_ones_are_not_checked() -> None:
    rng = {"component": "rng", "tensors": ["torch cpu"]}
    assert item(pair(first_component={**rng, "compared": ["batch", "rng"]}), "data")["status"] == "pass"
    assert item(pair(first_component={**rng, "compared": ["rng"]}), "data")["status"] == "not-checked"
