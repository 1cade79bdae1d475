"""The diagnosis measurements on real CPU ops: ULP maths, batch invariance, and the op audit (DebugMode, re-runs,
PyTorch's own check), including index_put_(accumulate=True) at 2 threads and flags that do nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch._prims_common import alert_not_deterministic

from detlab.core import diagnosis
from detlab.tensors.audit import alert, audit_step, trace_step
from detlab.tensors.batch_invariance import OP_FUNCS, Inputs, max_ulp, model_invariance, op_invariance
from detlab.worker.workloads import registry

CONTENDED = 1 << 18  # values all added into 8 slots: threads race on the same targets


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before[0])
    torch.use_deterministic_algorithms(before[1])


def contended_step(switch_off_determinism: bool = False) -> tuple[Callable[[], None], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, 8, (CONTENDED,), generator=g)
    values = torch.randn(CONTENDED, generator=g)

    def step() -> None:
        if switch_off_determinism:  # what user code does after the config set the flag: the flag does nothing
            torch.use_deterministic_algorithms(False)
        torch.zeros(8).index_put_((index,), values, accumulate=True)

    return step, values


@pytest.mark.parametrize(("a", "b", "ulp"), [
    (1.0, 1.0, 0),
    (1.0, float(torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))), 1),
    (-0.0, 0.0, 1),  # different bits: never invariant
    (-1.0, 1.0, 2 * 0x3F800000 + 1),
])
def test_max_ulp_counts_representable_floats_between(a: float, b: float, ulp: int) -> None:
    assert max_ulp(torch.tensor([a]), torch.tensor([b])) == ulp


def test_max_ulp_in_bfloat16_steps_by_its_own_last_place() -> None:
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    assert max_ulp(one + 2**-7, one) == 1  # bfloat16 keeps 8 significant bits


def test_op_invariance_compares_row_zero_with_the_batch_one_result() -> None:
    records = list(op_invariance(["mm", "sum"], ["float32", "bfloat16"], [1, 2, 16], 64, torch.device("cpu")))
    assert [(r.dtype, r.op, r.batch_size) for r in records][:3] == [("float32", "mm", 1), ("float32", "mm", 2),
                                                                     ("float32", "mm", 16)]
    assert len(records) == 12 and all(r.invariant and r.max_ulp == 0 for r in records if r.batch_size == 1)
    # Each verdict is what a direct computation gives.
    inputs = Inputs(64, 16, torch.float32, torch.device("cpu"), 0)
    alone = OP_FUNCS["mm"](inputs.x[:1], inputs)[0]
    for r in (r for r in records if (r.op, r.dtype) == ("mm", "float32")):
        assert r.invariant == torch.equal(OP_FUNCS["mm"](inputs.x[: r.batch_size], inputs)[0], alone)
        assert r.max_ulp == max_ulp(OP_FUNCS["mm"](inputs.x[: r.batch_size], inputs)[0], alone)


@pytest.mark.parametrize("op", sorted(OP_FUNCS))
def test_every_op_gives_one_row_per_sample(op: str) -> None:
    inputs = Inputs(256, 4, torch.float16, torch.device("cpu"), 0)
    assert OP_FUNCS[op](inputs.x[:4], inputs).shape[0] == 4


def test_model_invariance_of_a_model_with_batch_dependent_modules_names_the_first() -> None:
    workload = registry()["mlp"]()
    torch.manual_seed(0)
    model = workload.build()
    [one, four] = model_invariance(workload, model, [1, 4], torch.device("cpu"))
    assert (one.invariant, one.modules_compared) == (True, 6)
    # MLP's Linear layers are matrix multiplies whose kernels may change with the batch; whatever they do,
    # the first module named is the first whose sample-0 output differs, and earlier ones were equal.
    assert four.invariant == (four.first_module is None) and four.modules_compared == 6
    if four.first_module is not None:
        assert four.first_module in {"0", "1", "2", "3", "4", "(model)"}


def test_index_put_accumulate_at_two_threads_is_nondeterministic_by_rerun_and_pytorch_says_nothing(
        two_threads: None) -> None:
    step, _ = contended_step()
    torch.use_deterministic_algorithms(False)
    rows = {r.op: r for r in audit_step(step, reruns=32, calls_per_op=1)}  # 32: see the test below
    put = rows["aten.index_put_"]
    assert put.nondeterministic is True and put.distinct is not None and put.distinct > 1
    assert put.evidence.startswith(f"re-run: {put.distinct} distinct results in 32") and "alert" not in put.evidence
    assert put.alert is False  # PyTorch's own check has no alert for it on CPU
    assert rows["aten.zeros"].nondeterministic is False


def test_deterministic_mode_makes_index_put_accumulate_deterministic(two_threads: None) -> None:
    step, _ = contended_step()
    torch.use_deterministic_algorithms(True)
    rows = {r.op: r for r in audit_step(step, reruns=8, calls_per_op=1)}
    assert (rows["aten.index_put_"].nondeterministic, rows["aten.index_put_"].distinct) == (False, 1)
    assert diagnosis.ineffective([r.model_dump() for r in rows.values()], claims_determinism=True) == []


def test_a_flag_switched_off_by_the_step_is_listed_as_doing_nothing(two_threads: None) -> None:
    step, _ = contended_step(switch_off_determinism=True)
    torch.use_deterministic_algorithms(True)  # what the config claims
    # The race shows only when both threads run at once: on a loaded 2-core machine 8 re-runs all came out alike
    # once (a CI run of the whole suite); 32 make that vanishingly rare.
    rows = [r.model_dump() for r in audit_step(step, reruns=32, calls_per_op=1)]
    assert diagnosis.ineffective(rows, claims_determinism=True) == ["aten.index_put_"]


def test_trace_counts_every_call_and_keeps_inputs_before_an_in_place_op_changes_them() -> None:
    x = torch.ones(4)

    def step() -> None:
        for _ in range(3):
            x.add_(1.0)

    counts, recorder = trace_step(step, calls_per_op=2)
    assert counts["aten.add_"] == 3 and len(recorder.kept["aten.add_"]) == 2
    assert [float(k.args[0][0]) for k in recorder.kept["aten.add_"]] == [1.0, 2.0]


def test_random_ops_are_rerun_with_the_generator_restored_and_say_so() -> None:
    rows = {r.op: r for r in audit_step(lambda: torch.nn.functional.dropout(torch.ones(64), 0.5), 5, 1)}
    random_rows = [r for r in rows.values() if "generators restored" in r.evidence]
    assert random_rows and all(r.nondeterministic is False for r in random_rows)


@pytest.mark.parametrize("draw", [lambda g: torch.randn(64, generator=g),
                                  lambda g: torch.randint(0, 1000, (64,), generator=g),
                                  lambda g: torch.rand(8, 8, generator=g).bernoulli_(0.5, generator=g)],
                         ids=["randn", "randint", "bernoulli_"])
def test_a_draw_from_a_generator_passed_as_an_argument_is_not_called_nondeterministic(
        draw: Callable[[torch.Generator], torch.Tensor]) -> None:
    g = torch.Generator().manual_seed(7)
    rows = list(audit_step(lambda: draw(g), reruns=5, calls_per_op=2))
    assert rows and all(r.nondeterministic is False for r in rows), [(r.op, r.evidence) for r in rows]


# An op shaped like attention without dropout: its result, and a random state it leaves uninitialized.
torch.library.define("detlab_test::attention_like",
                     "(Tensor x) -> (Tensor output, Tensor philox_seed, Tensor philox_offset)")


@torch.library.impl("detlab_test::attention_like", "CPU")
def _attention_like(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import os

    junk = [torch.tensor(int.from_bytes(os.urandom(7), "little")) for _ in range(2)]  # what at::empty may hold
    return x * 2, junk[0], junk[1]


def test_an_op_s_uninitialized_dropout_state_outputs_are_not_compared() -> None:
    x = torch.ones(4)
    [row] = [r for r in audit_step(lambda: torch.ops.detlab_test.attention_like(x), reruns=4, calls_per_op=1)
             if r.op == "detlab_test.attention_like"]
    assert (row.nondeterministic, row.distinct) == (False, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_cuda_efficient_attention_fp32_is_not_flagged_with_or_without_dropout(dropout_p: float) -> None:
    # tiny-lm's flag on the H200: fp32 SDPA runs the memory-efficient kernel; without dropout it returns its
    # philox seed and offset uninitialized, with dropout it draws them from the default CUDA generator.
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 32, device="cuda", generator=g) for _ in range(3))
    op = torch.ops.aten._scaled_dot_product_efficient_attention
    rows = {r.op: r for r in audit_step(lambda: op(q, k, v, None, True, dropout_p, True), reruns=5, calls_per_op=2)}
    row = rows["aten._scaled_dot_product_efficient_attention"]
    assert (row.nondeterministic, row.distinct) == (False, 1), row.evidence


def test_the_audit_leaves_the_generators_as_the_step_left_them() -> None:
    g = torch.Generator().manual_seed(7)

    def step() -> None:
        torch.nn.functional.dropout(torch.ones(64), 0.5)
        torch.randn(4, generator=g)

    torch.manual_seed(1)
    list(audit_step(step, reruns=3, calls_per_op=1))
    after = torch.get_rng_state(), g.get_state()
    torch.manual_seed(1)
    g.manual_seed(7)
    step()
    assert torch.equal(after[0], torch.get_rng_state()) and torch.equal(after[1], g.get_state())


def test_pytorch_alert_for_an_aten_op_is_seen_and_listed() -> None:
    """put_ without accumulate has no deterministic implementation (on CPU too); called as an aten op, its alert
    is a C++ warning that Python's warnings never see, so the check has to ask for the error."""
    index, values = torch.tensor([1, 2]), torch.ones(2)
    rows = {r.op: r for r in audit_step(lambda: torch.zeros(10).put_(index, values), reruns=3, calls_per_op=1)}
    put = rows["aten.put_"]
    assert (put.nondeterministic, put.alert) == (True, True)
    assert put.evidence.startswith("alert: put_ does not have a deterministic implementation")


