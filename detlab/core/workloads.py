"""What the server knows of a workload without importing it: name, description, batch, steps.

The built-ins are described here; their code lives in the worker. A team's own workloads are
registered on its worker nodes (entry-point group `detlab.workloads`) and reach the server in the
workers' heartbeats, since the API process need not have them installed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from detlab.core.text import StorableText

GROUP = "detlab.workloads"


class WorkloadInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    description: StorableText = Field(default="", max_length=500)  # kept in workers.info (json)
    global_batch: int = Field(ge=1, le=1 << 20)
    default_steps: int = Field(ge=1, le=1_000_000)
    # A team's training script registered on a worker (`detlab worker --scripts FILE`), not a built-in, and
    # the world sizes it supports (None: any the workers can hold).
    script: bool = False
    world_sizes: tuple[int, ...] | None = Field(default=None, max_length=64)


BUILTIN: dict[str, WorkloadInfo] = {w.name: w for w in (
    WorkloadInfo(name="mlp", description="3-layer MLP (64 -> 512 -> 512 -> 10) on synthetic Gaussian data, "
                 "cross-entropy", global_batch=64, default_steps=20),
    WorkloadInfo(name="tiny-lm", description="2-layer causal transformer LM (d=64, 4 heads, vocab 256, context 32) "
                 "on synthetic tokens", global_batch=16, default_steps=20),
    WorkloadInfo(name="scatter", description="message passing with index_add_ and index_put_(accumulate=True): "
                 "nondeterministic on CUDA (and index_put_ on multi-threaded CPU) unless deterministic "
                 "algorithms are on",
                 global_batch=8, default_steps=20),
)}
