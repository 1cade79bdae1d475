"""A step record's drift data on the wire: optional, one set of numbers per digest, finite, bounded."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from detlab.core import sketch
from detlab.core.wire import RECORD, Drift, StepRecord

STEP = {"type": "step", "step": 1, "rank": 0, "fp_version": "fp2", "model_digest": "fp2:" + "0" * 32,
        "digests": "ab" * 32, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}


def drift(tensors: int = 2, **change: float) -> dict[str, str]:
    stats = np.ones((tensors, sketch.STATS))
    sk = np.zeros((tensors, sketch.K))
    for where, value in change.items():
        (stats if where == "stats" else sk).flat[0] = value
    return {"version": "cs1", "stats": sketch.pack(stats).hex(), "sketch": sketch.pack(sk).hex()}


def test_a_record_without_drift_data_is_valid_as_before() -> None:
    assert RECORD.validate_python(STEP).drift is None  # type: ignore[union-attr]


def test_drift_data_round_trips_through_json() -> None:
    record = StepRecord.model_validate({**STEP, "drift": drift()})
    again = RECORD.validate_json(record.model_dump_json())
    assert isinstance(again, StepRecord) and again.drift == record.drift


@pytest.mark.parametrize("where, value", [("stats", float("nan")), ("sketch", float("inf")), ("stats", -float("inf"))])
def test_a_nan_or_infinity_is_refused(where: str, value: float) -> None:
    with pytest.raises(ValidationError, match="NaN or an infinity"):
        StepRecord.model_validate({**STEP, "drift": drift(**{where: value})})


def test_numbers_for_another_count_of_tensors_than_the_digests_are_refused() -> None:
    with pytest.raises(ValidationError, match="drift describes 3 tensors, the digests 2"):
        StepRecord.model_validate({**STEP, "drift": drift(tensors=3)})


def test_stats_and_sketch_of_different_tensor_counts_are_refused() -> None:
    body = drift()
    body["sketch"] = body["sketch"][: 2 * sketch.SKETCH_BYTES]
    with pytest.raises(ValidationError, match="for the same tensors"):
        Drift.model_validate(body)


def test_oversized_drift_data_is_refused_before_it_is_decoded() -> None:
    with pytest.raises(ValidationError, match="at most"):
        Drift.model_validate({"stats": "00" * (sketch.MAX_TENSORS * sketch.STAT_BYTES + 8), "sketch": ""})


def test_an_unknown_sketch_version_is_refused() -> None:
    with pytest.raises(ValidationError, match="cs1"):
        Drift.model_validate({**drift(), "version": "cs9"})


@pytest.mark.parametrize("where, text", [("stats", "AB"), ("sketch", "zz"), ("stats", " 0"), ("sketch", "0\n")])
def test_drift_data_that_is_not_lowercase_hex_is_refused(where: str, text: str) -> None:
    body = drift()  # the first byte's two digits replaced: the length stays whole
    body[where] = text + body[where][2:]
    with pytest.raises(ValidationError, match=f"{where} must be lowercase hex"):
        Drift.model_validate(body)


def test_raw_bytes_from_python_are_checked_as_numbers_and_kept_as_the_same_hex() -> None:
    stats, sk = np.ones((2, sketch.STATS)), np.zeros((2, sketch.K))
    given = Drift.model_validate({"stats": sketch.pack(stats), "sketch": sketch.pack(sk)})
    assert given == Drift.model_validate(drift())
    stats[1, 2] = float("nan")
    with pytest.raises(ValidationError, match="stats holds a NaN or an infinity"):
        Drift.model_validate({"stats": sketch.pack(stats), "sketch": sketch.pack(sk)})
    with pytest.raises(ValidationError, match="sketch must be lowercase hex digits, 16 per float64"):
        Drift.model_validate({"stats": sketch.pack(np.ones((2, sketch.STATS))), "sketch": sketch.pack(sk)[:-3]})
    with pytest.raises(ValidationError, match="at most"):
        Drift.model_validate({"stats": b"0" * (sketch.MAX_TENSORS * sketch.STAT_BYTES + 8), "sketch": b""})
