"""What a probe step's differing entries say (detlab.core.bisect): pure, no torch, no database."""

from __future__ import annotations

import pytest

from detlab.core import bisect
from detlab.core.bisect import Entry, call_entry, diagnose, parse

Row = tuple[str, list[int], str]


def probe(*modules: tuple[str, str], calls: list[str]) -> list[Row]:
    """An entry list as a rank writes it: the modules' state entries, then the calls' tensors in order."""
    return [(f"state:{name}", [1], kind) for name, kind in modules] + [(c, [4], "float32") for c in calls]


# A Sequential of Linear, ReLU, Linear, as detlab/tensors/probe.py records it: pre-hooks (inputs) before post-hooks.
MLP = probe(("", "Sequential"), ("0", "Linear"), ("1", "ReLU"), ("2", "Linear"), calls=[
    "fwd:#0:in0", "fwd:0#0:in0", "fwd:0#0:out0", "fwd:1#0:in0", "fwd:1#0:out0", "fwd:2#0:in0", "fwd:2#0:out0",
    "fwd:#0:out0", "loss", "bwd:#0:gout0", "bwd:2#0:gout0", "bwd:2#0:gin0", "bwd:1#0:gout0", "bwd:1#0:gin0",
    "bwd:0#0:gout0", "grad:0.weight", "grad:2.weight", "param:0.weight", "param:2.weight"])


def at(entries: list[Row], *names: str) -> list[int]:
    index = {name: i for i, (name, _, _) in enumerate(entries)}
    return [index[n] for n in names]


@pytest.mark.parametrize("name, entry", [
    ("fwd:blocks.0.attn#1:out0", Entry("forward", "blocks.0.attn", 1, "out0")),
    ("bwd:#0:gin2", Entry("backward", "", 0, "gin2")),
    ("fwd:a#b#3:in0", Entry("forward", "a#b", 3, "in0")),  # a '#' in a name: the call is after the last one
    ("state:", Entry("state", "")),
    ("grad:0.weight", Entry("grad", "0.weight")),
    ("param:0.weight", Entry("update", "0.weight")),
    ("loss", Entry("loss", "")),
])
def test_entry_names_parse_back(name: str, entry: Entry) -> None:
    assert parse(name) == entry


@pytest.mark.parametrize("name", ["weights:0", "fwd:0:out0", "fwd:0#x:out0", "0.weight"])
def test_a_name_no_probe_writes_is_refused(name: str) -> None:
    with pytest.raises(ValueError):
        parse(name)


def test_a_module_whose_inputs_matched_introduced_the_difference() -> None:
    found = diagnose(MLP, {0: [], 1: at(MLP, "fwd:2#0:out0", "fwd:#0:out0", "loss")})
    first = found["first_module"]
    assert (first["module"], first["phase"], first["call"], first["type"]) == ("2", "forward", 0, "Linear")
    assert first["inputs_matched"] and first["verdict"] == "introduced" and first["ranks"] == [1]
    assert first["differing_outputs"] == ["out0"] and not first["own_state_differs"]
    assert "arose_in" not in first
    assert found["first"]["entry"] == "fwd:2#0:out0"
    assert "its inputs matched, so it introduced the difference" in found["summary"]


def test_a_module_whose_inputs_differed_carried_it_and_the_parent_is_named() -> None:
    # 1's input differs though 0's output did not: something in the root's own forward changed it.
    found = diagnose(MLP, {0: at(MLP, "fwd:1#0:in0", "fwd:1#0:out0")})
    first = found["first_module"]
    assert first["module"] == "1" and first["verdict"] == "carried" and not first["inputs_matched"]
    assert first["differing_inputs"] == ["in0"] and first["arose_in"] == ["(model)"]
    assert "carried the difference" in found["summary"] and "(model)'s own forward" in found["summary"]


def test_downstream_modules_carry_what_the_first_introduced() -> None:
    found = diagnose(MLP, {0: at(MLP, "fwd:0#0:out0", "fwd:1#0:in0", "fwd:1#0:out0", "fwd:2#0:in0",
                                 "fwd:2#0:out0", "fwd:#0:out0")})
    tree = {row["module"]: row for row in found["tree"]}
    assert tree["0"]["status"] == "first difference" and tree["0"]["verdict"] == "introduced"
    assert [tree[m]["verdict"] for m in ("1", "2")] == ["carried", "carried"]
    assert tree[""]["status"] == "differs" and tree[""]["verdict"] == "introduced"  # its input matched
    assert "carried" not in found["first_module"]["verdict"]


