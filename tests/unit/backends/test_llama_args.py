"""backends/llama_args.py: a llama.cpp tier's command line and environment (pure)."""

from __future__ import annotations

from pathlib import Path

from backends.launch import TierLaunch
from backends.llama_args import build_argv, build_env, cores, cpu_mask

SERVER = Path("/opt/llama/bin/llama-server")


def _launch(**changes: object) -> TierLaunch:
    base: dict[str, object] = {
        "name": "int4",
        "model_dir": Path("/v/int4"),
        "served_model_name": "tiny-chat",
        "port": 8103,
        "engine": "llama.cpp",
        "max_model_len": 1024,
        "max_num_seqs": 4,
    }
    return TierLaunch(**{**base, **changes})  # type: ignore[arg-type]


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_server_serves_the_variant_file_under_the_public_name_on_loopback() -> None:
    argv = build_argv(SERVER, _launch())
    assert argv[0] == str(SERVER)
    assert _value(argv, "--model") == "/v/int4/model.gguf"
    assert _value(argv, "--alias") == "tiny-chat"
    assert (_value(argv, "--host"), _value(argv, "--port")) == ("127.0.0.1", "8103")
    # each of the 4 slots holds max_model_len tokens of its own
    assert (_value(argv, "--parallel"), _value(argv, "--ctx-size")) == ("4", "4096")
    assert "--no-kv-unified" in argv and "--metrics" in argv
    assert _value(argv, "--cache-ram") == "0" and _value(argv, "--sse-ping-interval") == "-1"


def test_one_unpinned_thread_unless_cores_are_named() -> None:
    argv = build_argv(SERVER, _launch())
    assert _value(argv, "--threads") == "1" and "--cpu-mask" not in argv
    pinned = build_argv(SERVER, _launch(cpu_threads="0,2-3"))
    assert _value(pinned, "--threads") == "3"
    assert _value(pinned, "--cpu-mask") == "0xd" and _value(pinned, "--cpu-strict") == "1"
    assert cores("0-1,3") == [0, 1, 3] and cpu_mask("1") == "0x2"


def test_sampling_defaults_come_from_the_variant_and_llama_cpps_extras_are_off() -> None:
    argv = build_argv(SERVER, _launch(sampling={"temperature": 0.2, "top_p": 0.9}))
    assert (_value(argv, "--temp"), _value(argv, "--top-p")) == ("0.2", "0.9")
    assert (_value(argv, "--top-k"), _value(argv, "--min-p")) == ("0", "0")
    assert "--temp" not in build_argv(SERVER, _launch())


def test_slots_and_a_draft_model_when_given() -> None:
    argv = build_argv(SERVER, _launch(slot_dir=Path("/c/slots/8103"), draft_dir=Path("/v/d")))
    assert _value(argv, "--slot-save-path") == "/c/slots/8103"
    assert _value(argv, "--model-draft") == "/v/d/model.gguf"
    assert _value(argv, "--spec-type") == "draft-simple"
    assert "--slot-save-path" not in build_argv(SERVER, _launch())


def test_the_key_travels_in_the_environment_and_nothing_private_is_inherited() -> None:
    launch = _launch(api_key="s3cret")
    assert not any("s3cret" in part for part in build_argv(SERVER, launch))
    base = {
        "PATH": "/usr/bin",
        "MO_GATEWAY_API_KEYS": "a",
        "MO_TIER_API_KEY": "b",
        "LLAMA_ARG_THREADS": "8",
        "LLAMA_API_KEY": "old",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    env = build_env(launch, base)
    assert env == {"PATH": "/usr/bin", "LLAMA_API_KEY": "s3cret"}
    assert "LLAMA_API_KEY" not in build_env(_launch(), base)
