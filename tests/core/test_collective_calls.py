"""The first differing collective call between two runs and its diagnosis (detlab.core.collective_calls), on
plain data; the NCCL facts come from real NCCL logs (tests/fixtures/commlogs, sources in SOURCES.md)."""

from __future__ import annotations

from detlab.core import collective_calls as cc
from detlab.core.commlog import parse
from detlab.core.positions import Alignment
from tests.conftest import FIXTURES

D = {name: bytes([i]) * 16 for i, name in enumerate("abcdefghijklmnop")}  # distinct 16-byte digests
LOSS = ("all_reduce", "float32", 1, 2)  # a loop's 1-element float32 all_reduce: 4 bytes in NCCL's TUNING lines
BUCKET = ("ddp_allreduce", "float32", 193, 2)


def calls(*rows: tuple[tuple[str, str, int, int], str, str], unread: frozenset[int] = frozenset()) -> cc.StepCalls:
    """A rank's calls in a step: (call, input digest name, output digest name) per call."""
    return cc.StepCalls([r[0] for r in rows], b"".join(D[r[1]] for r in rows), b"".join(D[r[2]] for r in rows),
                        unread)


def run(per_step: dict[int, tuple[cc.StepCalls, cc.StepCalls]]) -> cc.RunCalls:
    """Two ranks' calls per step."""
    return {(step, rank): c for step, pair in per_step.items() for rank, c in enumerate(pair)}


def log(name: str) -> dict:
    return parse((FIXTURES / "commlogs" / name).read_text())


def test_equal_outputs_everywhere_are_identical() -> None:
    a = run({1: (calls((BUCKET, "a", "b"), (LOSS, "c", "d")), calls((BUCKET, "e", "b"), (LOSS, "f", "d")))})
    result = cc.first_difference(a, dict(a))
    assert result["status"] == "identical" and result["calls_compared"] == 4 and result["first"] is None


def test_an_output_that_differs_after_an_input_that_differed_is_carried() -> None:
    a = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "e", "b"))),
             2: (calls((BUCKET, "a", "b")), calls((BUCKET, "e", "b")))})
    b = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "e", "b"))),
             2: (calls((BUCKET, "a", "c")), calls((BUCKET, "f", "c")))})  # rank 1's input differs at step 2
    first = cc.first_difference(a, b)["first"]
    assert (first["step"], first["seq"], first["cause"]) == (2, 0, "carried")
    assert first["ranks"] == [0, 1] and first["input_ranks_differing"] == [1] and "nccl" not in first


def test_matched_inputs_and_a_differing_output_blame_the_reduction_with_nccl_facts_for_that_size() -> None:
    a = run({3: (calls((BUCKET, "a", "b"), (LOSS, "c", "d")), calls((BUCKET, "e", "b"), (LOSS, "f", "d")))})
    b = run({3: (calls((BUCKET, "a", "b"), (LOSS, "c", "g")), calls((BUCKET, "e", "b"), (LOSS, "f", "g")))})
    logs = ([log("nccl-2.27.5-tuning-by-name-interleaved-sglang.log")], [log("nccl-2.27.5-tree-ll-by-name-sglang.log")])
    result = cc.first_difference(a, b, logs=logs, fp_version="fp2")
    first = result["first"]
    assert (first["step"], first["seq"], first["op"], first["bytes"]) == (3, 1, "all_reduce", 4)
    assert first["cause"] == "reduction-order" and first["diagnosis"] == cc.REDUCTION_ORDER
    assert [(c["algo"], c["proto"], c["channels"]) for c in first["nccl"]["a"]] == [("RING", "SIMPLE", [0, 0])]
    assert [(c["algo"], c["proto"]) for c in first["nccl"]["b"]] == [("TREE", "LL")]
    assert "RING/SIMPLE channels 0..0" in result["text"] and "inputs matched → reduction order" in result["text"]


def test_inputs_that_differ_on_a_few_of_many_ranks_are_named() -> None:
    """A 256-GPU study found 16 peers with other inputs: the diagnosis reads every rank's inputs, not one's."""
    call = ("all_reduce", "float32", 1024, 8)
    a = {(1, r): calls((call, "a", "b")) for r in range(8)}
    b = {(1, r): calls((call, "c" if r in (5, 6) else "a", "d")) for r in range(8)}
    result = cc.first_difference(a, b)
    assert (result["first"]["cause"], result["first"]["input_ranks_differing"]) == ("carried", [5, 6])
    assert "inputs differed on rank(s) 5, 6" in result["text"] and "inputs matched" not in result["text"]


