"""``bench --ablation``: the seeds' ladder, one variable at a time, each step against the last.

fp16 → int8 → int4 (weights; each straight to the stack's tier) → int4 with another KV cache
dtype (the int4 tier launched again beside the stack, exactly as ``up`` launches it but for
``--kv-cache-dtype``; the first dtype that starts is used) → routing on (the same load through
the gateway). Each measured step is compared with the measured step before it, at every
concurrency level. A step that cannot run here (vLLM refuses the KV dtype on this CPU) is
reported with vLLM's reason and no figures; the next step is then compared with the one before.

``ladder`` and ``deltas`` are pure; ``kv_tier`` is the I/O (a vLLM process, stopped on exit).
How ``up`` launches a tier comes from the CLI as a ``TierLauncher`` (measure sits below it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx
import psutil

from backends.commands import Programs
from backends.launch import TierLaunch
from backends.process import TierProcess, TierStartError, free_port
from common.env_paths import cache_root, env_python
from measure.bench import RunResult
from measure.memory import Backend, backends_of

# vLLM 0.32's CPU attention accepts auto and fp8/fp8_e4m3/fp8_e5m2, the fp8 ones only with
# AVX-512 or AMX (all three take the same check, so one refusal stands for the family).
DEFAULT_KV_DTYPES = ("fp8",)
# Figures compared between steps: (field of ServingStats or "peak_rss_mib", header, higher is
# better).
COMPARED = (
    ("median_ttft_ms", "TTFT p50 ms", False),
    ("median_tpot_ms", "TPOT p50 ms", False),
    ("median_e2el_ms", "E2EL p50 ms", False),
    ("output_throughput", "out tok/s", True),
    ("peak_rss_mib", "peak RSS MiB (all tiers sampled)", False),
)


class TierLauncher(Protocol):
    """What the KV step needs from ``up``; the CLI hands one in (model_optimizer.tier_setup's)."""

    def launch(self, model: str, tier: str) -> TierLaunch:
        """``tier``'s launch exactly as ``up`` builds it for ``model``'s cached variants."""
        ...

    def warm_up(self, launch: TierLaunch) -> None:
        """``up``'s warm-up requests against a started tier."""
        ...


@dataclass(frozen=True)
class Step:
    name: str  # the run label of the step
    change: str  # the one thing that differs from the step before
    tier: str | None = None  # the stack's tier measured directly (None: the gateway)
    kv_cache_dtypes: tuple[str, ...] = ()  # relaunch ``tier`` with the first that starts


@dataclass(frozen=True)
class StepOutcome:
    step: Step
    measured: bool
    note: str = ""  # why not measured, or what else one should know


@dataclass(frozen=True)
class Delta:
    step: str
    against: str
    concurrency: int
    metric: str
    before: float | None
    after: float | None
    change_pct: float | None  # (after - before) / before x 100


def ladder(kv_dtypes: Sequence[str] = DEFAULT_KV_DTYPES) -> list[Step]:
    """The steps in order (pure)."""
    kv = "/".join(kv_dtypes)
    return [
        Step("fp16", "baseline: fp16 weights, straight to the tier", "fp16"),
        Step("int8", "weights fp16 -> int8 (W8A8)", "int8"),
        Step("int4", "weights int8 -> int4 (W4A16)", "int4"),
        Step(f"int4 kv {kv}", f"KV cache dtype auto -> {kv}", "int4", tuple(kv_dtypes)),
        Step(
            "routing",
            "straight to one tier -> through the gateway, which routes each request to a tier "
            "(the stack's tiers, KV cache dtype auto)",
            None,
        ),
    ]


def figure(run: RunResult, metric: str) -> float | None:
    if metric == "peak_rss_mib":
        peaks = [p.peak_rss_mib for p in run.peak_memory]
        return sum(peaks) if peaks else None
    value = getattr(run.stats, metric)
    return None if value is None else float(value)


def deltas(outcomes: Sequence[StepOutcome], runs: Sequence[RunResult]) -> list[Delta]:
    """Each measured step against the measured step before it, per level and figure (pure)."""
    by_step: dict[str, dict[int, RunResult]] = {}
    for run in runs:
        by_step.setdefault(run.label, {})[run.max_concurrency] = run
    out: list[Delta] = []
    previous: str | None = None
    for outcome in outcomes:
        if not outcome.measured:
            continue
        name = outcome.step.name
        if previous is not None:
            for level, run in sorted(by_step.get(name, {}).items()):
                before_run = by_step.get(previous, {}).get(level)
                if before_run is None:
                    continue
                for metric, _, _ in COMPARED:
                    before, after = figure(before_run, metric), figure(run, metric)
                    pct = None
                    if before is not None and after is not None and before != 0:
                        pct = (after - before) / before * 100
                    out.append(Delta(name, previous, level, metric, before, after, pct))
        previous = name
    return out


def markdown(outcomes: Sequence[StepOutcome], found: Sequence[Delta]) -> str:
    """The ladder as a table: one row per step and level, each figure with its change."""
    head = "| step | change | vs | conc | " + " | ".join(h for _, h, _ in COMPARED) + " |"
    lines = [head, "|" + "---|" * (4 + len(COMPARED))]
    for outcome in outcomes:
        step = outcome.step
        mine = [d for d in found if d.step == step.name]
        if not outcome.measured:
            blank = " | ".join("-" for _ in COMPARED)
            lines.append(f"| {step.name} | {step.change} | - | - | {blank} |")
            continue
        levels = sorted({d.concurrency for d in mine})
        if not levels:  # the first measured step: nothing to compare with
            lines.append(f"| {step.name} | {step.change} | - | all | (baseline, see above) |")
            continue
        for level in levels:
            cells = []
            for metric, _, _ in COMPARED:
                d = next(x for x in mine if x.concurrency == level and x.metric == metric)
                after = "-" if d.after is None else f"{d.after:.1f}"
                pct = "" if d.change_pct is None else f" ({d.change_pct:+.0f}%)"
                cells.append(after + pct)
            against = mine[0].against
            lines.append(
                f"| {step.name} | {step.change} | {against} | {level} | {' | '.join(cells)} |"
            )
    notes = [f"- {o.step.name}: {o.note}" for o in outcomes if o.note]
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def _threads_of(pid: int) -> str | None:
    """The running tier's core binding, so the relaunched one gets the same cores."""
    with contextlib.suppress(psutil.Error):
        bound = psutil.Process(pid).environ().get("VLLM_CPU_OMP_THREADS_BIND")
        return str(bound) if bound else None
    return None


def vllm_reason(log: Path, fallback: str) -> str:
    """The line of a failed vLLM start that says why (its first NotImplementedError/ValueError
    line, which the engine's later 'initialization failed' lines only point at)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return fallback
    for marker in ("NotImplementedError:", "ValueError:", "TypeError:", "AssertionError:"):
        for line in lines:
            if marker in line:
                return line[line.index(marker) :].strip()[:300]
    return fallback


@contextlib.contextmanager
def kv_tier(
    model: str, tier: str, running: Backend, dtypes: Sequence[str], launcher: TierLauncher
) -> Iterator[tuple[str | None, list[Backend], str, str]]:
    """Start ``tier`` as ``up`` would (``launcher``), on a free port, with the first of ``dtypes``
    vLLM accepts; yields (dtype or None, its backends, its URL, notes) and stops it on exit."""
    launch = launcher.launch(model, tier)
    threads = _threads_of(running.pid) or launch.cpu_threads
    notes: list[str] = []
    for dtype in dtypes:
        one = dataclasses.replace(
            launch, port=free_port(), kv_cache_dtype=dtype, cpu_threads=threads
        )
        log = cache_root() / "logs" / f"bench-{tier}-kv-{dtype}.log"
        process = TierProcess(one, Programs(vllm_python=env_python("serve")), log)
        print(f"bench: starting {tier} with --kv-cache-dtype {dtype} ...", file=sys.stderr)
        try:
            process.start()
            process.wait_ready(timeout=300)
            launcher.warm_up(one)
        except (TierStartError, httpx.HTTPError) as exc:
            process.stop()
            reason = vllm_reason(log, " ".join(str(exc).split()))
            notes.append(f"--kv-cache-dtype {dtype}: the tier did not start: {reason}")
            continue
        try:
            pid = process.process.pid if process.process is not None else 0
            url = f"http://{one.host}:{one.port}"
            yield dtype, backends_of(pid), url, "; ".join(notes)
        finally:
            process.stop()
        return
    yield None, [], "", "; ".join(notes)
