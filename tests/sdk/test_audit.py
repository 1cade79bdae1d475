"""`detlab.audit(step)` on CPU: the CLI's JSON shape from the shared engine, draws (explicit generators, dropout)
never called nondeterministic, a noisy op called so, bad arguments refused."""

from __future__ import annotations

import os

import pytest
import torch

import detlab
from detlab.core import diagnosis


@torch.library.custom_op("detlab_test::noisy", mutates_args=())
def noisy(x: torch.Tensor) -> torch.Tensor:
    """An op whose result changes run to run without any generator: what a racing kernel looks like."""
    return x + float(int.from_bytes(os.urandom(4), "little"))


@noisy.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def training_step() -> tuple[torch.nn.Module, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)

    def step() -> None:
        x = torch.randn(8, 16, generator=g)  # a draw from a generator passed as an argument
        noise = torch.randint(0, 4, (8, 1), generator=g).float()
        loss = ((model(x) - noise) ** 2).mean()  # the model's dropout draws from the default generator
        opt.zero_grad()
        loss.backward()
        opt.step()

    return model, step


def test_audit_of_a_step_with_draws_and_dropout_flags_nothing_and_has_the_cli_shape() -> None:
    _, step = training_step()
    result = detlab.audit(step, reruns=4)
    shape = diagnosis.audit_report([], claims_determinism=False, workload=None, device=None, threads=None,
                                   torch_flags=None)
    assert set(result) == set(shape) and result["workload"] == "training_step.<locals>.step"
    ops = {o["op"]: o for o in result["ops"]}
    assert {"aten.randn", "aten.randint", "aten.bernoulli_", "aten.addmm"} <= set(ops)  # bernoulli_: dropout on CPU
    assert [o["op"] for o in result["ops"] if o["nondeterministic"]] == []
    assert "generators restored" in ops["aten.randn"]["evidence"]
    assert result["device"].startswith("cpu") and result["threads"] == torch.get_num_threads()


def test_audit_calls_an_op_with_a_different_result_each_run_nondeterministic() -> None:
    x = torch.ones(4)
    result = detlab.audit(lambda: noisy(x), reruns=3, device="cpu")
    [row] = [o for o in result["ops"] if o["op"] == "detlab_test.noisy"]
    assert row["nondeterministic"] is True and row["evidence"].startswith("re-run: 3 distinct results in 3")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"reruns": 1}, "reruns"), ({"calls_per_op": 0}, "calls_per_op"), ({"device": "mps"}, "'cpu' or a CUDA"),
])
def test_bad_arguments_are_refused_with_what_to_pass(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detlab.audit(lambda: None, **kwargs)


def test_a_step_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ValueError, match="callable taking no arguments"):
        detlab.audit(torch.zeros(1))  # type: ignore[arg-type]


# --- detlab.batch_invariance -------------------------------------------------------------------------------

class Center(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(0, keepdim=True)  # sample 0's output depends on the batch


def test_batch_invariance_names_the_first_module_that_mixes_samples() -> None:
    model = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Tanh(), Center(), torch.nn.Tanh())
    result = detlab.batch_invariance(model, lambda m, b: m(b[0]), torch.randn(4, 8), batch_sizes=[1, 2, 4])
    assert (result["results"], result["summary"]) == ([], [])
    assert result["model"] == {"workload": "Sequential", "batch_sizes": [1, 2, 4], "invariant": False,
                               "first_module": "2", "first_break": 2}


@pytest.mark.parametrize(("args", "message"), [
    ((torch.nn.Tanh(), lambda m, b: m(b[0]), torch.randn(2, 8)), "at least that many"),
    ((lambda x: x, lambda m, b: m(b[0]), torch.randn(8, 8)), "torch.nn.Module"),
    ((torch.nn.Tanh(), lambda m, b: m(b[0]), [1, 2]), "samples first"),
])
def test_batch_invariance_refuses_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detlab.batch_invariance(*args, batch_sizes=[1, 4])
