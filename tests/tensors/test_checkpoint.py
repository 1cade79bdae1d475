"""`detlab fingerprint` and `detlab diff` on real checkpoint files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from detlab.tensors import fingerprint as fp
from tests.conftest import ROOT
from tests.tensors.test_fingerprint import three_word_collision


def detlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3, dtype=torch.bfloat16),
            "steps": torch.tensor(7)}


def test_fingerprint_prints_each_tensor_of_a_safetensors_file(tmp_path: Path) -> None:
    save_file(state(), tmp_path / "a.safetensors")
    out = detlab("fingerprint", str(tmp_path / "a.safetensors"), "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["w"]["digest"] == fp.fingerprint(state()["w"])
    assert found["b"] == {"digest": fp.fingerprint(state()["b"]), "shape": [3], "dtype": "bfloat16"}
    old = json.loads(detlab("fingerprint", str(tmp_path / "a.safetensors"), "--json", "--fp-version", "fp1").stdout)
    assert old["w"]["digest"] == fp.fingerprint(state()["w"], key=fp.FP1_KEY) != found["w"]["digest"]


def test_nested_torch_save_checkpoints_get_dotted_names(tmp_path: Path) -> None:
    torch.save({"model": state(), "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}}}, tmp_path / "c.pt")
    found = json.loads(detlab("fingerprint", str(tmp_path / "c.pt"), "--json").stdout)
    assert set(found) == {"model.w", "model.b", "model.steps", "optimizer.state.0.exp_avg"}


def test_diff_is_0_for_identical_checkpoints_across_formats(tmp_path: Path) -> None:
    save_file(state(), tmp_path / "a.safetensors")
    torch.save(state(), tmp_path / "a.pt")
    out = detlab("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "a.pt"))
    assert out.returncode == 0 and "identical" in out.stdout


def test_diff_is_1_and_names_a_one_bit_change_and_missing_tensors(tmp_path: Path) -> None:
    a, b = state(), state()
    b["w"].view(-1)[5:6].view(torch.int32).bitwise_xor_(1)
    del b["steps"]
    b["extra"] = torch.ones(1)
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    out = detlab("diff", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json")
    assert out.returncode == 1
    assert json.loads(out.stdout) == {"mode": "keyed", "differ": ["w"], "only_a": ["steps"], "only_b": ["extra"]}


def test_a_file_that_is_not_a_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint either")
    for name in ("junk.safetensors", "junk.pt", "missing.pt"):
        out = detlab("fingerprint", str(tmp_path / name))
        assert out.returncode == 2 and out.stderr.startswith("error: "), (name, out.stderr)


def test_certificate_is_the_sha256_of_the_tensor_bytes(tmp_path: Path) -> None:
    import hashlib

    save_file(state(), tmp_path / "a.safetensors")
    found = json.loads(detlab("fingerprint", str(tmp_path / "a.safetensors"), "--json", "--certificate").stdout)
    assert found["w"]["sha256"] == hashlib.sha256(state()["w"].numpy().tobytes()).hexdigest()


def test_fingerprint_of_one_element_views_saved_with_their_strides(tmp_path: Path) -> None:
    views = {"step": torch.randn(2)[::2], "column": torch.randn(1, 5).t()[2:3],
             "expanded": torch.randn(3)[1:2].expand(1, 1)}
    torch.save(views, tmp_path / "v.pt")  # torch.save keeps views' strides
    out = detlab("fingerprint", str(tmp_path / "v.pt"), "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    fresh = {n: torch.tensor(v.tolist(), dtype=v.dtype) for n, v in views.items()}  # row-major strides
    assert {n: found[n]["digest"] for n in views} == {n: fp.fingerprint(t) for n, t in fresh.items()}


def quantized() -> torch.Tensor:
    return torch.quantize_per_tensor(torch.randn(5), 0.1, 3, torch.quint8)


# Tensors that torch.load(weights_only=True) gives back but fingerprints refuse: the command names the tensor.
REFUSED = {
    "quantized": (quantized, "quantized"),  # was a SIGSEGV
    "nested": (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
    "meta": (lambda: torch.empty(3, device="meta"), "meta"),
    "sparse": (lambda: torch.eye(3).to_sparse_csr(), "sparse_csr"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_refused_tensor_is_an_error_naming_it(tmp_path: Path, kind: str) -> None:
    build, what = REFUSED[kind]
    torch.save({"model": {"ok": torch.ones(2), "odd": build()}}, tmp_path / "c.pt")
    for args in (["fingerprint", str(tmp_path / "c.pt")], ["diff", str(tmp_path / "c.pt"), str(tmp_path / "c.pt")]):
        out = detlab(*args)
        assert out.returncode == 2, (args, out.returncode, out.stderr[-1000:])
        error = out.stderr.splitlines()[-1]  # after any warning torch.load printed
        assert error.startswith("error: ") and "'model.odd'" in error and what in error, out.stderr


def test_diff_catches_a_pair_that_collides_under_the_public_keys(tmp_path: Path) -> None:
    a, b = three_word_collision(torch.randn(1000, generator=torch.Generator().manual_seed(3)), (17, 260, 451))
    assert fp.fingerprint(a) == fp.fingerprint(b)  # plain fp2 is fooled
    assert fp.fingerprint(a, key=fp.FP1_KEY) == fp.fingerprint(b, key=fp.FP1_KEY)  # and fp1
    assert fp.certificate(a) != fp.certificate(b)
    torch.save({"w": a}, tmp_path / "a.pt")
    save_file({"w": b}, tmp_path / "b.safetensors")
    files = (str(tmp_path / "a.pt"), str(tmp_path / "b.safetensors"))
    for extra, mode in (([], "keyed"), (["--strict"], "strict")):
        out = detlab("diff", *files, *extra)
        assert out.returncode == 1, (extra, out.stdout, out.stderr)
        assert "differs: w" in out.stdout and f"mode: {mode}" in out.stdout
        found = json.loads(detlab("diff", *files, "--json", *extra).stdout)
        assert found == {"mode": mode, "differ": ["w"], "only_a": [], "only_b": []}


def test_diff_strict_is_0_for_identical_checkpoints_and_says_so(tmp_path: Path) -> None:
    save_file(state(), tmp_path / "a.safetensors")
    torch.save(state(), tmp_path / "a.pt")
    out = detlab("diff", "--strict", str(tmp_path / "a.safetensors"), str(tmp_path / "a.pt"))
    assert out.returncode == 0 and "identical" in out.stdout and "mode: strict" in out.stdout, out.stdout