def test_the_tree_is_every_module_with_depth_type_and_status() -> None:
    entries = probe(("", "Net"), ("enc", "Encoder"), ("enc.layer", "Linear"), ("spare", "Linear"), calls=[
        "fwd:#0:in0", "fwd:enc#0:in0", "fwd:enc.layer#0:in0", "fwd:enc.layer#0:out0", "fwd:enc#0:out0",
        "fwd:#0:out0"])
    found = diagnose(entries, {0: at(entries, "fwd:enc.layer#0:out0", "fwd:enc#0:out0", "fwd:#0:out0")})
    rows = [(r["shown"], r["depth"], r["type"], r["status"]) for r in found["tree"]]
    assert rows == [("(model)", 0, "Net", "differs"), ("enc", 1, "Encoder", "differs"),
                    ("enc.layer", 2, "Linear", "first difference"), ("spare", 1, "Linear", "not called")]
    line = bisect.tree_lines(found["tree"])[2]
    assert line == "> " + "    enc.layer (Linear): first difference [introduced; fwd#0:out0]"


def test_a_module_called_twice_is_told_apart_by_its_call() -> None:
    entries = probe(("", "Net"), ("shared", "Linear"), calls=[
        "fwd:#0:in0", "fwd:shared#0:in0", "fwd:shared#0:out0", "fwd:shared#1:in0", "fwd:shared#1:out0",
        "fwd:#0:out0"])
    found = diagnose(entries, {0: at(entries, "fwd:shared#1:out0", "fwd:#0:out0")})
    assert (found["first_module"]["module"], found["first_module"]["call"]) == ("shared", 1)
    assert found["tree"][1]["calls"] == 2 and found["tree"][1]["differing"] == ["fwd#1:out0"]


@pytest.mark.parametrize("entry, phase, words", [
    ("loss", "loss", "the loss computed outside the model's modules"),
    ("grad:2.weight", "grad", "gradient all-reduce"),
    ("param:0.weight", "update", "the optimizer step, or a fault injected after it"),
    ("state:2", "state", "already differed as the step started"),
])
def test_a_difference_outside_module_calls_says_where_it_is(entry: str, phase: str, words: str) -> None:
    found = diagnose(MLP, {0: at(MLP, entry)})
    assert found["first"]["phase"] == phase and found["first_module"] is None
    assert words in found["summary"]


def test_parameters_that_differed_at_the_start_explain_the_module_that_uses_them() -> None:
    found = diagnose(MLP, {1: at(MLP, "state:2", "fwd:2#0:out0", "param:2.weight")})
    assert found["first"]["entry"] == "state:2" and found["state_differs"] == ["2"]
    first = found["first_module"]
    assert first["module"] == "2" and first["inputs_matched"] and first["own_state_differs"]
    assert found["tree"][3]["state_differs"]


def test_backward_calls_count_output_gradients_as_their_inputs() -> None:
    found = diagnose(MLP, {0: at(MLP, "bwd:1#0:gout0", "bwd:1#0:gin0")})
    first = found["first_module"]
    assert (first["module"], first["phase"], first["verdict"]) == ("1", "backward", "carried")


def test_the_ranks_are_those_where_the_first_call_differs() -> None:
    found = diagnose(MLP, {0: at(MLP, "fwd:2#0:out0"), 1: at(MLP, "fwd:2#0:out0"), 2: []})
    assert found["first_module"]["ranks"] == [0, 1] and found["first"]["ranks"] == [0, 1]


def test_no_difference_says_so() -> None:
    found = diagnose(MLP, {0: [], 1: []})
    assert found["first"] is None and found["first_module"] is None
    assert found["summary"].startswith("no entry differs")
    assert {row["status"] for row in found["tree"]} == {"equal"}


def test_different_call_lists_name_the_first_call_that_differs() -> None:
    other = [*MLP[:6], ("fwd:2#0:in0", [4], "float32"), *MLP[7:]]  # B calls 2 where A's 0 returned
    reason = bisect.call_list_difference(MLP, other)
    assert reason == ("the runs' module calls part at entry 6 (call): fwd:0#0:out0 float32[4] in A, "
                      "fwd:2#0:in0 float32[4] in B")
    assert bisect.call_list_difference(MLP, MLP[:-1]) == "run A records more module calls: entry 22 is param:2.weight"
    assert bisect.call_list_difference(MLP, list(MLP)) is None


def test_a_shape_difference_is_named_as_such() -> None:
    other = [(n, [8] if n == "loss" else s, d) for n, s, d in MLP]
    reason = str(bisect.call_list_difference(MLP, other))
    assert "(shape or dtype): loss float32[4] in A, loss float32[8] in B" in reason


def test_digests_are_compared_rank_by_rank() -> None:
    a = {0: bytes(32), 1: bytes(32)}
    b = {0: bytes(16) + b"\x01" + bytes(15), 1: bytes(32), 2: bytes(32)}
    assert bisect.differing_by_rank(a, b) == {0: [1], 1: []}


def test_call_entry_and_parse_agree() -> None:
    assert parse(call_entry("bwd", "a.b", 3, "gout1")) == Entry("backward", "a.b", 3, "gout1")
