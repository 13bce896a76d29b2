"""report: vLLM's field names in the JSON, the table, plots, all-or-nothing folders."""

import json
from pathlib import Path

import pytest

from measure import report
from measure.bench import BenchConfig, BenchResult, RunResult
from measure.memory import PeakMemory
from measure.serving_stats import RequestResult, compute_stats


def _runs() -> list[RunResult]:
    out = []
    for label in ("fp16", "gateway"):
        for level in (1, 2):
            results = [
                RequestResult(0.0, True, 8, 4, ttft=0.1 * level, itl=(0.1,) * 3, latency=0.5),
                RequestResult(0.1, True, 8, 4, ttft=0.2, itl=(0.05,) * 3, latency=0.4),
            ]
            out.append(
                RunResult(
                    label,
                    "http://127.0.0.1:1",
                    "tier" if label == "fp16" else "gateway",
                    "m",
                    level,
                    2,
                    8,
                    4,
                    False,
                    compute_stats(results, 1.0),
                    [PeakMemory("fp16", 1, 2800.0, None)],
                    None if label == "fp16" else {"fp16": 2},
                )
            )
    return out


def test_json_runs_are_flat_with_vllm_names() -> None:
    result = BenchResult("m", BenchConfig(concurrency=(1, 2)), "now", _runs())
    body = json.loads(report.result_json(result, ["model-optimizer", "bench"], {"ablation": None}))
    assert body["partial"] is False and body["config"]["concurrency"] == [1, 2]
    run = body["runs"][0]
    for key in (
        "completed",
        "failed",
        "p99_itl_ms",
        "median_tpot_ms",
        "output_throughput",
        "max_concurrency",
        "duration",
        "total_input_tokens",
        "peak_memory",
    ):
        assert key in run, key
    assert run["peak_memory"][0]["peak_gpu_mib"] is None


def test_markdown_has_a_row_per_run() -> None:
    table = report.markdown_table(_runs())
    assert len(table.strip().splitlines()) == 2 + 4
    assert "| gateway | 2 | 2 | 0 |" in table
    assert "- gateway c=1: fp16 2" in report.served_note(_runs())


def test_write_outputs_all_or_nothing(tmp_path: Path) -> None:
    out = tmp_path / "results"
    report.write_outputs(out, {"bench.md": "x\n"}, _runs(), "title")
    assert sorted(p.name for p in out.iterdir()) == ["bench.md", "latency.png", "throughput.png"]
    assert (out / "latency.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(FileExistsError):
        report.write_outputs(out, {"bench.md": "y\n"}, [], "title")
    with pytest.raises(OSError):
        report.write_outputs(tmp_path / "other", {"no/such/dir.md": "z"}, [], "title")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]
