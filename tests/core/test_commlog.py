"""NCCL/RCCL debug log parsing (detlab.core.commlog) against real public log excerpts."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.commlog_coverage import holds, score
from detlab.core.commlog import check_effective, diff_facts, empty_result, main, parse, strip_prefix
from tests.conftest import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "commlogs"
# Logs written for the coverage measure (bench/commlog_coverage.py): "unseen" before the parser was
# fixed against them, "heldout" after, never used to fix it.
COVERAGE_SETS = [FIXTURES / "unseen", FIXTURES / "heldout"]
COVERAGE_LOGS = sorted(p for d in COVERAGE_SETS for p in d.glob("*.log"))
KEYS = set(empty_result())


def facts(name: str) -> dict:
    return parse((FIXTURES / name).read_text())


def choice_tuples(parsed: dict) -> set[tuple]:
    return {(c["op"], c["bytes"], c["algo"], c["proto"], tuple(c["channels"] or ())) for c in parsed["choices"]}


# --- per-fixture facts -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "library", "version", "nranks"),
    [
        ("nccl-2.4.8-warn-single-process-issue257.log", "NCCL", "2.4.8", 4),
        ("nccl-2.5.6-mpirun-issue300.log", "NCCL", "2.5.6", None),
        ("nccl-2.10.3-two-node-ib-nccltests133.log", "NCCL", "2.10.3", None),
        ("nccl-2.10.3-ib-lassen-issue566.log", "NCCL", "2.10.3", None),
        ("nccl-2.14.3-ray-raytrainworker-nccl1212.log", "NCCL", "2.14.3", None),
        ("nccl-2.20.5-vllm-ray-warn-nccl1297.log", "NCCL", "2.20.5", None),
        ("nccl-2.27.5-torchrun-rank-prefix.log", "NCCL", "2.27.5", None),
        ("nccl-2.27.5-tuning-by-name-interleaved-sglang.log", "NCCL", None, 16),
        ("nccl-aws-timestamp-lines-ofi715.log", "NCCL", None, 16),
        ("nccl-ray-pid-prefix-ray16979.log", "NCCL", None, None),
        ("rccl-2.22.3-banner-vllm390.log", "RCCL", "2.22.3", None),
        ("rccl-2.18.3-gtest-warn-rccl908.log", "RCCL", "2.18.3", None),
        ("rccl-msccl-rocm6.0-rccl1137.log", "RCCL", None, None),
        ("synthetic-torn-torchrun-default-prefix.log", "NCCL", "2.10.3", None),
        ("nccl-2.28.9-h200-w1-ddp-default-detlab.log", "NCCL", "2.28.9", 1),
        ("nccl-2.28.9-h200-w1-ddp-tree-simple-1ch-detlab.log", "NCCL", "2.28.9", 1),
    ],
)
def test_fixture_library_version_nranks(name: str, library: str, version: str | None, nranks: int | None) -> None:
    parsed = facts(name)
    assert (parsed["library"], parsed["version"], parsed["nranks"]) == (library, version, nranks)


def test_nccl_tests_header_gives_ranks_and_nodes() -> None:
    parsed = facts("nccl-2.4.8-warn-single-process-issue257.log")
    assert parsed["ranks"][2] == {"rank": 2, "host": "jupyter-vmarkovtsev", "pid": 15833, "device": 2, "bus_id": "0x82"}
    assert parsed["nnodes"] == 1
    assert parsed["network"] == "Socket"
    assert parsed["warnings"] == ["Failed to open libibverbs.so[.1]"]


def test_mpirun_log_network_falls_back_to_socket() -> None:
    parsed = facts("nccl-2.5.6-mpirun-issue300.log")
    assert parsed["network"] == "Socket"
    assert parsed["processes"] == ["5873af64cf59:10158", "5873af64cf59:10160", "5873af64cf59:10161"]


def test_2_5_trees_and_shm_with_bus_id_brackets() -> None:
    parsed = facts("nccl-2.5.6-trees-issue300.log")
    assert parsed["transports"] == ["SHM"]
    assert {"channel": 0, "rank": 3, "parent": 2, "children": []} in parsed["tree_orders"]
    assert {"channel": 1, "rank": 1, "parent": 3, "children": []} in parsed["tree_orders"]
    assert {r["rank"]: r["bus_id"] for r in parsed["ranks"]} == {0: "80", 1: "90", 2: "c0", 3: "b0"}


def test_slot_prefixed_2_5_log() -> None:
    parsed = facts("nccl-2.5.6-slot-prefix-issue302.log")
    assert parsed["transports"] == ["P2P/IPC"]
    assert parsed["network"] == "IB"
    assert {"channel": 3, "rank": 155, "parent": 154, "children": [153, 146, 162]} in parsed["tree_orders"]
    assert next(r for r in parsed["ranks"] if r["rank"] == 157)["bus_id"] == "b2000"


def test_two_node_ib_env_ring_and_trees() -> None:
    parsed = facts("nccl-2.10.3-two-node-ib-nccltests133.log")
    assert parsed["env"] == {"NCCL_IB_GID_INDEX": "3"}
    assert parsed["network"] == "IB"
    assert parsed["nchannels"] == 2
    assert parsed["ring_orders"] == [{"channel": 0, "order": [0, 7, 6, 5, 12, 11, 10, 9, 8, 15, 14, 13, 4, 3, 2, 1]}]
    assert {"channel": 1, "rank": 12, "parent": None, "children": [13, 4]} in parsed["tree_orders"]


def test_lassen_ring_orders_six_channels() -> None:
    parsed = facts("nccl-2.10.3-ib-lassen-issue566.log")
    assert parsed["nchannels"] == 6
    assert [r["channel"] for r in parsed["ring_orders"]] == [0, 1, 2, 3, 4]


def test_vllm_ray_env_echoes_and_warn_without_file_prefix() -> None:
    parsed = facts("nccl-2.20.5-vllm-ray-warn-nccl1297.log")
    assert parsed["env"] == {"NCCL_SOCKET_IFNAME": "ens121f1", "NCCL_IB_HCA": "rxe0"}
    assert parsed["warnings"] == ["Could not find real path of rxe0 (/sys/class/infiniband/rxe0/device)"]
    assert parsed["network"] == "IB"


def test_mpirun_timestamped_warnings_are_distinct_texts() -> None:
    parsed = facts("nccl-2.18.3-mpirun-timestamp-warn-issue957.log")
    assert parsed["warnings"][0] == "Cuda failure 'invalid argument'"
    assert len(parsed["warnings"]) == 4
    assert parsed["processes"] == ["tomte401:1850301", "tomte401:1850304"]


def test_k8s_timestamps_and_short_header_warn() -> None:
    parsed = facts("nccl-k8s-timestamp-warn-issue1920.log")
    assert parsed["warnings"] == [
        "socketProgressOpt: Call to send to 10.44.137.149<52905> failed : Connection reset by peer"
    ]


def test_sglang_by_name_choice_ranks_and_init() -> None:
    parsed = facts("nccl-2.27.5-tuning-by-name-interleaved-sglang.log")
    assert choice_tuples(parsed) == {("AllReduce", 4, "RING", "SIMPLE", (0, 0))}
    assert parsed["init_complete"] is True
    assert parsed["ranks"][0] == {"rank": 0, "host": "tpgds-aihub0007", "pid": 185302, "device": 0, "bus_id": "18000"}
    assert parsed["env"]["NCCL_IB_DISABLE"] == "0"
    assert parsed["warnings"][0].startswith("NET/IB: Got completion from peer 10.99.91.63<51161> with status=4")


def test_aws_ranks_have_bus_ids() -> None:
    parsed = facts("nccl-aws-timestamp-lines-ofi715.log")
    assert [r["rank"] for r in parsed["ranks"]] == [0, 1, 2, 3, 4, 5, 6]
    assert parsed["ranks"][5]["bus_id"] == "901d0"
    assert parsed["init_complete"] is False


def test_socket_shm_slot_tags_and_coll_channels() -> None:
    parsed = facts("nccl-socket-shm-slot-prefix-issue1232.log")
    assert parsed["transports"] == ["NET/Socket", "SHM"]
    assert parsed["nchannels"] == 2
    # >= 2.17 log: the bracket after a rank is its device, not its busId
    assert {r["rank"]: r["device"] for r in parsed["ranks"]} == {0: 0, 1: 0, 2: 1}


def test_rccl_banner_continuations() -> None:
    parsed = facts("rccl-2.22.3-banner-vllm390.log")
    assert (parsed["hip_version"], parsed["rocm_version"]) == ("6.4.43482-0f2d60242", "6.4.0.0-47-73dae9c")
    assert parsed["warnings"] == [
        'Missing "iommu=pt" from kernel command line which can lead to system instablity or hang!'
    ]


def test_rccl_gtest_log_warnings() -> None:
    parsed = facts("rccl-2.18.3-gtest-warn-rccl908.log")
    assert parsed["warnings"][-1] == "hipIpcGetMemHandle failed : invalid argument"
    assert len(parsed["warnings"]) == 4


def test_rccl_msccl_path() -> None:
    parsed = facts("rccl-msccl-rocm6.0-rccl1137.log")
    assert "MSCCL: Initialization finished, localSize 400" in parsed["msccl"]
    assert parsed["nchannels"] == 8


def test_by_number_choices_in_two_real_logs() -> None:
    assert {(c["algo"], c["proto"]) for c in facts("nccl-bynumber-ring-simple-issue1595.log")["choices"]} == {
        ("RING", "SIMPLE")
    }
    parsed = facts("nccl-bynumber-slot-prefix-issue1453.log")
    assert choice_tuples(parsed) == {(None, 4, "TREE", "LL", ()), (None, 262144, "TREE", "LL128", ())}
    assert parsed["choices"][0]["count"] == 3
    assert parsed["transports"] == ["NET/IBext_v8"]


def test_by_name_and_by_number_map_to_the_same_names() -> None:
    by_name = parse("h:1:1 [0] NCCL INFO AllReduce: 4 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}")
    by_number = parse("h:1:1 [0] NCCL INFO 4 Bytes -> Algo 0 proto 0 time 25.200462")
    assert (by_name["choices"][0]["algo"], by_name["choices"][0]["proto"]) == ("TREE", "LL")
    assert (by_number["choices"][0]["algo"], by_number["choices"][0]["proto"]) == ("TREE", "LL")
    assert facts("nccl-2.27.5-tree-ll-by-name-sglang.log")["choices"][0]["algo"] == "TREE"


@pytest.mark.parametrize(
    ("number", "version", "name"),
    [(2, "2.10.3", "COLLNET"), (2, "2.18.1", "COLLNET_DIRECT"), (5, "2.19.3", "NVLS_TREE"), (6, "2.23.4", "PAT")],
)
def test_algo_numbers_are_version_aware(number: int, version: str, name: str) -> None:
    parsed = parse(f"NCCL version {version}+cuda12.2\nh:1:1 [0] NCCL INFO 8 Bytes -> Algo {number} proto 1 time 3.0")
    assert parsed["choices"][0]["algo"] == name


def test_by_number_choice_gets_op_from_preceding_coll_call() -> None:
    log = (
        "h:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 1024 datatype 7 op 0 root 0 "
        "comm 0x2 [nranks=8] stream 0x3\n"
        "h:1:1 [0] NCCL INFO 4096 Bytes -> Algo 1 proto 0 time 9.5\n"
    )
    assert choice_tuples(parse(log)) == {("AllReduce", 4096, "RING", "LL", ())}


# --- logs of kinds the parser had not seen (tests/fixtures/commlogs/unseen, heldout) -----------

@pytest.mark.parametrize("path", COVERAGE_LOGS, ids=lambda p: p.name)
def test_coverage_log_facts_all_read(path: Path) -> None:
    expected = json.loads((path.parent / "expected.json").read_text())[path.name]
    parsed = parse(path.read_text())
    assert [fact for fact in expected if not holds(fact, parsed)] == []


@pytest.mark.parametrize("directory", COVERAGE_SETS, ids=lambda d: d.name)
def test_coverage_at_least_97_percent(directory: Path) -> None:
    assert score(directory)["coverage"] >= 0.97


def test_torn_line_rest_on_next_line_is_joined_not_invented() -> None:
    log = (
        "h:2:2 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 256 datatype 7 op 0 root 0 comm 0x2 "
        "[nranks=2] stream 0x3\n"
        "h:2:2 [1] NCCL INFO 1024 Bytes -> Al[default0]:h:1:1 [0] NCCL INFO Using network IB\n"
        "go 1 proto 2 time 3.0\n"
    )
    parsed = parse(log)
    assert choice_tuples(parsed) == {("AllReduce", 1024, "RING", "SIMPLE", ())}
    assert parsed["network"] == "IB"
    # A remainder that is some other writer's line is not glued on.
    assert parse(log.replace("go 1 proto 2", "h:3:3 [0] NCCL INFO go 1 proto 2"))["choices"] == []


# --- prefixes, torn lines --------------------------------------------------------------------

LINE = "node1:123:456 [3] NCCL INFO Using network IB"


@pytest.mark.parametrize(
    "prefix",
    [
        "[1,3]<stdout>:", "[155] ", "(pid=21065) ", "(RayTrainWorker pid=123, ip=10.0.0.4) ", "[rank3]:",
        "[default0]:", "2025-11-24T03:20:21.001125857Z ", "Fri Aug 11 12:31:45 2023[1,0]<stdout>:", " 5: ",
        "worker-1: ", "\x1b[36m(RayWorkerWrapper pid=3112, ip=10.20.1.7)\x1b[0m ",
        "[2026-03-03 12:11:38] ", "2025-11-12 20:42:20,261 - INFO - ",
    ],
)
def test_strip_prefix_each_launcher(prefix: str) -> None:
    assert strip_prefix(prefix + LINE) == LINE
    assert parse(prefix + LINE)["network"] == "IB"
    assert parse(prefix + LINE)["processes"] == ["node1:123"]


def test_strip_prefix_leaves_plain_lines_alone() -> None:
    assert strip_prefix(LINE) == LINE
    assert strip_prefix("NCCL version 2.27.7+cuda12.9") == "NCCL version 2.27.7+cuda12.9"


def _comparable(parsed: dict) -> dict:
    return {
        "version": parsed["version"], "library": parsed["library"], "network": parsed["network"],
        "nchannels": parsed["nchannels"], "transports": set(parsed["transports"]), "env": parsed["env"],
        "warnings": set(parsed["warnings"]), "choices": choice_tuples(parsed),
        "rings": {r["channel"]: tuple(r["order"]) for r in parsed["ring_orders"]},
    }


def test_synthetic_torn_file_matches_its_source() -> None:
    torn = _comparable(facts("synthetic-torn-torchrun-default-prefix.log"))
    source = _comparable(facts("nccl-2.10.3-ib-lassen-issue566.log"))
    assert torn["rings"].items() <= source["rings"].items()
    assert {k: v for k, v in torn.items() if k != "rings"} == {k: v for k, v in source.items() if k != "rings"}


NCCL_START = re.compile(r"\d+:\d+ \[\d+\]|\S+ \[\d+\] \S*:?\d* ?NCCL|(?:NCCL|RCCL) (?:INFO|WARN|version)")


def tear(lines: list[str], rng: random.Random) -> str:
    """Interleave like concurrent writers: a line is cut, another whole line lands in the middle.

    The inserted line is another NCCL writer's (it has a header, a marker or the version banner):
    a cut followed by a blank line or by foreign output cannot be told from a complete line.
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and NCCL_START.search(lines[i + 1]) and rng.random() < 0.4 and len(lines[i]) > 2:
            cut = rng.randrange(1, len(lines[i]))
            out.append(lines[i][:cut] + lines[i + 1])
            out.append(lines[i][cut:])
            i += 2
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    "path", sorted(FIXTURES.glob("*.log")) + COVERAGE_LOGS, ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_torn_lines_invent_no_facts(path: Path) -> None:
    lines = path.read_text().splitlines()
    whole = _comparable(parse("\n".join(lines)))
    for seed in range(20):
        torn = _comparable(parse(tear(lines, random.Random(seed))))
        assert torn["version"] in (None, whole["version"])
        assert torn["network"] in (None, whole["network"])
        for key in ("transports", "warnings"):
            assert torn[key] <= whole[key], (seed, key)
        # A choice whose call line was torn away has no op: unknown, not a claim.
        unnamed = {c[1:] for c in whole["choices"]}
        assert all(c in whole["choices"] or (c[0] is None and c[1:] in unnamed) for c in torn["choices"]), seed
        assert torn["env"].items() <= whole["env"].items()
        assert torn["rings"].items() <= whole["rings"].items()


