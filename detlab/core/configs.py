"""Configs: the allow-listed knobs of a run, their validation, presets, canonical form and diff.

Pure: no database, no torch. Nothing a browser sends is executed; env values only ever reach a
child process's environment (never a shell), and are still held to a strict character set.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from detlab.core.text import escaped, storable

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# No shell metacharacters ($ ` ; | & < > quotes, spaces, newlines) and no '/' (no knob we allow takes a
# path, and NCCL opens some values as files, e.g. NCCL_PROXY_PROFILE) in any value.
SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:=+^-]{0,256}$")

LIST_VARS = {"NCCL_ALGO", "NCCL_PROTO"}
NCCL_ALGOS = {"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}
NCCL_PROTOS = {"ll", "ll128", "simple"}


def _int_range(lo: int, hi: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if not re.fullmatch(r"\d{1,12}", value) or not lo <= int(value) <= hi:
            return f"must be an integer in [{lo}, {hi}]"
        return None

    return check


NCCL_FUNCS = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send", "recv"}


def _choice_list(choices: set[str]) -> Callable[[str], str | None]:
    """NCCL's list syntax: `a,b`, `^a` (all but), and since 2.24 per function `a;allreduce:b;broadcast:^c`."""

    def check(value: str) -> str | None:
        items: list[str] = []
        for i, segment in enumerate(value.split(";")):
            func, sep, spec = segment.rpartition(":")
            if sep and func.lower() not in NCCL_FUNCS:
                return f"unknown function {func!r} before ':'; expected one of {sorted(NCCL_FUNCS)}"
            if not sep and i:
                return "every segment after the first needs a function prefix, as in 'allreduce:tree'"
            items += spec.removeprefix("^").split(",")
        bad = [i for i in items if i.lower() not in choices]
        if bad:
            return f"unknown value(s) {bad}; expected a comma list of {sorted(choices)}, optionally after '^'"
        return None

    return check


