"""ablation: the ladder's order, deltas against the last measured step, vLLM's reason."""

from pathlib import Path

import pytest

from measure.ablation import StepOutcome, deltas, ladder, markdown, vllm_reason
from measure.bench import RunResult
from measure.memory import PeakMemory
from measure.serving_stats import RequestResult, compute_stats


def test_ladder_changes_one_thing_per_step() -> None:
    steps = ladder(("fp8",))
    assert [s.name for s in steps] == ["fp16", "int8", "int4", "int4 kv fp8", "routing"]
    assert [s.tier for s in steps] == ["fp16", "int8", "int4", "int4", None]
    assert steps[3].kv_cache_dtypes == ("fp8",)
    assert all(not s.kv_cache_dtypes for i, s in enumerate(steps) if i != 3)


def _run(label: str, level: int, ttft: float, rss: float) -> RunResult:
    results = [RequestResult(0.0, True, 8, 3, ttft=ttft, itl=(0.1, 0.1), latency=ttft + 0.2)]
    return RunResult(
        label,
        "http://127.0.0.1:1",
        "tier",
        "m",
        level,
        1,
        8,
        3,
        False,
        compute_stats(results, duration=1.0),
        [PeakMemory(label, 1, rss, None)],
        None,
    )


def test_deltas_skip_a_step_that_could_not_run() -> None:
    steps = ladder(("fp8",))
    outcomes = [
        StepOutcome(steps[0], True),
        StepOutcome(steps[1], True),
        StepOutcome(steps[2], True),
        StepOutcome(steps[3], False, "--kv-cache-dtype fp8: vLLM refused it: no AVX-512"),
        StepOutcome(steps[4], True),
    ]
    runs = [
        _run("fp16", 1, 0.4, 1000),
        _run("int8", 1, 0.2, 1100),
        _run("int4", 1, 0.2, 900),
        _run("routing", 1, 0.3, 3000),
    ]
    found = deltas(outcomes, runs)
    ttft = {(d.step, d.against): d for d in found if d.metric == "median_ttft_ms"}
    assert set(ttft) == {("int8", "fp16"), ("int4", "int8"), ("routing", "int4")}
    assert ttft[("int8", "fp16")].change_pct == pytest.approx(-50)
    assert ttft[("routing", "int4")].change_pct == pytest.approx(50)
    rss = next(d for d in found if d.step == "int4" and d.metric == "peak_rss_mib")
    assert (rss.before, rss.after) == (1100, 900)
    text = markdown(outcomes, found)
    assert "no AVX-512" in text
    assert "| int4 kv fp8 |" in text and "-50%" in text


def test_vllm_reason_finds_the_cause_not_the_last_line(tmp_path: Path) -> None:
    log = tmp_path / "tier.log"
    log.write_text(
        "INFO starting\n"
        "(EngineCore pid=1) NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512.\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert vllm_reason(log, "fallback") == (
        "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512."
    )
    assert vllm_reason(tmp_path / "missing.log", "fallback") == "fallback"
