"""backends/commands.py: each tier runs its engine's program."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.commands import EngineMissing, Programs, command
from backends.launch import TierLaunch

PROGRAMS = Programs(vllm_python=Path("/envs/serve/bin/python"), llama_server=Path("/l/server"))


def test_each_engine_gets_its_own_program() -> None:
    vllm = TierLaunch(name="fp16", model_dir=Path("/v/fp16"), served_model_name="m", port=1)
    llama = TierLaunch(
        name="int4", model_dir=Path("/g/int4"), served_model_name="m", port=2, engine="llama.cpp"
    )
    argv, _ = command(vllm, PROGRAMS, {})
    assert argv[:3] == ["/envs/serve/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    argv, _ = command(llama, PROGRAMS, {})
    assert argv[0] == "/l/server" and "/g/int4/model.gguf" in argv


def test_an_engine_not_installed_names_the_tier() -> None:
    llama = TierLaunch(
        name="int4", model_dir=Path("/g"), served_model_name="m", port=2, engine="llama.cpp"
    )
    with pytest.raises(EngineMissing, match=r"tier int4: llama\.cpp's llama-server"):
        command(llama, Programs(vllm_python=Path("/p")), {})
