"""``model-optimizer classifier train|evaluate``: the request classifier's model, offline.

``train`` builds the train environment on first use (requirements/train.txt: scikit-learn and
the data packages; ``model_optimizer/envs.py``, keyed by the hash of its requirement files like
the other environments) and runs ``python -m classifier train`` there. ``evaluate`` is pure
Python and runs here, in the gateway environment.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from classifier import cli as classifier_cli
from model_optimizer.envs import ROOT, ensure, has_nvidia_gpu


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("classifier", help="train or evaluate the request classifier's model")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    classifier_cli.add_arguments(actions)


def run(args: argparse.Namespace) -> int:
    if args.action == "evaluate":
        return classifier_cli.run(args)
    try:
        env = ensure("train", has_nvidia_gpu())
    except subprocess.CalledProcessError as exc:
        print(
            f"model-optimizer: error: building the train environment failed: {exc}", file=sys.stderr
        )
        return 1
    argv = [
        str(env / "bin" / "python"),
        "-m",
        "classifier",
        "train",
        "--version",
        str(args.version),
    ]
    if args.data:
        argv += ["--data", str(Path(args.data).expanduser().absolute())]
    if args.output:
        argv += ["--output", str(Path(args.output).expanduser().absolute())]
    return subprocess.run(argv, cwd=ROOT, check=False).returncode
