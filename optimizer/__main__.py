"""Entry point of the optimize environment: ``python -m optimizer COMMAND``.

The ``model-optimizer`` CLI (gateway environment) calls this by subprocess, because torch,
transformers and llm-compressor live only in the optimize environment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optimizer.sources import SourceError, materialize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimizer")
    sub = parser.add_subparsers(dest="command", required=True)
    mat = sub.add_parser("materialize", help="print a Hugging Face folder for a model source")
    mat.add_argument("model", help="'default', a Hugging Face folder or a GGUF file")
    mat.add_argument("--cache", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        print(materialize(args.model, args.cache), flush=True)
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
