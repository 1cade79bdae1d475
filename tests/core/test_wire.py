"""The wire contract: round trips of every message, and bad ones refused with a message naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from detlab.core.wire import (
    RECORD,
    BitFlip,
    CollectiveSpec,
    EnvRecord,
    Heartbeat,
    RankSpec,
    RecordsBatch,
    RunSpec,
    StepRecord,
    TensorInfo,
    TensorsRecord,
    TorchFacts,
    TrialRecord,
    explain,
)

DIGEST = "fp1:" + "0123456789abcdef" * 2


def step(**fields: Any) -> dict[str, Any]:
    return {"type": "step", "step": 1, "rank": 0, "fp_version": "fp1", "model_digest": DIGEST,
            "digests": "ab" * 32, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01, **fields}


def trial(**fields: Any) -> dict[str, Any]:
    return {"type": "trial", "op": "all_reduce_sum", "dtype": "float32", "bytes": 4096, "count": 1024,
            "op_bytes": 4096, "world_size": 2, "trial": 0, "rank": 1, "digest": DIGEST, "prefix_digest": DIGEST,
            "fp_version": "fp1", "time_s": 1e-4, "err_max_abs": 0.0, "err_max_ulp": 0.5, "frac_diff": 0.0,
            "impl": "all_reduce", **fields}


def env(**fields: Any) -> dict[str, Any]:
    return {"type": "env", "rank": 0, "host": "node1", "device": "NVIDIA H200", "torch": "2.13.0", "backend": "nccl",
            "fingerprint_impl": "triton", "effective_env": {"NCCL_ALGO": "Ring"},
            "torch_flags": {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
                            "allow_tf32": False, "num_threads": 8}, **fields}


def tensors() -> dict[str, Any]:
    return {"type": "tensors", "tensors": [{"index": 0, "name": "0.weight", "shape": [512, 64], "dtype": "float32",
                                            "component": "parameters"}]}


def refusal(data: Any) -> str:
    """The one-line explanation of why `data` is not a record (fails the test when it is one)."""
    with pytest.raises(ValidationError) as caught:
        RECORD.validate_python(data)
    return explain(caught.value)


def run_spec(**fields: Any) -> dict[str, Any]:
    return {"run_id": 7, "attempt": 2, "kind": "train", "workload": "mlp", "world_size": 2, "steps": 20,
            "seed": 3, "threads": 4, "env": {"NCCL_ALGO": "Ring"},
            "torch": {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
                      "allow_tf32": False},
            "fingerprint_interval": 2, "inject_bitflip": {"step": 3, "tensor": "0.weight", "rank": 1}, **fields}


# ---- round trips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("data", [step(), step(step=0, loss=None, loss_bits=""), trial(),
                                  trial(prefix_digest=None, err_max_abs=None, err_max_ulp=None, frac_diff=None),
                                  env(), env(host=None, torch_flags=None, effective_env={}), tensors()])
def test_every_record_round_trips_through_its_spool_line(data: dict[str, Any]) -> None:
    record = RECORD.validate_python(data)
    line = record.model_dump_json()
    assert "\n" not in line
    again = RECORD.validate_json(line)
    assert again == record and type(again) is type(record)
    assert {k: v for k, v in json.loads(line).items() if k in data} == data


def test_the_type_tag_picks_the_model() -> None:
    assert [type(RECORD.validate_python(d)) for d in (env(), tensors(), step(), trial())] == \
        [EnvRecord, TensorsRecord, StepRecord, TrialRecord]


def test_records_written_as_models_carry_their_type_tag() -> None:
    record = TensorsRecord(tensors=[TensorInfo(index=0, name="w", shape=[2], dtype="float32")])
    assert json.loads(record.model_dump_json())["type"] == "tensors"


def test_a_tensors_record_carries_the_placement_of_a_shard_and_the_rank_it_replicates() -> None:
    shard = {"mesh_shape": [2], "placements": ["Shard(dim=0)"], "coordinate": [1], "global_shape": [15, 8],
             "offset": [8, 0]}
    data = {**tensors(), "layouts": [{"index": 0, "placement": shard, "replica_of": None}]}
    record = RECORD.validate_python(data)
    assert isinstance(record, TensorsRecord) and record.layouts[0].placement is not None
    assert record.layouts[0].placement.offset == [8, 0]
    assert json.loads(record.model_dump_json())["layouts"] == data["layouts"]


def test_a_tensors_record_of_an_older_detlab_has_no_layouts() -> None:
    record = RECORD.validate_python(tensors())
    assert isinstance(record, TensorsRecord) and record.layouts == []


def test_a_layout_of_a_tensor_not_in_the_list_is_refused() -> None:
    assert "unknown indices: [3]" in refusal({**tensors(), "layouts": [{"index": 3, "replica_of": 0}]})


def test_a_run_spec_round_trips_and_becomes_the_ranks_spec() -> None:
    spec = RunSpec.model_validate(run_spec())
    assert RunSpec.model_validate_json(spec.model_dump_json()) == spec
    assert spec.inject_bitflip == BitFlip(step=3, tensor="0.weight", rank=1)
    ranks = RankSpec.for_run(spec, device="cpu")
    assert RankSpec.model_validate_json(ranks.model_dump_json()) == ranks
    assert (ranks.device, ranks.seed, ranks.env, ranks.spool_dir) == ("cpu", 3, {"NCCL_ALGO": "Ring"}, None)
    assert "run_id" not in ranks.model_dump()


def test_a_collective_run_spec_carries_its_parameters_nested() -> None:
    spec = RunSpec.model_validate(run_spec(kind="collective", workload="collective", inject_bitflip=None,
                                           collective={"ops": ["broadcast"], "dtypes": ["bfloat16"],
                                                       "sizes": [65536, 4096, 16384], "trials": 3, "warmup": 0}))
    assert spec.collective == CollectiveSpec(ops=["broadcast"], dtypes=["bfloat16"], sizes=[4096, 16384, 65536],
                                             trials=3, warmup=0)
    assert spec.collective.cells() == 3


def test_a_heartbeat_carries_typed_workloads() -> None:
    beat = Heartbeat.model_validate({"worker": "node:q", "queue": "q", "run_id": 5, "attempt": 1, "info": {
        "workloads": [{"name": "team-gpt", "description": "ours", "global_batch": 8, "default_steps": 7}]}})
    assert beat.info.workloads[0].global_batch == 8
    assert Heartbeat.model_validate_json(beat.model_dump_json()) == beat


def test_torch_facts_come_back_as_the_dict_the_report_reads() -> None:
    record = RECORD.validate_python(env())
    assert isinstance(record, EnvRecord) and isinstance(record.torch_flags, TorchFacts)
    assert record.torch_flags.model_dump()["allow_tf32"] is False


# ---- refusals --------------------------------------------------------------------------------------

def test_an_unknown_record_type_is_refused_with_the_known_ones() -> None:
    message = refusal({"type": "gradient", "rank": 0})
    assert "'gradient'" in message and "'env', 'tensors', 'step', 'trial'" in message


def test_a_record_without_a_type_is_refused() -> None:
    assert "Unable to extract tag using discriminator 'type'" in refusal({k: v for k, v in step().items()
                                                                          if k != "type"})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_loss_is_refused(value: float) -> None:
    assert refusal(step(loss=value)) == "step.loss: Input should be a finite number"


def test_a_non_finite_loss_in_json_is_refused() -> None:
    with pytest.raises(ValidationError, match="finite number"):
        RECORD.validate_json(json.dumps(step(loss=float("nan"))))


@pytest.mark.parametrize("field", ["time_s", "err_max_abs", "err_max_ulp", "frac_diff"])
def test_non_finite_trial_numbers_are_refused(field: str) -> None:
    assert refusal(trial(**{field: float("nan")})).startswith(f"trial.{field}: ")


@pytest.mark.parametrize("fields, where", [
    ({"model_digest": "fp1:" + "0" * 31}, "step.model_digest"),  # one hex short
    ({"model_digest": "fp1:" + "A" * 32}, "step.model_digest"),  # upper case
    ({"model_digest": "0" * 32}, "step.model_digest"),  # no version prefix
    ({"digests": "ab" * 15}, "step.digests"),  # not a whole number of 16-byte digests
    ({"digests": "zz" * 16}, "step.digests"),
    ({"loss_bits": "3f80000g"}, "step.loss_bits"),
    ({"fp_version": "fp1; drop table"}, "step.fp_version"),
])
def test_bad_hex_is_refused_naming_the_field(fields: dict[str, Any], where: str) -> None:
    message = refusal(step(**fields))
    assert message.startswith(f"{where}: String should match pattern")


def test_a_bad_trial_digest_is_refused() -> None:
    assert refusal(trial(digest="fp1:xyz")).startswith("trial.digest: String should match pattern")


@pytest.mark.parametrize("data, where, limit", [
    (env(host="h" * 256), "env.host", 255),
    (env(driver="5" * 65), "env.driver", 64),
    (env(nccl="2" * 33), "env.nccl", 32),
    (env(backend="b" * 17), "env.backend", 16),
    (env(fingerprint_impl="t" * 33), "env.fingerprint_impl", 32),
    (trial(impl="i" * 33), "trial.impl", 32),
    ({"type": "tensors", "tensors": [{"index": 0, "name": "n" * 256, "shape": [], "dtype": "float32"}]},
     "tensors.tensors.0.name", 255),
])
def test_over_long_strings_are_refused_at_their_columns_length(data: dict[str, Any], where: str, limit: int) -> None:
    assert refusal(data) == f"{where}: String should have at most {limit} characters"


def test_the_strings_at_their_columns_length_pass() -> None:
    RECORD.validate_python(env(host="h" * 255, driver="5" * 64, nccl="2" * 32, backend="b" * 16))


@pytest.mark.parametrize("data, fragment", [
    (step(rank=-1), "step.rank: Input should be greater than or equal to 0"),
    (step(step_time_s=-0.1), "step.step_time_s: Input should be greater than or equal to 0"),
    (trial(bytes=2**63), "trial.bytes: Input should be less than or equal to"),
    (trial(op="all_to_all"), "trial.op: Input should be"),
    (trial(rank=2), "rank 2 is outside world_size 2"),
    (step(extra="x"), "step.extra: Extra inputs are not permitted"),
    (env(torch_flags={"deterministic_algorithms": True}), "env.torch_flags.cudnn_deterministic: Field required"),
])
def test_out_of_bounds_numbers_and_unknown_fields_are_refused(data: dict[str, Any], fragment: str) -> None:
    assert fragment in refusal(data)


def test_a_batch_over_the_limit_is_refused() -> None:
    with pytest.raises(ValidationError, match="at most 10000 items"):
        RecordsBatch.model_validate({"attempt": 1, "records": [step(step=i) for i in range(10_001)]})


def test_a_batch_names_the_bad_record_by_index() -> None:
    with pytest.raises(ValidationError) as caught:
        RecordsBatch.model_validate({"attempt": 1, "records": [step(), step(digests="zz")]})
    assert explain(caught.value).startswith("records.1.step.digests: ")


@pytest.mark.parametrize("fields, fragment", [
    ({"kind": "collective"}, "a collective run needs `collective`"),
    ({"collective": {"ops": ["broadcast"], "dtypes": ["float32"], "sizes": [4096]}},
     "a train run takes no `collective` parameters"),
    ({"env": {"NCCL_ALGO": "x" * 4097}}, "env.NCCL_ALGO: String should have at most 4096 characters"),
    ({"world_size": 0}, "world_size: Input should be greater than or equal to 1"),
    ({"workload": "mlp; rm -rf /"}, "workload: String should match pattern"),
    ({"attempt": 0}, "attempt: Input should be greater than or equal to 1"),
    ({"seed": 2**32}, "seed: Input should be less than"),
])
def test_a_run_spec_out_of_bounds_is_refused(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RunSpec.model_validate(run_spec(**fields))
    assert fragment in explain(caught.value)


@pytest.mark.parametrize("fields, fragment", [
    ({"ops": []}, "ops: List should have at least 1 item"),
    ({"dtypes": ["float64"]}, "dtypes.0: Input should be"),
    ({"sizes": [2]}, "sizes.0: Input should be greater than or equal to 4"),
    ({"trials": 0}, "trials: Input should be greater than or equal to 1"),
])
def test_collective_parameters_out_of_bounds_are_refused(fields: dict[str, Any], fragment: str) -> None:
    data = {"ops": ["broadcast"], "dtypes": ["float32"], "sizes": [4096], **fields}
    with pytest.raises(ValidationError) as caught:
        CollectiveSpec.model_validate(data)
    assert fragment in explain(caught.value)


@pytest.mark.parametrize("fields", [{"probe_step": 21}, {"probe_step": 0},
                                    {"probe_step": 1, "kind": "collective", "workload": "collective",
                                     "collective": {"ops": ["broadcast"], "dtypes": ["float32"], "sizes": [4096]}}])
def test_a_probe_step_is_a_step_of_a_train_run(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="probe_step"):
        RunSpec.model_validate(run_spec(**fields))
    assert RunSpec.model_validate(run_spec(probe_step=20)).probe_step == 20


CALL = {"op": "all_reduce", "dtype": "float32", "count": 4, "group_size": 2}


def calls_record(**extra: Any) -> dict[str, Any]:
    return {"type": "calls", "step": 1, "rank": 0, "fp_version": "fp2", "calls": [CALL, CALL],
            "inputs": "ab" * 32, "outputs": "cd" * 32, **extra}


def test_a_calls_record_round_trips() -> None:
    rec = RECORD.validate_python(calls_record(unread=[1]))
    assert RECORD.validate_json(rec.model_dump_json()) == rec


@pytest.mark.parametrize("extra, fragment", [
    ({"unread": [2]}, "unread names a call the record does not hold"),
    ({"inputs": "ab" * 16}, "one digest (32 hex) per call"),
    ({"calls": []}, "at least 1 item"),
    ({"calls": [{**CALL, "op": "all_reduce; rm"}]}, "calls.0.op"),
    ({"calls": [{**CALL, "group_size": 0}]}, "calls.0.group_size"),
])
def test_a_bad_calls_record_is_refused_naming_what(extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RECORD.validate_python(calls_record(**extra))
    assert fragment in explain(caught.value)


@pytest.mark.parametrize("position", [{}, {"dp": -1}, {"dp": 1024}, {"1dp": 0}, {f"d{i}": 0 for i in range(9)}])
def test_a_bad_position_is_refused(position: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        EnvRecord(rank=0, position=position)
