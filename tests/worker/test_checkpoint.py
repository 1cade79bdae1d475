"""`detlab fingerprint` and `detlab diff` on real checkpoint files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from detlab.worker import fingerprint as fp
from tests.conftest import ROOT


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
    assert json.loads(out.stdout) == {"differ": ["w"], "only_a": ["steps"], "only_b": ["extra"]}


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