def _regex(pattern: str, hint: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if re.fullmatch(pattern, value) else hint

    return check


_bool01 = _regex(r"[01]", "must be 0 or 1")
_devices = _regex(r"[A-Za-z0-9-]+(,[A-Za-z0-9-]+)*", "must be a comma list of device indices or UUIDs")

# Exact names with their own validator.
ENV_VALIDATORS: dict[str, Callable[[str], str | None]] = {
    "NCCL_ALGO": _choice_list(NCCL_ALGOS),
    "NCCL_PROTO": _choice_list(NCCL_PROTOS),
    "NCCL_MIN_NCHANNELS": _int_range(1, 64),
    "NCCL_MAX_NCHANNELS": _int_range(1, 64),
    "NCCL_MIN_CTAS": _int_range(1, 64),
    "NCCL_MAX_CTAS": _int_range(1, 64),
    "NCCL_NTHREADS": _int_range(64, 1024),
    "NCCL_BUFFSIZE": _int_range(1024, 1 << 31),
    "NCCL_NVLS_ENABLE": _bool01,
    "NCCL_COLLNET_ENABLE": _bool01,
    "NCCL_P2P_DISABLE": _bool01,
    "NCCL_SHM_DISABLE": _bool01,
    "NCCL_IB_DISABLE": _bool01,
    "NCCL_DEBUG": _regex(r"(?i)(VERSION|WARN|INFO|TRACE|ABORT)", "must be VERSION, WARN, INFO, TRACE or ABORT"),
    "NCCL_DEBUG_SUBSYS": _regex(r"\^?[A-Z_]+(,[A-Z_]+)*", "must be a comma list of subsystems"),
    "RCCL_MSCCL_ENABLE": _bool01,
    "RCCL_MSCCLPP_ENABLE": _bool01,
    "CUBLAS_WORKSPACE_CONFIG": _regex(r"(:\d{1,6}:\d{1,4})+", "must look like :4096:8 or :16:8"),
    "OMP_NUM_THREADS": _int_range(1, 1024),
    "MKL_NUM_THREADS": _int_range(1, 1024),
    "PYTHONHASHSEED": lambda v: None if v == "random" else _int_range(0, 2**32 - 1)(v),
    "CUDA_LAUNCH_BLOCKING": _bool01,
    "CUDA_VISIBLE_DEVICES": _devices,
    "HIP_VISIBLE_DEVICES": _devices,
    "ROCR_VISIBLE_DEVICES": _devices,
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": _int_range(0, 3),
}
# Other NCCL_/RCCL_ tuning knobs pass with the generic value check, except those that name files
# or plugins: a browser must never make a rank load a library or write to a path.
ENV_PREFIXES = ("NCCL_", "RCCL_")
ENV_DENY_RE = re.compile(r"(_FILE|_PLUGIN|_PATH|_DIR|_LIB|_CONF|_PROFILE)$|^NCCL_(NET|TUNER|PROFILER)$")
# Set by the worker itself; a config may not override where logs go or how ranks find each other.
WORKER_OWNED = {"NCCL_DEBUG_FILE", "NCCL_COMM_ID", "NCCL_HOSTID", "MASTER_ADDR", "MASTER_PORT", "RANK",
                "LOCAL_RANK", "WORLD_SIZE"}


def env_name_error(name: str) -> str | None:
    """Why NAME may not be set by a config, whatever its value, or None when it may."""
    if name in WORKER_OWNED:
        return f"{name} is set by the worker, not by a config"
    if name not in ENV_VALIDATORS:
        if not name.startswith(ENV_PREFIXES) or not re.fullmatch(r"[A-Z0-9_]{1,64}", name):
            shown = escaped(name if len(name) <= 80 else name[:77] + "...")
            return f"{shown} is not an allowed variable (allowed: {sorted(ENV_VALIDATORS)} and other NCCL_*/RCCL_*)"
        if ENV_DENY_RE.search(name):
            return f"{name} names a file or plugin and is not allowed"
    return None


def env_error(name: str, value: str) -> str | None:
    """Why NAME=VALUE is not allowed in a config, or None when it is."""
    if problem := env_name_error(name):
        return problem
    validator = ENV_VALIDATORS.get(name)
    # ';' only where NCCL's per-function grammar is parsed in full below (values never reach a shell).
    if not SAFE_VALUE_RE.fullmatch(value.replace(";", "") if name in LIST_VARS else value):
        return f"{name}: value {value!r} has characters outside [A-Za-z0-9_.,:=+^-] or is over 256 long"
    problem = validator(value) if validator else None
    return f"{name}: {problem}" if problem else None


class TorchFlags(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deterministic_algorithms: bool = False
    cudnn_deterministic: bool = False
    cudnn_benchmark: bool = False
    allow_tf32: bool = True


class ConfigBody(BaseModel):
    """A config as users write it (the JSON interface of configs)."""

    model_config = ConfigDict(extra="forbid")
    _text = field_validator("*")(storable)

    name: str = "custom"
    env: dict[str, str] = Field(default_factory=dict)
    torch: TorchFlags = Field(default_factory=TorchFlags)
    seed: int = Field(default=0, ge=0, lt=2**32)
    world_size: int | None = Field(default=None, ge=1, le=1024)
    threads: int | None = Field(default=None, ge=1, le=256)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("name must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("env must be an object of NAME: value strings")
        if len(v) > 64:
            raise ValueError("env has more than 64 variables")
        errors = []
        for name, value in v.items():
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                errors.append(f"{name}: value must be a string")
                continue
            problem = env_error(str(name), str(value))
            if problem:
                errors.append(problem)
        if errors:
            raise ValueError("; ".join(errors))
        return {str(k): str(val) for k, val in v.items()}


_DET_TORCH = {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
              "allow_tf32": False}
# Tree for all_reduce only: NCCL 2.28 has no Tree algorithm for AllGather, and a global NCCL_ALGO=Tree
# fails DDP's start-up (measured on 2x H200). The per-function syntax needs NCCL >= 2.24.
_TREE_1CH = {"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "1",
             "NCCL_MAX_NCHANNELS": "1", "NCCL_MIN_CTAS": "1", "NCCL_MAX_CTAS": "1"}

PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": ("The fast default: library heuristics pick algorithms; cuDNN autotuning and TF32 on.",
                {"torch": {"cudnn_benchmark": True}}),
    "torch-deterministic": ("torch.use_deterministic_algorithms, cuDNN deterministic, TF32 off, "
                            "CUBLAS_WORKSPACE_CONFIG=:4096:8.",
                            {"torch": _DET_TORCH, "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}}),
    "nccl-tree-simple-1ch": ("NCCL Tree for all_reduce (NCCL >= 2.24 syntax), Simple protocol, one channel "
                             "(NCHANNELS and CTAS).",
                             {"env": _TREE_1CH}),
    "nccl-ring-simple": ("NCCL Ring algorithm with the Simple protocol.",
                         {"env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}}),
    "full-deterministic": ("The full recipe: PyTorch deterministic mode plus NCCL Tree (all_reduce) + Simple + "
                           "1 channel.",
                           {"torch": _DET_TORCH, "env": {**_TREE_1CH, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}}),
}


def preset(name: str) -> ConfigBody:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {sorted(PRESETS)}")
    return ConfigBody.model_validate({"name": name, **PRESETS[name][1]})


def resolve(ref: dict[str, Any]) -> ConfigBody:
    """A config reference from a job: {"preset": name} optionally with overrides, or a full config.

    Omitted keys take the named preset's values, or the `default` preset's; `env` and `torch`
    overrides are merged into the preset's."""
    if not isinstance(ref, dict):
        raise ValueError("a config must be an object")
    overrides = {k: v for k, v in ref.items() if k != "preset"}
    name = ref.get("preset", "default")
    if not isinstance(name, str):
        raise ValueError(f"preset must be the name of one, as a string; presets: {sorted(PRESETS)}")
    base = preset(name).model_dump()
    if "name" not in overrides and "preset" not in ref:
        base["name"] = "custom"
    merged = {**base, **overrides}
    for key in ("torch", "env"):  # a fork adds to the preset's knobs rather than dropping them
        if isinstance(overrides.get(key), dict):
            merged[key] = {**base[key], **overrides[key]}
    return ConfigBody.model_validate(merged)


def canonical_json(body: ConfigBody) -> str:
    return json.dumps(body.model_dump(), sort_keys=True, separators=(",", ":"))


def content_hash(body: ConfigBody) -> str:
    """Hash of the knobs only: the same knobs under another name hash the same."""
    knobs = body.model_dump(exclude={"name"})
    return hashlib.sha256(json.dumps(knobs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def flatten(body: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Keys whose values differ between two config bodies, dotted (env.NCCL_ALGO), sorted."""
    fa, fb = flatten(a), flatten(b)
    return [{"key": k, "a": fa.get(k), "b": fb.get(k)} for k in sorted(fa.keys() | fb.keys())
            if k != "name" and fa.get(k) != fb.get(k)]