# --- fuzzing: never raise, always the full key set ---------------------------------------------

ALL_LINES = [line for p in sorted(FIXTURES.glob("*.log")) for line in p.read_text().splitlines()]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_fuzz_random_text(text: str) -> None:
    assert set(parse(text)) == KEYS


@settings(max_examples=300, deadline=None)
@given(st.binary())
def test_fuzz_random_bytes(data: bytes) -> None:
    assert set(parse(data.decode("utf-8", errors="replace"))) == KEYS


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(ALL_LINES), max_size=40),
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200), st.text(max_size=8)), max_size=10),
)
def test_fuzz_mutated_fixture_lines(lines: list[str], edits: list[tuple[int, int, str]]) -> None:
    lines = list(lines)
    for i, cut, junk in edits:
        if lines:
            j = i % len(lines)
            lines[j] = lines[j][:cut] + junk + (lines[(j + 1) % len(lines)][cut:])
    assert set(parse("\n".join(lines))) == KEYS


@pytest.mark.parametrize("text", ["", "\n\n", "garbage \x00\xff", "NCCL INFO", "NCCL version", "Bytes -> Algo"])
def test_garbage_gives_empty_result(text: str) -> None:
    parsed = parse(text)
    assert set(parsed) == KEYS
    assert parsed["version"] is None and parsed["choices"] == [] and parsed["nranks"] is None


