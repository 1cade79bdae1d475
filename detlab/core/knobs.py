"""The catalogue of determinism knobs that `detlab fix` tries: what each addresses, where it applies, what it is
expected to cost, its source, and how it changes a config. Ordered by expected cost, cheapest first: the search
adds them in this order.

Pure: no database, no torch."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from detlab.core.configs import ConfigBody

Device = Literal["cuda", "cpu"]
NCCL_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
TORCH_RANDOMNESS = "https://docs.pytorch.org/docs/stable/notes/randomness.html"


@dataclass(frozen=True)
class Stack:
    """Where the runs execute: the device of the queue's workers, and the world size (collectives only above 1;
    NCCL only on CUDA, gloo on CPU)."""

    device: Device
    world_size: int

    def describe(self) -> str:
        backend = "nccl" if self.device == "cuda" else "gloo"
        return f"{self.device}, {backend}, world size {self.world_size}"


@dataclass(frozen=True)
class Knob:
    name: str
    addresses: str
    devices: frozenset[Device]
    collective: bool  # acts on NCCL's collectives: only on CUDA and above world size 1
    expected_cost: str
    source: str
    env: tuple[tuple[str, str], ...] = ()
    torch: tuple[tuple[str, Any], ...] = ()
    threads: int | None = None

    def applies(self, stack: Stack) -> str | None:
        """Why the knob cannot matter on the stack; None when it can."""
        if stack.device not in self.devices:
            return f"does not apply on {stack.device}"
        if self.collective and stack.world_size < 2:
            return "no collectives at world size 1"
        return None

    def is_set(self, body: ConfigBody) -> bool:
        """The base config already sets it (trying it would change nothing)."""
        flags = body.torch.model_dump()
        return (all(body.env.get(k) == v for k, v in self.env) and all(flags[k] == v for k, v in self.torch)
                and (self.threads is None or body.threads == self.threads))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "addresses": self.addresses, "devices": sorted(self.devices),
                "collective": self.collective, "expected_cost": self.expected_cost, "source": self.source,
                "sets": {**{f"env.{k}": v for k, v in self.env}, **{f"torch.{k}": v for k, v in self.torch},
                         **({"threads": self.threads} if self.threads else {})}}


CUDA: frozenset[Device] = frozenset({"cuda"})
BOTH: frozenset[Device] = frozenset({"cuda", "cpu"})
CPU: frozenset[Device] = frozenset({"cpu"})

CATALOGUE: tuple[Knob, ...] = (
    Knob("nvls-off", "NVLink SHARP reductions in the switch, whose order NCCL does not fix", CUDA, True,
         "none measurable off NVSwitch systems; loses in-switch reduction bandwidth on them", NCCL_DOCS,
         env=(("NCCL_NVLS_ENABLE", "0"),)),
    Knob("cudnn-benchmark-off", "cuDNN autotuning, which may pick another convolution algorithm each run", CUDA,
         False, "small: the heuristic algorithm instead of the fastest measured one",
         f"{TORCH_RANDOMNESS}#cuda-convolution-benchmarking", torch=(("cudnn_benchmark", False),)),
    Knob("cudnn-deterministic", "cuDNN's nondeterministic convolution algorithms", CUDA, False,
         "small to moderate on convolution-heavy models; nothing without convolutions",
         f"{TORCH_RANDOMNESS}#cuda-convolution-determinism", torch=(("cudnn_deterministic", True),)),
    # torch <= 2.9 refuses deterministic algorithms on CUDA without it (preflight rule cublas-workspace-unset); from
    # torch 2.10 each cuBLAS handle and stream has its own workspace and the variable is not needed.
    Knob("cublas-workspace", "cuBLAS sharing a workspace between streams (torch <= 2.9 also requires it under "
         "deterministic algorithms)", CUDA, False,
         "none measurable; a little device memory", f"{TORCH_RANDOMNESS}#cublas",
         env=(("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),)),
    Knob("deterministic-algorithms", "atomics in scatter/index_add/embedding backward and other kernels with "
         "a nondeterministic implementation", BOTH, False,
         "from none (CPU, where it is often faster) to large on ops whose deterministic kernel is serial",
         f"{TORCH_RANDOMNESS}#avoiding-nondeterministic-algorithms", torch=(("deterministic_algorithms", True),)),
    Knob("tf32-off", "TF32 matmuls and convolutions, whose rounding depends on the kernel chosen", CUDA, False,
         "large on matmul-bound models on Ampere and later (FP32 instead of TF32 tensor cores)",
         "https://docs.pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices",
         torch=(("allow_tf32", False),)),
    Knob("nccl-proto-simple", "LL/LL128 protocols, chosen per message size", CUDA, True,
         "small latency cost on small messages", f"{NCCL_DOCS}#nccl-proto", env=(("NCCL_PROTO", "Simple"),)),
    Knob("nccl-allreduce-tree", "NCCL switching between Ring and Tree all_reduce by message size and rank count",
         CUDA, True, "bandwidth on large all_reduces (Tree is latency-optimised)", f"{NCCL_DOCS}#nccl-algo",
         env=(("NCCL_ALGO", "allreduce:tree"),)),
    Knob("nccl-one-channel", "the split of a collective over channels, which sets the reduction order", CUDA,
         True, "large: one channel uses a fraction of the links' bandwidth", f"{NCCL_DOCS}#nccl-min-nchannels",
         env=(("NCCL_MIN_NCHANNELS", "1"), ("NCCL_MAX_NCHANNELS", "1"), ("NCCL_MIN_CTAS", "1"),
              ("NCCL_MAX_CTAS", "1"))),
    Knob("threads-1", "CPU kernels splitting a reduction or an accumulation over threads", CPU, False,
         "large: one core per rank instead of all of them", "https://docs.pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html",
         threads=1),
)
BY_NAME = {k.name: k for k in CATALOGUE}


def plan(base: ConfigBody, stack: Stack) -> tuple[list[str], list[dict[str, str]]]:
    """The knobs to try on this stack, cheapest first, and those not tried with why (cannot matter here, or the base
    already sets it)."""
    order, skipped = [], []
    for knob in CATALOGUE:
        if why := knob.applies(stack):
            skipped.append({"knob": knob.name, "reason": why})
        elif knob.is_set(base):
            skipped.append({"knob": knob.name, "reason": "already set in the base config"})
        else:
            order.append(knob.name)
    return order, skipped


def apply(base: ConfigBody, names: list[str] | tuple[str, ...]) -> ConfigBody:
    """The base config with the knobs set, named after them ("base" with none)."""
    env, flags, threads = dict(base.env), base.torch.model_dump(), base.threads
    for name in names:
        knob = BY_NAME[name]
        env.update(knob.env)
        flags.update(knob.torch)
        threads = knob.threads or threads
    label = "_".join(names) if names else "base"
    label = label if len(label) <= 59 else f"{len(names)}-knobs.{hashlib.sha1(label.encode()).hexdigest()[:8]}"
    return ConfigBody.model_validate({**base.model_dump(), "name": f"fix.{label}"[:64], "env": env, "torch": flags,
                                      "threads": threads})
