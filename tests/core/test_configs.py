"""Unit tests of detlab.core.configs: env allow-list, ConfigBody validation, presets, resolve, hash and diff."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from detlab.core.configs import (
    PRESETS,
    ConfigBody,
    canonical_json,
    content_hash,
    diff,
    env_error,
    preset,
    resolve,
)

PRESET_NAMES = ["default", "torch-deterministic", "nccl-tree-simple-1ch", "nccl-ring-simple", "full-deterministic"]
ONE_CHANNEL_KEYS = ["NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS"]
# A variable with no validator of its own: only the generic name and value checks apply to it.
GENERIC_VAR = "NCCL_SOCKET_IFNAME"


def make_body(**fields: Any) -> ConfigBody:
    """A valid config body (name "cfg", no env, default flags); any field can be overridden."""
    return ConfigBody.model_validate({"name": "cfg", **fields})


# --- env allow-list: accepted -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NCCL_ALGO", "Tree"),
        ("NCCL_ALGO", "^Tree"),
        ("NCCL_ALGO", "ring,tree"),
        ("NCCL_PROTO", "LL128"),
        ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
        ("CUBLAS_WORKSPACE_CONFIG", ":16:8"),
        ("OMP_NUM_THREADS", "8"),
        ("NCCL_MIN_NCHANNELS", "1"),
        ("NCCL_MAX_NCHANNELS", "64"),
        (GENERIC_VAR, "eth0"),
    ],
)
def test_env_error_accepts_allowed_variable(name: str, value: str) -> None:
    assert env_error(name, value) is None


def test_env_error_accepts_value_of_256_characters() -> None:
    assert env_error(GENERIC_VAR, "a" * 256) is None


# --- env allow-list: rejected names ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["LD_PRELOAD", "PATH", "PYTHONPATH", "nccl_algo"])
def test_env_error_rejects_variable_outside_allow_list(name: str) -> None:
    error = env_error(name, "1")

    assert error is not None
    assert name in error
    assert "not an allowed variable" in error


def test_env_error_for_unknown_variable_lists_allowed_ones() -> None:
    error = env_error("LD_PRELOAD", "x")

    assert error is not None
    assert "NCCL_ALGO" in error and "CUBLAS_WORKSPACE_CONFIG" in error and "NCCL_*" in error


@pytest.mark.parametrize("name", ["NCCL_NET_PLUGIN", "NCCL_TOPO_FILE", "NCCL_TUNER_PLUGIN", "NCCL_GRAPH_DUMP_FILE"])
def test_env_error_rejects_nccl_variable_naming_file_or_plugin(name: str) -> None:
    error = env_error(name, "x")

    assert error is not None
    assert name in error
    assert "file or plugin" in error


@pytest.mark.parametrize("name", ["NCCL_DEBUG_FILE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"])
def test_env_error_rejects_worker_owned_variable(name: str) -> None:
    error = env_error(name, "1")

    assert error is not None
    assert name in error
    assert "set by the worker" in error


def test_env_error_rejects_nccl_proxy_profile_path() -> None:
    assert env_error("NCCL_PROXY_PROFILE", "/home/user/.bashrc") is not None


# --- env allow-list: rejected values --------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["$(id)", "`id`", "eth0;id", "eth0 eth1", "eth0\neth1", '"eth0"', "'eth0'", "eth0|id", "eth0&", "a" * 257],
    ids=["subshell", "backticks", "semicolon", "space", "newline", "double-quote", "single-quote", "pipe",
         "ampersand", "over-long"],
)
def test_env_error_rejects_unsafe_value(value: str) -> None:
    error = env_error(GENERIC_VAR, value)

    assert error is not None
    assert "[A-Za-z0-9_.,:=+^-]" in error and GENERIC_VAR in error


@pytest.mark.parametrize("value", ["Bogus", "tree,bogus", "tree,", "", "^"])
def test_env_error_rejects_unknown_nccl_algo(value: str) -> None:
    error = env_error("NCCL_ALGO", value)

    assert error is not None
    assert "'ring'" in error and "'tree'" in error


def test_env_error_rejects_unknown_nccl_proto() -> None:
    error = env_error("NCCL_PROTO", "LL256")

    assert error is not None
    assert "'ll128'" in error and "'simple'" in error


@pytest.mark.parametrize("value", ["0", "abc", "65", "-1", "1.5"])
def test_env_error_rejects_nchannels_outside_range(value: str) -> None:
    error = env_error("NCCL_MIN_NCHANNELS", value)

    assert error is not None
    assert "[1, 64]" in error


@pytest.mark.parametrize("value", [":4096", "4096:8", ":4096:8:", ":abc:8"])
def test_env_error_rejects_malformed_cublas_workspace_config(value: str) -> None:
    error = env_error("CUBLAS_WORKSPACE_CONFIG", value)

    assert error is not None
    assert ":4096:8" in error


def test_env_error_rejects_omp_num_threads_zero() -> None:
    error = env_error("OMP_NUM_THREADS", "0")

    assert error is not None
    assert "[1, 1024]" in error


def test_env_error_accepts_largest_python_hash_seed() -> None:
    assert env_error("PYTHONHASHSEED", "4294967295") is None


def test_env_error_rejects_python_hash_seed_above_uint32() -> None:
    assert env_error("PYTHONHASHSEED", "9999999999") is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [("NCCL_MIN_NCHANNELS", "0"), ("NCCL_ALGO", "Bogus"), ("OMP_NUM_THREADS", "$(id)")],
)
def test_env_error_for_bad_value_names_the_variable(name: str, value: str) -> None:
    error = env_error(name, value)

    assert error is not None
    assert name in error


# --- ConfigBody -----------------------------------------------------------------------------------


def test_config_body_defaults() -> None:
    body = ConfigBody()

    assert body.name == "custom"
    assert body.env == {}
    assert body.seed == 0
    assert body.torch.allow_tf32 is True
    assert body.torch.deterministic_algorithms is False


def test_config_body_forbids_unknown_top_level_key() -> None:
    with pytest.raises(ValidationError, match="extra"):
        make_body(nccl_algo="Tree")


def test_config_body_forbids_unknown_torch_flag() -> None:
    with pytest.raises(ValidationError, match="extra"):
        make_body(torch={"deterministic": True})


@pytest.mark.parametrize(
    "name", ["", "has space", "a/b", "-leading-dash", "x" * 65, "semi;colon", "new\nline"],
    ids=["empty", "space", "slash", "leading-dash", "65-chars", "semicolon", "newline"],
)
def test_config_body_rejects_bad_name(name: str) -> None:
    with pytest.raises(ValidationError, match="name must be 1-64 characters"):
        make_body(name=name)


def test_config_body_accepts_64_character_name() -> None:
    assert make_body(name="a" * 64).name == "a" * 64


def test_config_body_rejects_disallowed_env_variable() -> None:
    with pytest.raises(ValidationError, match="LD_PRELOAD is not an allowed variable"):
        make_body(env={"LD_PRELOAD": "/tmp/evil.so"})


def test_config_body_rejects_bad_env_value() -> None:
    with pytest.raises(ValidationError, match=r"must be an integer in \[1, 64\]"):
        make_body(env={"NCCL_MIN_NCHANNELS": "0"})


def test_config_body_error_names_each_variable_with_bad_value() -> None:
    with pytest.raises(ValidationError) as info:
        make_body(env={"NCCL_MIN_NCHANNELS": "0", "NCCL_MAX_CTAS": "99"})

    # str(ValidationError) echoes the input dict; the message an API returns is the error's "msg".
    message = info.value.errors()[0]["msg"]
    assert "NCCL_MIN_NCHANNELS" in message and "NCCL_MAX_CTAS" in message


def test_config_body_stringifies_integer_env_value() -> None:
    assert make_body(env={"OMP_NUM_THREADS": 4}).env == {"OMP_NUM_THREADS": "4"}


def test_config_body_rejects_boolean_env_value() -> None:
    with pytest.raises(ValidationError, match="NCCL_P2P_DISABLE: value must be a string"):
        make_body(env={"NCCL_P2P_DISABLE": True})


def test_config_body_rejects_env_that_is_not_an_object() -> None:
    with pytest.raises(ValidationError, match="env must be an object"):
        make_body(env=["NCCL_ALGO=Tree"])


def test_config_body_rejects_more_than_64_env_variables() -> None:
    env = {f"NCCL_KNOB_{i}": "1" for i in range(65)}

    with pytest.raises(ValidationError, match="more than 64"):
        make_body(env=env)


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_config_body_rejects_seed_outside_uint32(seed: int) -> None:
    with pytest.raises(ValidationError, match="seed"):
        make_body(seed=seed)


# --- presets --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_preset_exists_and_carries_its_name(name: str) -> None:
    assert name in PRESETS
    assert preset(name).name == name


def test_preset_default_turns_on_cudnn_benchmark_and_sets_no_env() -> None:
    body = preset("default")

    assert body.torch.cudnn_benchmark is True
    assert body.env == {}


def test_preset_torch_deterministic_sets_flags_and_cublas_workspace() -> None:
    body = preset("torch-deterministic")

    assert body.torch.model_dump() == {"deterministic_algorithms": True, "cudnn_deterministic": True,
                                       "cudnn_benchmark": False, "allow_tf32": False}
    assert body.env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def test_preset_tree_sets_one_channel_and_one_cta() -> None:
    env = preset("nccl-tree-simple-1ch").env

    assert {k: env.get(k) for k in ONE_CHANNEL_KEYS} == dict.fromkeys(ONE_CHANNEL_KEYS, "1")


def test_preset_tree_selects_tree_algorithm_and_simple_protocol() -> None:
    env = preset("nccl-tree-simple-1ch").env

    # all_reduce only: a global Tree has no AllGather algorithm in NCCL 2.28 and breaks DDP start-up
    assert (env["NCCL_ALGO"], env["NCCL_PROTO"]) == ("allreduce:tree", "Simple")


@pytest.mark.parametrize("value", ["allreduce:tree", "ring,tree;allreduce:^tree", "allreduce:tree;broadcast:ring"])
def test_env_error_accepts_nccl_per_function_lists(value: str) -> None:
    assert env_error("NCCL_ALGO", value) is None


@pytest.mark.parametrize("value, fragment", [("bogus:tree", "unknown function"),
                                             ("allreduce:tree;ring", "needs a function prefix"),
                                             ("allreduce:tree;broadcast:bogus", "unknown value"),
                                             ("allreduce:tree; rm -rf /", "has characters outside")])
def test_env_error_rejects_bad_per_function_lists(value: str, fragment: str) -> None:
    assert fragment in (env_error("NCCL_ALGO", value) or "")


def test_semicolons_are_refused_outside_the_per_function_lists() -> None:
    assert "has characters outside" in (env_error("NCCL_DEBUG_SUBSYS", "INIT;ENV") or "")


def test_preset_ring_selects_ring_algorithm_and_simple_protocol() -> None:
    assert preset("nccl-ring-simple").env == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


def test_preset_full_deterministic_env_is_union_of_torch_and_tree_presets() -> None:
    expected = {**preset("torch-deterministic").env, **preset("nccl-tree-simple-1ch").env}

    assert preset("full-deterministic").env == expected


def test_preset_full_deterministic_torch_flags_match_torch_deterministic() -> None:
    assert preset("full-deterministic").torch == preset("torch-deterministic").torch


def test_preset_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'nope'.*full-deterministic"):
        preset("nope")


# --- resolve --------------------------------------------------------------------------------------


def test_resolve_preset_reference_returns_the_preset() -> None:
    assert resolve({"preset": "nccl-ring-simple"}) == preset("nccl-ring-simple")


def test_resolve_preset_with_torch_override_merges_flags() -> None:
    body = resolve({"preset": "full-deterministic", "torch": {"allow_tf32": True}})

    assert body.torch.allow_tf32 is True
    assert body.torch.deterministic_algorithms is True
    assert body.torch.cudnn_deterministic is True


def test_resolve_preset_with_scalar_override_keeps_preset_env() -> None:
    body = resolve({"preset": "nccl-tree-simple-1ch", "seed": 7})

    assert body.seed == 7
    assert body.env == preset("nccl-tree-simple-1ch").env
    assert body.name == "nccl-tree-simple-1ch"


def test_resolve_preset_with_name_override_uses_that_name() -> None:
    assert resolve({"preset": "default", "name": "mine"}).name == "mine"


def test_resolve_plain_object_fills_omitted_keys_from_default() -> None:
    body = resolve({"seed": 3, "torch": {"deterministic_algorithms": True}})

    assert body.seed == 3
    assert body.torch.deterministic_algorithms is True
    assert body.torch.cudnn_benchmark is True  # from `default`, not from TorchFlags' own default


def test_resolve_plain_object_without_name_is_named_custom() -> None:
    assert resolve({"seed": 3}).name == "custom"


def test_resolve_plain_object_keeps_given_name() -> None:
    assert resolve({"name": "exp-1", "seed": 3}).name == "exp-1"


def test_resolve_unknown_preset_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown preset 'fastest'; presets: \["):
        resolve({"preset": "fastest"})


def test_resolve_rejects_non_object() -> None:
    with pytest.raises(ValueError, match="a config must be an object"):
        resolve(["default"])  # type: ignore[arg-type]


def test_resolve_validates_overrides() -> None:
    with pytest.raises(ValidationError, match="LD_PRELOAD is not an allowed variable"):
        resolve({"preset": "default", "env": {"LD_PRELOAD": "x.so"}})


# --- content_hash and canonical_json --------------------------------------------------------------


def test_content_hash_ignores_name() -> None:
    env = {"NCCL_ALGO": "Tree"}

    assert content_hash(make_body(name="a", env=env)) == content_hash(make_body(name="b", env=env))


@pytest.mark.parametrize(
    "change",
    [
        {"env": {"NCCL_ALGO": "Tree"}},
        {"torch": {"allow_tf32": False}},
        {"torch": {"cudnn_benchmark": True}},
        {"seed": 1},
        {"world_size": 2},
        {"threads": 4},
    ],
    ids=["env", "torch.allow_tf32", "torch.cudnn_benchmark", "seed", "world_size", "threads"],
)
def test_content_hash_changes_with_any_knob(change: dict[str, Any]) -> None:
    assert content_hash(make_body(**change)) != content_hash(make_body())


def test_content_hash_changes_with_env_value() -> None:
    tree = make_body(env={"NCCL_ALGO": "Tree"})
    ring = make_body(env={"NCCL_ALGO": "Ring"})

    assert content_hash(tree) != content_hash(ring)


def test_content_hash_is_16_hex_characters() -> None:
    digest = content_hash(make_body())

    assert len(digest) == 16
    int(digest, 16)


def test_content_hash_is_env_order_independent() -> None:
    one = make_body(env={"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})
    two = make_body(env={"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"})

    assert content_hash(one) == content_hash(two)


def test_canonical_json_is_key_order_independent() -> None:
    one = ConfigBody.model_validate({"name": "c", "seed": 5, "env": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"},
                                     "torch": {"allow_tf32": False, "cudnn_benchmark": True}})
    two = ConfigBody.model_validate({"torch": {"cudnn_benchmark": True, "allow_tf32": False}, "seed": 5,
                                     "env": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}, "name": "c"})

    assert canonical_json(one) == canonical_json(two)


def test_canonical_json_is_compact_and_sorted() -> None:
    text = canonical_json(make_body(env={"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"}))

    assert text.startswith('{"env":{"NCCL_ALGO":"Tree","NCCL_PROTO":"Simple"},"name":"cfg",')
    assert " " not in text


# --- diff -----------------------------------------------------------------------------------------


def test_diff_of_equal_bodies_is_empty() -> None:
    body = preset("full-deterministic").model_dump()

    assert diff(body, body) == []


def test_diff_lists_differing_dotted_env_key() -> None:
    a = make_body(env={"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}).model_dump()
    b = make_body(env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}).model_dump()

    assert diff(a, b) == [{"key": "env.NCCL_ALGO", "a": "Tree", "b": "Ring"}]


def test_diff_lists_key_present_on_one_side_with_none_on_the_other() -> None:
    a = make_body().model_dump()
    b = make_body(env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}).model_dump()

    assert diff(a, b) == [{"key": "env.CUBLAS_WORKSPACE_CONFIG", "a": None, "b": ":4096:8"}]


def test_diff_never_lists_name() -> None:
    a = make_body(name="one", seed=1).model_dump()
    b = make_body(name="two", seed=1).model_dump()

    assert diff(a, b) == []


def test_diff_keys_are_sorted_and_dotted() -> None:
    keys = [d["key"] for d in diff(preset("default").model_dump(), preset("full-deterministic").model_dump())]

    assert keys == sorted(keys)
    assert "torch.deterministic_algorithms" in keys and "env.NCCL_MIN_CTAS" in keys
    assert "seed" not in keys