def test_non_text_input_gives_empty_result() -> None:
    assert parse(None) == empty_result()  # type: ignore[arg-type]


# --- check_effective ------------------------------------------------------------------------------

RING_SIMPLE = parse(
    "h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring\n"
    "h:1:1 [0] NCCL INFO NCCL_PROTO set by environment to Simple\n"
    "h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}\n"
)


def kinds(findings: list[dict]) -> list[tuple[str, str]]:
    return [(f["kind"], f["key"]) for f in findings]


def test_check_honoured_settings_give_no_findings() -> None:
    assert check_effective({"NCCL_ALGO": "ring", "NCCL_PROTO": "SIMPLE"}, [RING_SIMPLE]) == []


def test_check_algo_not_honoured() -> None:
    findings = check_effective({"NCCL_ALGO": "Tree"}, [RING_SIMPLE])
    assert findings[0]["kind"] == "not-honoured" and findings[0]["key"] == "NCCL_ALGO"
    assert findings[0]["effective"] == ["RING"] and findings[0]["requested"] == "Tree"


def test_check_proto_not_honoured_by_number() -> None:
    parsed = facts("nccl-bynumber-slot-prefix-issue1453.log")
    findings = check_effective({"NCCL_PROTO": "Simple"}, [parsed])
    assert ("not-honoured", "NCCL_PROTO") in kinds(findings)
    assert findings[0]["effective"] == ["LL", "LL128"]


CHOICE_ONLY = parse("h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}")


def not_honoured(requested: dict[str, str]) -> list[list]:
    return [f["effective"] for f in check_effective(requested, [CHOICE_ONLY]) if f["kind"] == "not-honoured"]


@pytest.mark.parametrize(
    ("value", "effective"),
    [("^Tree,NVLS", []), ("^ring", [["RING"]]), ("Tree,Ring", []), ("tree,nvls", [["RING"]]), ("^collnet", [])],
)
def test_check_exclusion_and_comma_lists(value: str, effective: list) -> None:
    assert not_honoured({"NCCL_ALGO": value}) == effective


def test_check_unechoed_request_is_reported() -> None:
    assert kinds(check_effective({"NCCL_ALGO": "Ring"}, [CHOICE_ONLY])) == [("not-echoed", "NCCL_ALGO")]


def test_check_per_collective_algo_spec() -> None:
    assert not_honoured({"NCCL_ALGO": "allreduce:tree;allgather:ring"}) == [["RING"]]
    assert not_honoured({"NCCL_ALGO": "allgather:tree"}) == []
    assert not_honoured({"NCCL_ALGO": "allreduce:^tree"}) == []


def test_check_max_channels() -> None:
    findings = check_effective({"NCCL_MAX_NCHANNELS": "1"}, [RING_SIMPLE])
    assert findings[0]["kind"] == "not-honoured" and findings[0]["effective"] == [4]
    assert [f for f in check_effective({"NCCL_MAX_NCHANNELS": "4"}, [RING_SIMPLE]) if f["kind"] == "not-honoured"] == []
    lassen = facts("nccl-2.10.3-ib-lassen-issue566.log")
    assert check_effective({"NCCL_MAX_NCHANNELS": "2"}, [lassen])[0]["effective"] == [6]


def test_check_not_echoed_and_echo_mismatch() -> None:
    parsed = facts("nccl-2.10.3-two-node-ib-nccltests133.log")
    findings = check_effective({"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "mlx5_6", "NCCL_DEBUG": "INFO"}, [parsed])
    assert kinds(findings) == [("not-echoed", "NCCL_IB_HCA")]
    mismatch = check_effective({"NCCL_IB_GID_INDEX": "5"}, [parsed])
    assert kinds(mismatch) == [("not-honoured", "NCCL_IB_GID_INDEX")]
    assert mismatch[0]["effective"] == ["3"]


def test_check_invalid_value_notice() -> None:
    parsed = parse("h:1:1 [0] NCCL INFO Invalid value abc for NCCL_NCHANNELS_PER_NET_PEER, using default 2.")
    assert parsed["invalid_env"] == [{
        "var": "NCCL_NCHANNELS_PER_NET_PEER", "value": "abc",
        "text": "Invalid value abc for NCCL_NCHANNELS_PER_NET_PEER, using default 2.",
    }]
    findings = check_effective({"NCCL_NCHANNELS_PER_NET_PEER": "abc"}, [parsed])
    assert ("invalid", "NCCL_NCHANNELS_PER_NET_PEER") in kinds(findings)


def test_check_detlab_presets_on_one_h200_rank() -> None:
    from detlab.core.configs import PRESETS

    default = facts("nccl-2.28.9-h200-w1-ddp-default-detlab.log")
    recipe = facts("nccl-2.28.9-h200-w1-ddp-tree-simple-1ch-detlab.log")
    assert (default["nchannels"], recipe["nchannels"]) == (64, 1)
    assert recipe["env"]["NCCL_MAX_NCHANNELS"] == "1" and "NCCL_ALGO" not in recipe["env"]  # not echoed at 1 rank
    requested = PRESETS["full-deterministic"][1]["env"]
    assert check_effective(requested, [recipe]) == []
    # The default run's log, read as if it had asked for the recipe: the recipe did not take effect.
    flagged = set(kinds(check_effective(requested, [default])))
    assert {("not-honoured", "NCCL_MAX_NCHANNELS"), ("not-honoured", "NCCL_MAX_CTAS")} <= flagged


def test_an_ib_plugin_that_failed_is_not_the_network() -> None:
    # NCCL 2.28 prints "NET/IB : Using [RO]; OOB ..." and then "Failed to initialize NET plugin IB".
    lines = (FIXTURES / "nccl-2.28.9-h200-w1-ddp-default-detlab.log").read_text().splitlines()
    without_using = [line for line in lines if "Using network" not in line]
    assert parse("\n".join(without_using))["network"] == "Socket"  # from "Assigned NET plugin Socket to comm"
    bare = [line for line in without_using if "Assigned NET plugin" not in line]
    assert parse("\n".join(bare))["network"] == "Socket"  # from "NET/Socket : Using", not the failed IB


def test_check_msccl_path() -> None:
    findings = check_effective({}, [facts("rccl-msccl-rocm6.0-rccl1137.log")])
    assert kinds(findings) == [("msccl", "RCCL_MSCCL_ENABLE")]
    assert check_effective({}, [RING_SIMPLE]) == []


def test_check_rank_parity_version_env_and_choices() -> None:
    other = parse(
        "NCCL version 2.21.5+cuda12.4\n"
        "h:2:2 [1] NCCL INFO NCCL_ALGO set by environment to Tree\n"
        "h:2:2 [1] NCCL INFO AllReduce: 1048576 Bytes -> Algo TREE proto SIMPLE channel{Lo..Hi}={0..3}\n"
    )
    mine = parse("NCCL version 2.27.7+cuda12.9\n" + "\n".join(
        line for line in [
            "h:1:1 [0] NCCL INFO NCCL_ALGO set by environment to Ring",
            "h:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}",
        ]
    ))
    parity = [f for f in check_effective({}, [mine, other]) if f["kind"] == "rank-parity"]
    assert [f["key"] for f in parity] == ["version", "NCCL_ALGO", "choice.AllReduce.1048576"]
    assert check_effective({}, [mine, mine]) == []


def test_check_rank_parity_within_one_interleaved_file() -> None:
    log = (
        "a:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1.\n"
        "a:2:2 [1] NCCL INFO NCCL_P2P_DISABLE set by environment to 0.\n"
    )
    parity = check_effective({}, [parse(log)])
    assert kinds(parity) == [("rank-parity", "NCCL_P2P_DISABLE")]


# --- diff_facts -------------------------------------------------------------------------------

def test_diff_facts_between_two_runs() -> None:
    a = facts("nccl-2.27.5-tuning-by-name-interleaved-sglang.log")
    b = facts("nccl-2.27.5-tree-ll-by-name-sglang.log")
    diff = {d["key"]: (d["a"], d["b"]) for d in diff_facts(a, b)}
    assert diff["choice.AllReduce.4"] == (["RING/SIMPLE/0..0"], ["TREE/LL/0..0"])
    assert diff["env.NCCL_IB_DISABLE"] == ("0", None)
    assert "nranks" not in diff


def test_diff_facts_versions_transports_network() -> None:
    a, b = facts("nccl-2.5.6-mpirun-issue300.log"), facts("nccl-2.10.3-two-node-ib-nccltests133.log")
    diff = {d["key"]: (d["a"], d["b"]) for d in diff_facts(a, b)}
    assert diff["version"] == ("2.5.6", "2.10.3")
    assert diff["network"] == ("Socket", "IB")
    assert diff_facts(a, a) == []
    assert diff_facts(empty_result(), empty_result()) == []


# --- main -------------------------------------------------------------------------------------

def test_main_json_on_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "nccl-2.10.3-two-node-ib-nccltests133.log")
    assert main([path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["file"] == path and out["version"] == "2.10.3" and out["network"] == "IB"


def test_main_summary_on_fixture(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(FIXTURES / "nccl-bynumber-slot-prefix-issue1453.log")]) == 0
    out = capsys.readouterr().out
    assert "NCCL (version unknown)" in out and "2 algo/proto choices" in out


def test_main_on_garbage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.log"
    junk.write_bytes(b"\xff\xfe\x00garbage\n")
    assert main([str(junk), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["library"] is None


def test_main_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = str(FIXTURES / "nccl-2.5.6-mpirun-issue300.log")
    assert main([str(tmp_path / "missing.log"), ok]) == 2
    captured = capsys.readouterr()
    assert "missing.log: cannot read" in captured.err
    assert "NCCL 2.5.6" in captured.out


def test_check_does_not_flag_unechoed_algorithm_on_a_one_rank_communicator() -> None:
    from detlab.core.commlog import empty_result

    single = {**empty_result(), "nranks": 1}
    assert check_effective({"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "Simple"}, [single]) == []
    assert kinds(check_effective({"NCCL_ALGO": "Tree"}, [{**single, "nranks": 2}])) == [("not-echoed", "NCCL_ALGO")]
