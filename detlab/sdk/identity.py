"""Who this process is in a run: rank, world size and local rank, as torchrun and torch.distributed say."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """A process's place in a run."""

    rank: int
    world_size: int
    local_rank: int


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; torchrun sets it, or unset it for one process") from None


def from_env(env: Mapping[str, str] | None = None) -> Identity:
    """The identity torchrun-style launchers give (RANK, WORLD_SIZE, LOCAL_RANK); one process without them."""
    env = os.environ if env is None else env
    rank, world = _env_int(env, "RANK", 0), _env_int(env, "WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside WORLD_SIZE={world}; a rank lies in [0, WORLD_SIZE)")
    return Identity(rank=rank, world_size=world, local_rank=_env_int(env, "LOCAL_RANK", rank))


def current() -> Identity:
    """This process's identity: torch.distributed's when a process group is initialised (it is what the
    collectives use), else the launcher's environment."""
    import torch.distributed as dist

    found = from_env()
    if dist.is_available() and dist.is_initialized():
        return Identity(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=found.local_rank)
    return found


def backend() -> str | None:
    """The default process group's backend (gloo, nccl, ...), or None without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return str(dist.get_backend())
    return None
