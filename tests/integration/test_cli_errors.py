"""Bad input to ``model-optimizer up``: one clear line, non-zero exit, never a hang."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from backends.process import free_port
from tests.integration.conftest import cli

pytestmark = pytest.mark.integration


def _ports() -> list[str]:
    return ["--port", str(free_port()), "--tier-port", str(free_port())]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error:" in line]


def test_version() -> None:
    result = cli("--version", timeout=30)
    assert result.returncode == 0
    assert result.stdout.strip().startswith("model-optimizer 0.")


def test_unknown_model_path(tmp_path: Path) -> None:
    result = cli("up", "--model", str(tmp_path / "missing"), *_ports(), timeout=60)
    assert result.returncode == 2
    assert _error_lines(result.stderr) == [
        f"model-optimizer: error: model not found: {tmp_path / 'missing'} does not exist"
    ]


def test_file_that_is_not_a_model(tmp_path: Path) -> None:
    junk = tmp_path / "notes.gguf"
    junk.write_text("hello")
    result = cli("up", "--model", str(junk), *_ports(), timeout=120)
    assert result.returncode == 2
    (line,) = _error_lines(result.stderr)
    assert "not a model" in line and str(junk) in line


def test_gguf_header_without_a_model(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)
    result = cli("up", "--model", str(fake), *_ports(), timeout=180)
    assert result.returncode == 2
    (line,) = _error_lines(result.stderr)
    assert "cannot load GGUF" in line and str(fake) in line


def test_port_already_taken() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = cli("up", "--port", str(port), "--tier-port", str(free_port()), timeout=60)
    assert result.returncode == 2
    assert _error_lines(result.stderr) == [
        f"model-optimizer: error: port {port} is already in use on 127.0.0.1"
    ]


def test_backend_dying_during_start(tmp_path: Path) -> None:
    # A variant folder that passes every check before start, but vLLM cannot load.
    variant = tmp_path / "variants" / "fp16"
    variant.mkdir(parents=True)
    (variant / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    (variant / "model.safetensors").write_bytes(b"\0" * 16)
    (variant / "metadata.json").write_text(
        json.dumps(
            {
                "variant": "fp16",
                "passed": True,
                "input_key": {},
                "target": {"framework": "vllm==0.32.0", "compile_level": 1},
            }
        )
    )
    (variant / "kv_cache_config.json").write_text(
        json.dumps(
            {
                "block_size": 16,
                "kv_cache_dtype": "auto",
                "max_model_len": 512,
                "max_num_seqs": 2,
                "max_num_batched_tokens": 512,
                "bytes_per_token": 1024,
                "num_blocks": 64,
                "kv_cache_memory_bytes": 64 << 20,
            }
        )
    )
    result = cli(
        "up",
        "--engine",
        "vllm",
        "--variants",
        str(tmp_path / "variants"),
        "--tiers",
        "fp16",
        *_ports(),
        timeout=300,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    (line,) = _error_lines(result.stderr)
    assert "tier fp16 exited during start" in line
