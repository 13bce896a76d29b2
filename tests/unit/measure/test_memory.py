"""memory: finding vLLM servers by their command line, the peak sampler (the process tree's RSS
and the listening process are tested in tests/unit/backends/test_process_tree.py)."""

import importlib.util
import os
import time

from measure.memory import Backend, PeakSampler, tier_server

SERVER = "vllm.entrypoints.openai.api_server"


def test_tier_server_reads_the_tier_from_the_command_line() -> None:
    cmd = ["python", "-m", SERVER, "--model", "/cache/variants/M.emulated/int8", "--port", "8102"]
    assert tier_server(cmd) == ("int8", 8102)
    assert tier_server(["python", "-m", SERVER, "--port", "9"]) == ("port 9", 9)
    assert tier_server(["python", "-m", "gateway", "--port", "8000"]) is None
    assert tier_server(["python", "-m", SERVER, "--port", "x"]) is None


def test_sampler_keeps_the_peak_and_no_gpu_figure_without_nvml() -> None:
    with PeakSampler([Backend("me", 1, os.getpid())], interval=0.05) as sampler:
        ballast = bytearray(64 * 2**20)
        time.sleep(0.2)
        del ballast
    (peak,) = sampler.peaks()
    assert peak.name == "me"
    assert peak.peak_rss_mib >= 64
    if importlib.util.find_spec("pynvml") is None:
        assert peak.peak_gpu_mib is None


def test_a_llama_server_is_a_tier_named_by_its_variant_folder() -> None:
    cmd = ["/c/engines/l/bin/llama-server", "--model", "/v/x-gguf/int4/model.gguf", "--port", "81"]
    assert tier_server(cmd) == ("int4", 81)
    assert tier_server(["/usr/bin/llama-cli", "--model", "m.gguf", "--port", "81"]) is None
