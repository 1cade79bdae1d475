"""This process's stack, for an `env` record: host, device, driver and library versions, the environment and the
torch flags in effect, and what the preflight table finds in them; and the torch flags a config asks for, applied.
The built-in ranks and the SDK's Recorder both record it."""

from __future__ import annotations

import os
import platform

import torch

from detlab.core import preflight
from detlab.core.configs import ENV_PREFIXES, ENV_VALIDATORS, TorchFlags
from detlab.core.wire import EnvRecord, PreflightFinding, TorchFacts
from detlab.tensors import fingerprint as fp


def apply_torch_flags(flags: TorchFlags) -> None:
    torch.use_deterministic_algorithms(flags.deterministic_algorithms)
    torch.backends.cudnn.deterministic = flags.cudnn_deterministic
    torch.backends.cudnn.benchmark = flags.cudnn_benchmark
    torch.backends.cuda.matmul.allow_tf32 = flags.allow_tf32
    torch.backends.cudnn.allow_tf32 = flags.allow_tf32


def effective_torch_flags() -> TorchFacts:
    """What torch reports at run time, to set beside what the config requested."""
    return TorchFacts(
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_deterministic=torch.backends.cudnn.deterministic,
        cudnn_benchmark=torch.backends.cudnn.benchmark,
        allow_tf32=torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32,
        num_threads=torch.get_num_threads(),
    )


def effective_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ENV_VALIDATORS or k.startswith(ENV_PREFIXES)}


def preflight_findings(device: torch.device, backend: str | None) -> list[PreflightFinding]:
    """The preflight table (detlab.core.preflight, the rules jobs are refused by) against this process's settings
    as torch reports them: its environment, deterministic algorithms and warn_only, the torch and CUDA runtime
    versions. NCCL's rules count only where NCCL carries the collectives (backend nccl)."""
    setup = preflight.Setup("this process", effective_env(), torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled())
    ctx = preflight.Context(ops=preflight.TRAIN_OPS if backend == "nccl" else frozenset(),
                            device="cuda" if device.type == "cuda" else "cpu", torch=torch.__version__,
                            cuda=torch.version.cuda)
    return [PreflightFinding(rule=f.rule, matched=f.matched, reason=f.reason, fix=f.fix, source=f.source)
            for f in preflight.check_setup(setup, ctx)]


def env_record(rank: int, device: torch.device, backend: str,
               findings: list[PreflightFinding] | None = None) -> EnvRecord:
    """This rank's stack: host, device, driver and library versions, environment and torch flags in effect, and
    the preflight findings on them (`findings`: as already checked; None: checked here)."""
    cuda = device.type == "cuda"
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    driver = None
    if cuda:
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            driver = None
    return EnvRecord(
        rank=rank,
        host=platform.node(),
        device=torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        driver=driver,
        cuda=torch.version.cuda if cuda else None,
        hip=getattr(torch.version, "hip", None),
        torch=torch.__version__,
        nccl=nccl,
        backend=backend,
        fingerprint_impl=fp.implementation_name(device),
        effective_env=effective_env(),
        torch_flags=effective_torch_flags(),
        preflight=findings if findings is not None else preflight_findings(device, backend),
    )
