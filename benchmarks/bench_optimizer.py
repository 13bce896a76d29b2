"""Optimizer benchmark: time, peak memory and size per variant, against a bare oneshot.

    python3 benchmarks/bench_optimizer.py [--variants int4,int8,fp16] [--out bench-results]

For each variant, in one run so the ratios hold on a shared machine: the full optimizer
(``python -m optimizer optimize --quantize V``: plan, GPTQ, write, layout, KV config, load
back and precision-check) and, for int4/int8, a bare llm-compressor ``oneshot`` + save on the
same model and calibration data. Each runs as a child process; peak RSS comes from wait4.
Prints a Markdown table and writes it with the raw JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model_optimizer.envs import cache_root, env_python  # noqa: E402
from model_optimizer.models import materialize  # noqa: E402


def run_child(argv: list[str]) -> tuple[float, float]:
    """Run ``argv``; return (seconds, peak RSS in MB) of that child alone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) != 0:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        raise SystemExit(f"benchmark child failed: {' '.join(argv[:4])}...\n{err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def weights_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="fp16,int8,int4")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = parser.parse_args()
    python = str(env_python("optimize"))
    model_dir = materialize("default")
    source_mb = weights_mb(model_dir)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            ours_dir = Path(tmp) / f"ours-{variant}"
            print(f"bench: {variant}: optimizer ...", file=sys.stderr, flush=True)
            ours = run_child(
                [
                    python,
                    "-m",
                    "optimizer",
                    "optimize",
                    "--model",
                    "default",
                    "--quantize",
                    variant,
                    "--output",
                    str(ours_dir),
                    "--target-framework",
                    "vllm==0.32.0",
                    "--cache",
                    str(cache_root()),
                ]
            )
            row = {
                "variant": variant,
                "optimizer_s": ours[0],
                "optimizer_peak_mb": ours[1],
                "size_mb": weights_mb(ours_dir),
                "source_mb": source_mb,
            }
            meta = json.loads((ours_dir / "metadata.json").read_text())
            row["check_kl"] = meta["check"]["report"]["mean_kl"]
            row["check_top1"] = meta["check"]["report"]["top1"]
            if variant in ("int4", "int8"):
                bare_dir = Path(tmp) / f"bare-{variant}"
                print(f"bench: {variant}: bare oneshot ...", file=sys.stderr, flush=True)
                bare = run_child(
                    [
                        python,
                        str(ROOT / "benchmarks" / "_bare_oneshot.py"),
                        variant,
                        str(model_dir),
                        str(bare_dir),
                    ]
                )
                row.update(
                    {
                        "bare_s": bare[0],
                        "bare_peak_mb": bare[1],
                        "bare_size_mb": weights_mb(bare_dir),
                    }
                )
                shutil.rmtree(bare_dir)
            rows.append(row)
    table = render(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "optimizer.json").write_text(json.dumps(rows, indent=2))
    (args.out / "optimizer.md").write_text(table)
    return 0


def render(rows: list[dict[str, float | str]]) -> str:
    head = (
        "| variant | optimizer s | bare oneshot s | overhead | optimizer peak MB | "
        "bare peak MB | size MB (source) | check KL / top-1 |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        bare = r.get("bare_s")
        if bare:
            overhead = f"{float(r['optimizer_s']) / float(bare):.2f}x"
            bare_s, bare_mb = f"{float(bare):.0f}", f"{float(r['bare_peak_mb']):.0f}"
        else:
            overhead, bare_s, bare_mb = "n/a (a cast)", "-", "-"
        lines.append(
            f"| {r['variant']} | {float(r['optimizer_s']):.0f} | {bare_s} | {overhead} | "
            f"{float(r['optimizer_peak_mb']):.0f} | {bare_mb} | "
            f"{float(r['size_mb']):.0f} ({float(r['source_mb']):.0f}) | "
            f"{float(r['check_kl']):.3f} / {float(r['check_top1']):.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
