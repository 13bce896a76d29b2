from pathlib import Path

from backends.launch import TierLaunch
from backends.vllm_args import build_argv, build_env


def _launch(**kw: object) -> TierLaunch:
    base: dict[str, object] = {
        "name": "fp16",
        "model_dir": Path("/m"),
        "served_model_name": "smol",
        "port": 8101,
    }
    base.update(kw)
    return TierLaunch(**base)  # type: ignore[arg-type]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cpu_tier_is_eager_loopback_with_kv_bytes() -> None:
    argv = build_argv(Path("/env/bin/python"), _launch(kv_cache_memory_bytes=123))
    assert argv[:3] == ["/env/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in argv
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--port") == "8101"
    assert _flag(argv, "--kv-cache-memory-bytes") == "123"
    assert _flag(argv, "--served-model-name") == "smol"
    assert "--gpu-memory-utilization" not in argv


def test_gpu_tier_uses_memory_share_and_no_eager() -> None:
    argv = build_argv(Path("p"), _launch(device="cuda", gpu_memory_utilization=0.3))
    assert _flag(argv, "--gpu-memory-utilization") == "0.3"
    assert "--enforce-eager" not in argv
    assert "--kv-cache-memory-bytes" not in argv


def test_optional_limits_and_kv_dtype_only_when_set() -> None:
    plain = build_argv(Path("p"), _launch())
    assert "--max-num-batched-tokens" not in plain and "--kv-cache-dtype" not in plain
    argv = build_argv(Path("p"), _launch(max_num_batched_tokens=512, kv_cache_dtype="fp8"))
    assert _flag(argv, "--max-num-batched-tokens") == "512"
    assert _flag(argv, "--kv-cache-dtype") == "fp8"
    assert "--dtype" not in plain
    assert _flag(build_argv(Path("p"), _launch(dtype="float16")), "--dtype") == "float16"


def test_env_is_offline_dev_mode_and_drops_kv_space_override() -> None:
    env = build_env(_launch(cpu_threads="0-1"), {"VLLM_CPU_KVCACHE_SPACE": "4", "PATH": "/bin"})
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["PATH"] == "/bin"


def test_env_keeps_the_gateways_plain_keys_out_of_the_tier() -> None:
    base = {
        "PATH": "/bin",
        "MO_GATEWAY_API_KEYS": "client-secret",
        "MO_GATEWAY_ADMIN_KEYS": "admin-secret",
        "MO_GATEWAY_ANYTHING": "x",
    }
    env = build_env(_launch(), base)
    assert not [name for name in env if name.startswith("MO_GATEWAY_")]
    assert "client-secret" not in env.values() and "admin-secret" not in env.values()
    assert env["PATH"] == "/bin"


def test_sleep_mode_flag_only_on_cuda() -> None:
    assert "--enable-sleep-mode" in build_argv(Path("p"), _launch(device="cuda", sleep_mode=True))
    assert "--enable-sleep-mode" not in build_argv(Path("p"), _launch(device="cuda"))
    # vLLM refuses --enable-sleep-mode on CPU: a CPU launch never carries it.
    assert "--enable-sleep-mode" not in build_argv(Path("p"), _launch(sleep_mode=True))


def test_every_tier_loads_the_guard_and_gets_its_key_by_environment_only() -> None:
    launch = _launch(api_key="per-run-secret")
    argv = build_argv(Path("p"), launch)
    assert _flag(argv, "--middleware") == "backends.tier_guard.TierGuard"
    assert not any("per-run-secret" in arg for arg in argv)  # ps shows argv, not the env
    assert "per-run-secret" not in repr(launch)
    base = {"PATH": "/bin", "MO_TIER_API_KEY": "operator-key", "VLLM_API_KEY": "other"}
    env = build_env(launch, base)
    assert env["MO_TIER_API_KEY"] == "per-run-secret"
    # VLLM_API_KEY would put a key the gateway does not send on /v1: never inherited.
    assert "VLLM_API_KEY" not in env
    # vLLM imports the guard from this checkout.
    root = Path(env["PYTHONPATH"].split(":")[0])
    assert (root / "backends" / "tier_guard.py").is_file()
    assert build_env(_launch(), {"PYTHONPATH": "/x"})["PYTHONPATH"] == f"{root}:/x"


def test_a_launch_without_a_key_hands_the_tier_none() -> None:
    env = build_env(_launch(), {"MO_TIER_API_KEY": "inherited"})
    assert "MO_TIER_API_KEY" not in env  # the guard then closes its routes to everyone
