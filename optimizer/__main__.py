"""Entry point of the optimize environment: ``python -m optimizer COMMAND``.

The ``model-optimizer`` CLI (gateway environment) calls this by subprocess, because torch,
transformers and llm-compressor live only in the optimize environment. Exit codes: 0 done,
1 a variant failed its precision check, 2 bad input (nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from optimizer.artifacts import OutputError, check_output
from optimizer.gguf_build import is_gguf_target, optimize_gguf, verify_gguf
from optimizer.gguf_measure import GGUFBuildError
from optimizer.gguf_plan import GGUFPlanError
from optimizer.kvcache import KVCacheError
from optimizer.layers import PlanError
from optimizer.pipeline import CheckFailed, Job, emulate, optimize, verify
from optimizer.recipe import Recipe, RecipeError, load_recipe, single_variant_recipe
from optimizer.sources import SourceError, describe_source, materialize

DEFAULT_RECIPE = Path(__file__).resolve().parent.parent / "policies" / "recipes" / "default.yaml"


def _say(message: str) -> None:
    """Progress and results go to stdout; libraries' noise (warnings, bars) stays on stderr."""
    print(f"optimize: {message}", flush=True)


def _outputs(recipe: Recipe, output: Path, single: str | None) -> dict[str, Path]:
    if single:
        return {name: output for name in recipe.variants}
    return {name: output / name for name in recipe.variants}


def optimize_command(args: argparse.Namespace) -> int:
    started = time.monotonic()
    recipe = load_recipe(args.recipe) if args.recipe else load_recipe(DEFAULT_RECIPE)
    if args.quantize:
        recipe = single_variant_recipe(args.quantize, recipe)
    source = describe_source(args.model)
    outputs = _outputs(recipe, args.output, args.quantize)
    check_output(args.output, outputs)
    job = Job(
        source=source,
        model_dir=materialize(args.model, args.cache),
        recipe=recipe,
        recipe_path=str(args.recipe or DEFAULT_RECIPE),
        outputs=outputs,
        target_framework=args.target_framework,
        compile_level=args.compile_level,
    )
    build = optimize_gguf if is_gguf_target(args.target_framework) else optimize
    try:
        results = build(job, _say)
    except CheckFailed as exc:
        print(str(exc), flush=True)
        return 1
    built = [r.name for r in results if not r.skipped]
    verb = "built " + ", ".join(built) if built else "nothing to do: every variant is up to date"
    _say(f"{verb} in {time.monotonic() - started:.1f}s → {args.output}")
    return 0


def quiet_and_fair() -> None:
    """Before torch loads: sleeping OpenMP waits, and no progress bars from transformers.

    With the default (spinning) OpenMP waits, two busy processes on two cores slow each other
    tenfold (measured: one SmolLM2 forward pass took 16.5 s spinning, 1.5 s passive).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    # llm-compressor logs every step (and GPTQ metrics) to stdout; our progress says enough.
    os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")


def check_command(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.recipe) if args.recipe else load_recipe(DEFAULT_RECIPE)
    if not (args.variant / "metadata.json").is_file():
        raise SourceError(f"not a variant folder: {args.variant} has no metadata.json")
    meta = json.loads((args.variant / "metadata.json").read_text())
    check = verify_gguf if meta.get("format") == "gguf" else verify
    try:
        check(materialize(args.model, args.cache), args.variant, recipe, _say)
    except CheckFailed as exc:
        print(str(exc), flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    quiet_and_fair()
    parser = argparse.ArgumentParser(prog="python -m optimizer")
    sub = parser.add_subparsers(dest="command", required=True)
    mat = sub.add_parser("materialize", help="print a Hugging Face folder for a model source")
    mat.add_argument("model", help="'default', a Hugging Face folder or a GGUF file")
    mat.add_argument("--cache", type=Path, required=True)
    opt = sub.add_parser("optimize", help="write the recipe's variants")
    opt.add_argument("--model", required=True)
    opt.add_argument("--recipe", type=Path, default=None)
    opt.add_argument("--output", type=Path, required=True)
    opt.add_argument("--quantize", default=None, help="single-variant form: fp16, int8, int4")
    opt.add_argument(
        "--target-framework",
        required=True,
        help="e.g. vllm==0.32.0 (safetensors variants) or llama.cpp (GGUF variants)",
    )
    opt.add_argument("--compile-level", type=int, default=1, choices=(1, 2, 3))
    opt.add_argument("--cache", type=Path, required=True)
    emu = sub.add_parser("emulate", help="a dequantized bf16 copy of a quantized variant")
    emu.add_argument("--variant", type=Path, required=True)
    emu.add_argument("--output", type=Path, required=True)
    chk = sub.add_parser("check", help="precision-check a variant folder against its model")
    chk.add_argument("--model", required=True)
    chk.add_argument("--variant", type=Path, required=True)
    chk.add_argument("--recipe", type=Path, default=None)
    chk.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "materialize":
            print(materialize(args.model, args.cache), flush=True)
            return 0
        if args.command == "check":
            return check_command(args)
        if args.command == "emulate":
            if not (args.variant / "metadata.json").is_file():
                raise SourceError(f"not a variant folder: {args.variant} has no metadata.json")
            emulate(args.variant, args.output, _say)
            return 0
        return optimize_command(args)
    except (
        SourceError,
        RecipeError,
        OutputError,
        PlanError,
        KVCacheError,
        GGUFPlanError,
        GGUFBuildError,
    ) as exc:
        # materialize's stdout is its answer (a path); the other commands report on stdout.
        stream = sys.stderr if args.command == "materialize" else sys.stdout
        print(f"error: {exc}", file=stream, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
