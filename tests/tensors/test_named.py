"""What the recorder takes of a DTensor (detlab.tensors.named): its local shard, its placement, and the ranks
holding replicas of it. One process plays rank 3 of a 2 x 2 mesh through torch's fake process group (no
communication: DTensor.from_local builds the tensor from this rank's shard alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, DTensor, Replicate, Shard, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from detlab.core.wire import Placement
from detlab.tensors.named import ListKey, describe, dtensor_layout, local


@pytest.fixture
def mesh() -> Iterator[DeviceMesh]:
    """Ranks [[0, 1], [2, 3]]; this process is rank 3, at (1, 1)."""
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=4)
    try:
        yield init_device_mesh("cpu", (2, 2))
    finally:
        dist.destroy_process_group()


def test_a_dtensor_is_hashed_and_described_as_its_local_shard(mesh: DeviceMesh) -> None:
    shard = torch.arange(32.0).reshape(8, 4)
    t = DTensor.from_local(shard, mesh, [Replicate(), Shard(0)], run_check=False)
    assert local([t])[0].data_ptr() == shard.data_ptr()
    assert describe([("w", t)]) == [("w", [8, 4], "float32")]


def test_a_shard_replicated_along_one_mesh_dimension_is_a_replica_of_the_lowest_rank_there(mesh: DeviceMesh) -> None:
    # HSDP: Replicate() along dim 0, Shard(0) along dim 1: ranks 1 and 3 hold the same rows
    t = DTensor.from_local(torch.ones(8, 4), mesh, [Replicate(), Shard(0)], run_check=False)
    assert dtensor_layout(t) == (Placement(mesh_shape=[2, 2], placements=["Replicate()", "Shard(dim=0)"],
                                           coordinate=[1, 1], global_shape=[16, 4], offset=[8, 0]), 1)


def test_a_shard_on_no_replicate_dimension_is_no_replica(mesh: DeviceMesh) -> None:
    t = DTensor.from_local(torch.ones(8, 2), mesh, [Shard(0), Shard(1)], run_check=False)
    placement, replica_of = dtensor_layout(t)
    assert (placement.global_shape, placement.offset, replica_of) == ([16, 4], [8, 2], None)


def test_a_list_key_changes_with_anything_that_changes_how_a_tensor_is_read_in_place() -> None:
    """The recorder reuses a list's launch plans while its ListKey stays equal: every change to a tensor that keeps
    its address but changes what its bytes mean must change the key."""
    a, b = torch.randn(4, 4), torch.randn(8)
    key = ListKey([a, b])
    assert key == ListKey([a, b]) and hash(key) == hash(ListKey([a, b])) and key.device == torch.device("cpu")
    same_address = {
        "another shape": b.view(2, 4), "transposed": a.t(), "another dtype": a.view(torch.int32),
        "negative bit": torch._neg_view(a), "conjugate bit": torch.randn(4, dtype=torch.complex64),
    }
    for why, changed in same_address.items():
        first = b if why == "another shape" else a
        if why == "conjugate bit":
            first, changed = changed, changed.conj()
        assert changed.data_ptr() == first.data_ptr(), why
        assert ListKey([first]) != ListKey([changed]), why
    assert ListKey([a, b]) != ListKey([a.clone(), b])  # another address
    assert ListKey([]).device is None
