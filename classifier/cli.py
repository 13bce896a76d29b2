"""``python -m classifier train|evaluate``: the request classifier's model, offline.

``train`` needs the train environment (scikit-learn); ``model-optimizer classifier train``
builds it and runs this there. ``evaluate`` is pure Python and runs anywhere the gateway does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "routing.yaml"


def add_arguments(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``train`` and ``evaluate`` actions (shared with ``model-optimizer classifier``)."""
    train = sub.add_parser("train", help="train the prompt model and write its weights file")
    train.add_argument("--data", default=None, help="training JSONL (classifier/data/train.jsonl)")
    train.add_argument(
        "--output", default=None, help="weights file (classifier/weights/prompt-model-v<N>.json)"
    )
    train.add_argument("--version", type=int, default=4, help="the weights' version number (4)")
    ev = sub.add_parser("evaluate", help="accuracy, precision/recall, confusion on labeled files")
    ev.add_argument(
        "files",
        nargs="*",
        type=Path,
        help="labeled JSONL files (default: the held-out set, its follow-ups, the routing prompts)",
    )
    ev.add_argument("--policy", type=Path, default=POLICY, help="policy with a model")
    ev.add_argument("--threshold", type=float, default=None, help="instead of the policy's")
    ev.add_argument("--misses", type=int, default=0, help="list this many misses per file")
    ev.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    ev.add_argument(
        "--cascade",
        type=Path,
        default=ROOT / "policies" / "classes-cascade.yaml",
        help="the cascade's classes section measured beside the policy's model",
    )


def run(args: argparse.Namespace) -> int:
    if args.action == "evaluate":
        # The gateway's classifier: the gateway environment's packages (not in the train env).
        from classifier import evaluate

        files = args.files or [evaluate.HELDOUT, evaluate.FOLLOWUPS, evaluate.ROUTING]
        missing = [f for f in files if not f.is_file()]
        if missing:
            print(f"model-optimizer: error: no such file: {missing[0]}", file=sys.stderr)
            return 2
        report = evaluate.run(
            files, args.policy, args.threshold, args.misses, args.json, cascade_file=args.cascade
        )
        print(report)
        return 0
    from classifier import train  # scikit-learn: only in the train environment

    weights = ROOT / "classifier" / "weights" / f"prompt-model-v{args.version}.json"
    opts = train.Options(
        data=Path(args.data) if args.data else train.TRAIN,
        output=Path(args.output) if args.output else weights,
        version=args.version,
    )
    train.train(opts)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m classifier")
    add_arguments(parser.add_subparsers(dest="action", required=True))
    return run(parser.parse_args(argv))