def test_inputs_matched_is_said_only_when_every_rank_of_the_call_was_compared() -> None:
    a = run({3: (calls((BUCKET, "a", "b")), calls((BUCKET, "e", "b")))})
    b = {(3, 0): calls((BUCKET, "a", "c"))}  # run B's rank 1 recorded no calls: its inputs are not known
    result = cc.first_difference(a, b)
    assert result["first"]["cause"] == "inputs-unknown" and "nccl" not in result["first"]
    assert "inputs matched" not in result["text"]
    assert "inputs equal on rank(s) 0; rank(s) 1 not recorded by both runs" in result["text"]


def test_nccl_facts_match_the_size_not_just_the_op() -> None:
    parsed = [log("nccl-bynumber-slot-prefix-issue1453.log")]  # TUNING by number: 4 and 262144 bytes, no op named
    assert [(c["bytes"], c["algo"]) for c in cc.nccl_choices(parsed, "all_reduce", [262144])] == [(262144, "TREE")]
    assert cc.nccl_choices(parsed, "all_reduce", [8192]) == []
    text = cc.calls_text({"step": 1, "seq": 0, "cause": "reduction-order", "diagnosis": cc.REDUCTION_ORDER,
                          "ranks": [0], "bytes": 8192, "nccl": {"a": [], "b": None}})
    assert "run A its NCCL logs show no choice for this size" in text and "run B no NCCL log" in text


def test_gathers_are_looked_up_at_the_whole_and_the_per_rank_size() -> None:
    assert cc.message_bytes("all_gather_into_tensor", "bfloat16", 1024, 4) == [512, 2048, 8192]
    assert cc.message_bytes("all_reduce", "float32", 1024, 4) == [4096]
    assert cc.message_bytes("all_reduce", "complex32x", 1, 4) == []


def test_outputs_never_waited_for_are_not_compared_and_said_so() -> None:
    a = run({1: (calls((LOSS, "a", "b"), unread=frozenset({0})), calls((LOSS, "c", "b")))})
    b = run({1: (calls((LOSS, "a", "p")), calls((LOSS, "c", "b"))), 2: (calls((LOSS, "a", "b")), calls())})
    result = cc.first_difference(a, b)
    assert result["status"] == "identical" and result["calls_compared"] == 2
    assert result["text"].endswith("(not compared: 1 outputs never waited for; 2 (step, rank) call lists recorded "
                                   "by one run only)")


def test_calls_that_differ_in_size_are_named_as_such() -> None:
    a = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "a", "b")))})
    other = ("ddp_allreduce", "float32", 192, 2)
    b = run({1: (calls((other, "a", "b")), calls((other, "a", "b")))})
    first = cc.first_difference(a, b)["first"]
    assert first["cause"] == "calls-differ" and "nccl" not in first


def test_ranks_are_lined_up_before_calls_are_compared() -> None:
    """Run B numbers its ranks the other way round: by position its calls equal A's; by number they would not."""
    a = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "c", "d")))})
    b = run({1: (calls((BUCKET, "c", "d")), calls((BUCKET, "a", "b")))})
    swapped = cc.compare(a, b, alignment=Alignment(b_to_a={0: 1, 1: 0}), world_sizes=(2, 2))
    assert swapped["status"] == "identical"
    assert cc.compare(a, b, alignment=Alignment(), world_sizes=(2, 2))["status"] == "differs"


def test_ranks_that_do_not_meet_one_to_one_are_not_compared() -> None:
    a = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "c", "d")))})
    result = cc.compare(a, dict(a), alignment=Alignment(), world_sizes=(2, 4))
    assert result["status"] == "incomparable" and "ranks do not meet one to one" in result["text"]
    refused = cc.compare(a, dict(a), alignment=Alignment(reason="positions do not line up: x"), world_sizes=(2, 2))
    assert refused["status"] == "incomparable" and "positions do not line up" in refused["text"]


def test_a_run_without_calls_says_so() -> None:
    a = run({1: (calls((BUCKET, "a", "b")), calls((BUCKET, "c", "d")))})
    result = cc.first_difference(a, {})
    assert result["status"] == "not-recorded" and "run B recorded no collective calls" in result["text"]
