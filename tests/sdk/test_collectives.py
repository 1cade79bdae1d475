"""Collective calls recorded by `detlab.Recorder(collectives=True)` and compared by `detlab compare`: DDP over
gloo under torchrun (tests/sdk/scripts/train_collectives.py), and the wrapped functions in one process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import detlab
from detlab.tensors.collectives import WRAPPED
from detlab.tensors.fingerprint import fingerprint
from tests.ranks import launcher, run_ranks

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_collectives.py"


def record(out: Path, *args: str, ranks: int = 2) -> Path:
    """Run the script under torchrun into `out`."""
    done = run_ranks([*launcher(ranks), str(SCRIPT), str(out), *args], merge_output=True)
    assert done.returncode == 0, done.stdout[-3000:]
    return out


def compare(a: Path, b: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", "compare", str(a), str(b), *options],
                          capture_output=True, text=True, timeout=120)


def verdict(a: Path, b: Path) -> dict[str, Any]:
    return json.loads(compare(a, b, "--json").stdout)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("plain") / "a")


def test_a_bit_planted_in_one_ranks_gradient_is_carried_into_the_allreduce(plain: Path, tmp_path: Path) -> None:
    """Rank 1's gradient gets one flipped bit at step 2 before DDP's bucket allreduce: the first differing call
    is that bucket's allreduce, its input differed on rank 1, so the difference was carried in."""
    planted = record(tmp_path / "b", "--plant", "2:1")
    result = verdict(plain, planted)
    first = result["collectives"]["first"]
    assert (first["step"], first["seq"], first["op"]) == (2, 0, "ddp_allreduce")
    assert first["cause"] == "carried" and first["input_ranks_differing"] == [1] and first["ranks"] == [0, 1]
    assert result["verdict"] == "diverged" and result["first_divergent_step"] == 2


def test_a_reduction_summed_in_another_order_is_blamed_with_matched_inputs(tmp_path: Path) -> None:
    """What is planted: the script replaces all_reduce, at the process-group level, by an all_gather and a sum
    of the 3 ranks' tensors in rank order (run A) or in reverse rank order (run B). The inputs are the same and
    only the association of the float sums changes, as it does between NCCL's ring and tree."""
    forward = record(tmp_path / "f", "--reduce-order", "forward", ranks=3)
    reverse = record(tmp_path / "r", "--reduce-order", "reverse", ranks=3)
    result = verdict(forward, reverse)
    first = result["collectives"]["first"]
    assert first["cause"] == "reduction-order" and first["input_ranks_differing"] == []
    assert (first["step"], first["seq"], first["op"], first["group_size"]) == (0, 0, "ddp_allreduce", 3)
    assert first["digests"]["a"]["input"] == first["digests"]["b"]["input"]
    assert first["digests"]["a"]["output"] != first["digests"]["b"]["output"]
    assert first["nccl"] == {"a": None, "b": None}  # gloo: no NCCL log
    text = compare(forward, reverse).stdout
    assert ("first differing collective: step 0 call 0 ddp_allreduce float32 x193 over 3 ranks on rank(s) 0, 1, 2: "
            "inputs matched → reduction order/topology") in text


def test_recording_the_collectives_leaves_the_training_bit_equal(plain: Path, tmp_path: Path) -> None:
    """The DDP hook divides each bucket by the group size and sums it, as torch's default hook does: at 2 ranks
    the parameters are bit-equal to DDP's own C++ allreduce's."""
    result = verdict(plain, record(tmp_path / "b", "--no-collectives"))
    assert result["verdict"] == "identical" and result["steps_compared"] == 4
    assert result["collectives"]["status"] == "not-recorded"


