"""memory: finding vLLM servers by their command line, RSS of a process tree, the sampler."""

import importlib.util
import os
import subprocess
import sys
import time

from backends.process import free_port
from measure.memory import Backend, PeakSampler, listener_pid, tree_rss_bytes, vllm_server
from tests.servers import ServerThread
from tests.unit.measure.conftest import StubServer

SERVER = "vllm.entrypoints.openai.api_server"


def test_vllm_server_reads_the_tier_from_the_command_line() -> None:
    cmd = ["python", "-m", SERVER, "--model", "/cache/variants/M.emulated/int8", "--port", "8102"]
    assert vllm_server(cmd) == ("int8", 8102)
    assert vllm_server(["python", "-m", SERVER, "--port", "9"]) == ("port 9", 9)
    assert vllm_server(["python", "-m", "gateway", "--port", "8000"]) is None
    assert vllm_server(["python", "-m", SERVER, "--port", "x"]) is None


def test_tree_rss_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        alone = tree_rss_bytes(child.pid)
        assert alone > 0
        assert tree_rss_bytes(os.getpid()) >= alone
    finally:
        child.kill()
        child.wait()


def test_listener_pid_finds_this_process() -> None:
    thread = ServerThread(StubServer().app)
    thread.start()
    try:
        assert listener_pid(thread.port) == os.getpid()
    finally:
        thread.stop()
    assert listener_pid(free_port()) is None


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