def test_uninitialized_outputs_are_not_compared() -> None:
    [row] = [r for r in audit_step(lambda: torch.empty(8).fill_(1.0), 3, 1) if r.op == "aten.empty"]
    assert row.nondeterministic is None and row.evidence.startswith("not compared: its output is uninitialized")


def test_pytorch_check_has_no_alert_for_a_deterministic_op() -> None:
    _, recorder = trace_step(lambda: torch.mm(torch.ones(2, 2), torch.ones(2, 2)), calls_per_op=1)
    assert alert(recorder.kept["aten.mm"][0]) is None


@torch.library.custom_op("detlabtest::racy_sum", mutates_args=())
def racy_sum(x: torch.Tensor) -> torch.Tensor:
    """An op that declares itself nondeterministic through PyTorch's own alert (as CUDA's index_add_ does)."""
    alert_not_deterministic("detlabtest::racy_sum")
    return x.sum(0)


def test_an_op_pytorch_alerts_for_is_nondeterministic_with_the_alert_as_evidence() -> None:
    rows = {r.op: r for r in audit_step(lambda: racy_sum(torch.ones(4, 4)), reruns=3, calls_per_op=1)}
    row = rows["detlabtest.racy_sum"]
    assert (row.nondeterministic, row.alert, row.distinct) == (True, True, 1)
    assert row.evidence.startswith("alert: detlabtest::racy_sum does not have a deterministic implementation")
    assert "re-run: 1 distinct result in 3" in row.evidence
