"""The preflight table as pure functions: the cuBLAS workspace rule's version conditions (what torch itself checks,
per release), warn_only (a process's setting, never a config's), and one table for a config and a process."""

from __future__ import annotations

from detlab.core import configs, preflight
from detlab.core.preflight import Context, Setup, check, check_setup

DET = Setup("p", {}, deterministic_algorithms=True)


def rules(setup: Setup, ctx: Context) -> list[str]:
    return [f.rule for f in check_setup(setup, ctx)]


def test_the_cublas_rule_fires_where_torch_checks_it_torch_2_9_and_before_on_cuda_10_2_and_after() -> None:
    for torch, cuda in (("2.9.1+cu128", "12.8"), ("1.13.1", "11.7"), ("2.0.0", "10.2")):
        assert rules(DET, Context(device="cuda", torch=torch, cuda=cuda)) == ["cublas-workspace-unset"], torch
    # torch >= 2.10 dropped the check (pytorch#161749); CUDA < 10.2 never had it; a CPU has no cuBLAS
    for ctx in (Context(device="cuda", torch="2.10.0", cuda="12.8"), Context(device="cuda", torch="2.11.0+cu130",
                                                                             cuda="13.0"),
                Context(device="cuda", torch="1.6.0", cuda="10.1"), Context(device="cpu", torch="2.9.0", cuda=None)):
        assert rules(DET, ctx) == [], ctx


def test_the_cublas_rule_takes_only_the_values_torch_accepts_and_claims_nothing_unknown() -> None:
    old = Context(device="cuda", torch="2.9.0", cuda="12.6")
    for value in (":4096:8", ":16:8"):
        assert rules(Setup("p", {"CUBLAS_WORKSPACE_CONFIG": value}, True), old) == []
    wrong = check_setup(Setup("p", {"CUBLAS_WORKSPACE_CONFIG": ":4096:2"}, True), old)
    assert [f.matched for f in wrong] == ["deterministic_algorithms on CUDA 12.6 with torch 2.9.0 and "
                                          "CUBLAS_WORKSPACE_CONFIG=:4096:2"]
    assert rules(DET, Context(device="cuda")) == []  # versions not reported: no claim
    assert rules(Setup("p", {}, False), old) == []


def test_warn_only_is_found_in_a_process_never_in_a_config() -> None:
    assert rules(Setup("p", {}, True, warn_only=True), Context(device="cpu")) == ["deterministic-warn-only"]
    assert rules(Setup("p", {}, False, warn_only=True), Context(device="cpu")) == []
    body = configs.resolve({"preset": "torch-deterministic"})
    assert check(body, Context(device="cpu")) == []


def test_a_config_and_a_process_with_the_same_settings_get_the_same_findings() -> None:
    body = configs.resolve({"preset": "default", "env": {"NCCL_DETERMINISTIC": "1", "NCCL_ALGO": "Tree"}})
    ctx = Context(device="cuda")
    assert check(body, ctx) == check_setup(Setup(body.name, dict(body.env), False), ctx)
    assert [f.rule for f in check(body, ctx)] == ["nccl-algo-tree-gathers", "nccl-no-op-variable"]


def test_versions_parse_to_major_minor() -> None:
    assert preflight.version("2.11.0+cu130") == (2, 11) and preflight.version("10.2") == (10, 2)
    assert preflight.version(None) is None and preflight.version("nightly") is None
