"""A benchmark's outputs: ``bench.json``, ``bench.md`` and PNG plots, written all or nothing.

The JSON has one object per run whose keys include those of ``vllm bench serve``'s result file
(``completed``, ``failed``, ``mean_ttft_ms``, ``p99_itl_ms``, ``output_throughput``, ...), plus
the target, peak memory per backend and, through a gateway, the requests each tier answered.
Files are written into a hidden folder beside the destination, which is renamed into place at
the end: a crash or Ctrl-C while writing leaves no half-written output folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from measure.bench import BenchResult, RunResult

SCHEMA = "model-optimizer-bench/1"
LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))


def run_json(run: RunResult) -> dict[str, Any]:
    """One run as a flat object: vLLM's field names at the top level."""
    out = {k: v for k, v in dataclasses.asdict(run).items() if k != "stats"}
    out.update(dataclasses.asdict(run.stats))
    return out


def result_json(result: BenchResult, command: Sequence[str], extra: dict[str, Any]) -> str:
    body: dict[str, Any] = {
        "schema": SCHEMA,
        "partial": result.partial,
        "model_id": result.model_id,
        "started_at": result.started_at,
        "command": list(command),
        "config": dataclasses.asdict(result.config),
        "runs": [run_json(run) for run in result.runs],
        **extra,
    }
    return json.dumps(body, indent=2) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _memory(run: RunResult) -> str:
    if not run.peak_memory:
        return "-"
    parts = []
    for peak in run.peak_memory:
        gpu = f" (GPU {peak.peak_gpu_mib:.0f})" if peak.peak_gpu_mib is not None else ""
        name = f"{peak.name} " if run.kind == "gateway" else ""
        parts.append(f"{name}{peak.peak_rss_mib:.0f}{gpu}")
    return ", ".join(parts)


def markdown_table(runs: Sequence[RunResult]) -> str:
    """One row per run; latencies in ms (E2EL in s), throughputs in tokens/s, memory in MiB."""
    head = (
        "| target | conc | ok | fail | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms "
        "| ITL p50 / p99 ms | E2EL p50 / p99 s | out tok/s | total tok/s | peak RSS MiB |"
    )
    lines = [head, "|" + "---|" * 11]
    for run in runs:
        s = run.stats
        e2el = " / ".join(
            "-" if v is None else f"{v / 1000:.1f}" for v in (s.p50_e2el_ms, s.p99_e2el_ms)
        )
        label = f"{run.label} (partial)" if run.partial else run.label
        lines.append(
            f"| {label} | {run.max_concurrency} | {s.completed} | {s.failed} "
            f"| {_ms(s.p50_ttft_ms)} / {_ms(s.p90_ttft_ms)} / {_ms(s.p99_ttft_ms)} "
            f"| {_ms(s.p50_tpot_ms)} / {_ms(s.p90_tpot_ms)} / {_ms(s.p99_tpot_ms)} "
            f"| {_ms(s.p50_itl_ms)} / {_ms(s.p99_itl_ms)} | {e2el} "
            f"| {s.output_throughput:.1f} | {s.total_token_throughput:.1f} | {_memory(run)} |"
        )
    return "\n".join(lines) + "\n"


def served_note(runs: Sequence[RunResult]) -> str:
    """Which tier answered the gateway's runs (empty when no run went through a gateway)."""
    lines = []
    for run in runs:
        if run.served_by is not None:
            shares = ", ".join(f"{t} {n}" for t, n in run.served_by.items()) or "unknown"
            lines.append(f"- {run.label} c={run.max_concurrency}: {shares}")
    if not lines:
        return ""
    return "Requests answered per tier through the gateway (its /metrics):\n\n" + "\n".join(lines)


def _by_label(runs: Sequence[RunResult]) -> dict[str, list[RunResult]]:
    lines: dict[str, list[RunResult]] = {}
    for run in runs:
        lines.setdefault(run.label, []).append(run)
    return lines


def _concurrency_axis(ax: Any, runs: Sequence[RunResult]) -> None:
    levels = sorted({r.max_concurrency for r in runs})
    ax.set_xlabel("concurrency")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)


def plot_latency(runs: Sequence[RunResult], path: Path, title: str) -> None:
    """2x2 panels (TTFT, TPOT, ITL, E2EL): p50 solid, p90 dashed, p99 dotted, one colour per
    target, against concurrency."""
    # Here, not at the top: a heavy import only plots need, and Agg must be chosen before pyplot.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, name) in zip(axes.flat, LATENCIES, strict=True):
        for i, (label, line) in enumerate(_by_label(runs).items()):
            xs = [r.max_concurrency for r in line]
            for p, style in ((50, "-"), (90, "--"), (99, ":")):
                ys = [getattr(r.stats, f"p{p}_{key}_ms") for r in line]
                ys = [float("nan") if y is None else y for y in ys]
                ax.plot(
                    xs,
                    ys,
                    style,
                    marker="o",
                    color=colours[i % len(colours)],
                    label=f"{label} p{p}",
                )
        ax.set_title(f"{name} (ms)")
        _concurrency_axis(ax, runs)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_throughput(runs: Sequence[RunResult], path: Path, title: str) -> None:
    """Output and total tokens/s against concurrency, one line per target."""
    # Here, not at the top: a heavy import only plots need, and Agg must be chosen before pyplot.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, line in _by_label(runs).items():
        xs = [r.max_concurrency for r in line]
        axes[0].plot(xs, [r.stats.output_throughput for r in line], marker="o", label=label)
        axes[1].plot(xs, [r.stats.total_token_throughput for r in line], marker="o", label=label)
    for ax, name in zip(axes, ("output tokens/s", "total tokens/s"), strict=True):
        ax.set_title(name)
        _concurrency_axis(ax, runs)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(
    destination: Path, files: dict[str, str], runs: Sequence[RunResult], title: str
) -> None:
    """``files`` (name → text) and the two plots into ``destination``, which must not exist;
    all of them or none (a hidden staging folder beside it, renamed at the end)."""
    destination = destination.absolute()
    if destination.exists():
        raise FileExistsError(f"output folder {destination} already exists")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would stay on the renamed folder
        for name, text in files.items():
            (staging / name).write_text(text, encoding="utf-8")
        if runs:
            plot_latency(runs, staging / "latency.png", title)
            plot_throughput(runs, staging / "throughput.png", title)
        os.rename(staging, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise
