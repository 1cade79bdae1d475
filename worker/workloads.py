"""Built-in workloads. Each keeps a fixed global batch that ranks split evenly, so runs at different
world sizes compute the same mathematics up to reduction order.

Registered through the `detlab.workloads` entry-point group; teams add theirs the same way and the
worker advertises them to the server in its heartbeat. The built-ins' descriptions live in the core
(`detlab.core.workloads`), which the server reads without importing this module.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, ClassVar

from detlab.core.workloads import BUILTIN, GROUP, WorkloadInfo

if TYPE_CHECKING:
    import torch

class Workload(ABC):
    """Base class: build a model, make the global batch of a step, compute the loss of a slice."""

    info: ClassVar[WorkloadInfo]

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def global_batch(self) -> int:
        return self.info.global_batch

    @abstractmethod
    def build(self) -> torch.nn.Module:
        """A freshly initialised model (seeded by the caller)."""

    @abstractmethod
    def batch(self, step: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The whole global batch of `step`: a function of (seed, step) only, never of rank or world size."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean loss over a rank's slice of the batch."""


def _generator(seed: int, step: int) -> torch.Generator:
    import torch

    # Data depend on (seed, step) only: every rank and every world size sees the same global batch.
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class MLP(Workload):
    info = BUILTIN["mlp"]

    def build(self) -> torch.nn.Module:
        from torch import nn

        return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def batch(self, step: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        import torch

        g = _generator(seed, step)
        x = torch.randn(self.global_batch, 64, generator=g)
        y = torch.randint(0, 10, (self.global_batch,), generator=g)
        return x.to(device), y.to(device)

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        from torch.nn import functional as F

        x, y = batch
        return F.cross_entropy(model(x), y)


class TinyLM(Workload):
    info = BUILTIN["tiny-lm"]
    vocab, context, width = 256, 32, 64

    def build(self) -> torch.nn.Module:
        import torch
        from torch import nn

        vocab, context, width = self.vocab, self.context, self.width

        class LM(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(vocab, width)
                self.pos = nn.Parameter(torch.zeros(context, width))
                layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True,
                                                   norm_first=True)
                self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.norm = nn.LayerNorm(width)
                self.head = nn.Linear(width, vocab)

            def forward(self, tokens: torch.Tensor) -> torch.Tensor:
                n = tokens.shape[1]
                mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
                h = self.blocks(self.embed(tokens) + self.pos[:n], mask=mask, is_causal=True)
                return self.head(self.norm(h))

        return LM()

    def batch(self, step: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        import torch

        g = _generator(seed, step)
        tokens = torch.randint(0, self.vocab, (self.global_batch, self.context + 1), generator=g)
        return tokens[:, :-1].to(device), tokens[:, 1:].to(device)

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        from torch.nn import functional as F

        x, y = batch
        return F.cross_entropy(model(x).reshape(-1, self.vocab), y.reshape(-1))


class Scatter(Workload):
    info = BUILTIN["scatter"]
    # Edges enough that one index_put_ takes ~5 ms at 2 threads: on a busy machine, where its two threads share
    # a core, the scheduler then switches between them inside the call, so re-runs still add in other orders. At
    # 16384 edges (1.3 ms) two of six audits at --threads 2 on a loaded 2-core machine saw no race at all.
    nodes, edges, width = 2048, 65536, 32

    def build(self) -> torch.nn.Module:
        import torch
        from torch import nn

        nodes, edges, width = self.nodes, self.edges, self.width
        g = torch.Generator().manual_seed(12345)
        src = torch.randint(0, nodes, (edges,), generator=g)
        dst = torch.randint(0, nodes, (edges,), generator=g)

        class Net(nn.Module):
            src: torch.Tensor
            dst: torch.Tensor

            def __init__(self) -> None:
                super().__init__()
                self.register_buffer("src", src, persistent=False)
                self.register_buffer("dst", dst, persistent=False)
                self.msg = nn.Linear(width, width)
                self.out = nn.Linear(width, 1)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                outs = []
                for graph in x:  # (nodes, width) per graph
                    m = torch.tanh(self.msg(graph))[self.src]
                    agg = torch.zeros_like(graph).index_add_(0, self.dst, m)
                    agg = agg.index_put_((self.dst,), m, accumulate=True)
                    outs.append(self.out(agg))
                return torch.stack(outs)

        return Net()

    def batch(self, step: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        import torch

        g = _generator(seed, step)
        x = torch.randn(self.global_batch, self.nodes, self.width, generator=g)
        y = torch.randn(self.global_batch, self.nodes, 1, generator=g)
        return x.to(device), y.to(device)

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        from torch.nn import functional as F

        x, y = batch
        return F.mse_loss(model(x), y)


def registry() -> dict[str, type[Workload]]:
    """Every registered workload class by name (loading imports no torch for the built-ins)."""
    found: dict[str, type[Workload]] = {}
    for ep in entry_points(group=GROUP):
        cls = ep.load()
        found[ep.name] = cls
    return found


def describe() -> list[WorkloadInfo]:
    """What this worker can run, as the server is told in heartbeats: workload classes, then scripts."""
    from detlab.worker.scripts import registered

    return ([cls.info.model_copy(update={"name": name}) for name, cls in sorted(registry().items())]
            + [script.info() for _, script in sorted(registered().items())])
