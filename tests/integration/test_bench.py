"""``model-optimizer bench`` end to end on the real stack at tiny sizes, and its Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from model_optimizer.envs import ROOT
from tests.integration.conftest import Stack, cli

pytestmark = pytest.mark.integration
INPUT, OUTPUT = 32, 8
VLLM_FIELDS = [
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrency",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "input_lens",
    "output_lens",
    "ttfts",
    "itls",
    "latencies",
    "errors",
] + [
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p99")
]


def test_bench_a_tier_and_the_gateway(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "--target", stack.gateway_url, "--tier", "fp16,gateway"]
    args += ["--input-len", str(INPUT), "--output-len", str(OUTPUT), "--concurrency", "1,2"]
    args += ["--num-prompts", "2", "--output", str(out)]
    done = cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    body = json.loads((out / "bench.json").read_text())
    assert body["partial"] is False and body["model_id"] == "SmolLM2-135M-Instruct"
    runs = body["runs"]
    assert [(r["label"], r["max_concurrency"]) for r in runs] == [
        ("fp16", 1),
        ("fp16", 2),
        ("gateway", 1),
        ("gateway", 2),
    ]
    for run in runs:
        for name in VLLM_FIELDS:
            assert run.get(name) is not None, (run["label"], name)
        assert (run["completed"], run["failed"]) == (2, 0), run["errors"]
        # The server's own counts: prompts are exactly INPUT tokens, answers OUTPUT (ignore_eos).
        assert run["input_lens"] == [INPUT, INPUT] and run["output_lens"] == [OUTPUT, OUTPUT]
        for metric in ("ttft", "tpot", "itl", "e2el"):
            p50, p90, p99 = (run[f"p{p}_{metric}_ms"] for p in (50, 90, 99))
            assert 0 < p50 <= p90 <= p99, (run["label"], metric)
        assert run["output_throughput"] > 0
        assert run["total_token_throughput"] > run["output_throughput"]
        assert all(
            m["peak_rss_mib"] > 100 and m["peak_gpu_mib"] is None for m in run["peak_memory"]
        )
    assert [m["name"] for m in runs[0]["peak_memory"]] == ["fp16"]
    assert {m["name"] for m in runs[2]["peak_memory"]} == set(stack.tier_urls)
    assert sum(runs[2]["served_by"].values()) >= 2
    table = (out / "bench.md").read_text()
    assert table.count("| fp16 |") == 2 and table.count("| gateway |") == 2
    for png in ("latency.png", "throughput.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "| gateway | 2 | 2 | 0 |" in done.stdout


def test_ctrl_c_writes_what_was_measured(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = ["bench", "--target", stack.tier_urls["fp16"], "--input-len", str(INPUT)]
    args += ["--output-len", str(OUTPUT), "--concurrency", "1,2", "--num-prompts", "2"]
    process = subprocess.Popen(
        [sys.executable, "-m", "model_optimizer.cli", *args, "--output", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default action even when this test runs in the background (where SIGINT
        # is ignored and the child would inherit that).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # the first level's summary line, then interrupt the second
        seen.append(line)
        if line.startswith("bench: fp16 c=1:"):
            break
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, "".join(seen) + stderr
    body = json.loads((out / "bench.json").read_text())
    assert body["partial"] is True
    first, *rest = body["runs"]
    assert (first["max_concurrency"], first["completed"], first["partial"]) == (1, 2, False)
    assert all(run["partial"] for run in rest)  # the level cut short, if anything finished in it
    assert "(partial)" in stdout and "partial" in stderr