def _drop_positions(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in dst.glob("rank*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "position"}) + "\n" for r in lines))
    return dst


def test_runs_whose_ranks_are_numbered_the_other_way_round_line_up_by_position(plain: Path, tmp_path: Path) -> None:
    """Rank r of run B takes data-parallel position 1-r (its batch shard, its BatchNorm statistics): by position
    the runs are identical, collective calls included; by rank number they are not."""
    swapped = record(tmp_path / "b", "--reversed-positions")
    result = verdict(plain, swapped)
    assert result["verdict"] == "identical", result
    assert result["collectives"]["status"] == "identical" and result["collectives"]["calls_compared"] == 16
    assert "lined up by logical position (dp)" in result["reason"]
    by_number = verdict(_drop_positions(plain, tmp_path / "pa"), _drop_positions(swapped, tmp_path / "pb"))
    assert by_number["verdict"] == "diverged" and by_number["collectives"]["status"] == "identical"


# ---- the wrapped functions, in one process (a gloo group of one rank) -----------------------------------------

@pytest.fixture
def group() -> Any:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _calls(out: Path) -> list[dict[str, Any]]:
    return [r for line in (out / "rank0.jsonl").read_text().splitlines() if (r := json.loads(line))["type"] == "calls"]


def test_each_call_records_what_it_was_and_the_digests_of_its_input_and_output(group: Any, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    x = torch.arange(6, dtype=torch.float32)
    gathered = torch.empty(6)
    parts = [torch.empty(6)]
    with detlab.Recorder(out=tmp_path, collectives=True) as rec:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(gathered, x.to(torch.float32))
        dist.all_gather(parts, x)
        rec.step(0, model)
    [record] = _calls(tmp_path)
    assert [(c["op"], c["dtype"], c["count"], c["group_size"]) for c in record["calls"]] == [
        ("all_reduce", "float32", 6, 1), ("all_gather_into_tensor", "float32", 6, 1), ("all_gather", "float32", 6, 1)]
    digest = fingerprint(x).split(":")[1]
    assert record["inputs"] == digest * 3 and record["outputs"] == digest * 3 and record["unread"] == []


def test_an_async_call_is_read_when_waited_for_and_unread_otherwise(group: Any, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    with detlab.Recorder(out=tmp_path, collectives=True) as rec:
        dist.all_reduce(torch.ones(3), async_op=True).wait()
        dist.all_reduce(torch.ones(4), async_op=True)  # never waited for
        rec.step(0, model)
    [record] = _calls(tmp_path)
    assert record["unread"] == [1] and record["outputs"][32:] == "0" * 32
    assert record["outputs"][:32] == fingerprint(torch.ones(3)).split(":")[1]


def test_closing_the_recorder_puts_every_function_back(group: Any, tmp_path: Path) -> None:
    originals = {name: getattr(dist, name) for name in WRAPPED}
    rec = detlab.Recorder(out=tmp_path, collectives=True)
    assert dist.all_reduce is not originals["all_reduce"]
    rec.close()
    assert {name: getattr(dist, name) for name in originals} == originals
    assert dist.distributed_c10d.all_reduce is originals["all_reduce"]


def test_a_position_must_be_small_whole_numbers_by_dimension(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="position"):
        detlab.Recorder(out=tmp_path, position={"dp": -1})
    with pytest.raises(ValueError, match="position"):
        detlab.Recorder(out=tmp_path, position={"": 0})


def test_hook_ddp_needs_collectives(tmp_path: Path) -> None:
    with detlab.Recorder(out=tmp_path) as rec, pytest.raises(ValueError, match="collectives=True"):
        rec.hook_ddp(torch.nn.Linear(1, 1))


def test_a_device_mesh_gives_this_ranks_position_by_its_dimension_names(group: Any, tmp_path: Path) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with detlab.Recorder(out=tmp_path, position=mesh) as rec:
        rec.step(0, torch.nn.Linear(2, 2))
    env = json.loads((tmp_path / "rank0.jsonl").read_text().splitlines()[0])
    assert env["type"] == "env" and env["position"] == {"dp": 0, "tp": 0}
    with pytest.raises(ValueError, match="mesh_dim_names"):
        detlab.Recorder(out=tmp_path / "b", position=init_device_mesh("cpu", (1,)))
