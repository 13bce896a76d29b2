"""The ``model-optimizer`` command line: parse, dispatch, turn known failures into one line.

Usage errors (bad model path, a file that is not a model, a port in use) exit with 2;
failures while running (a tier that dies during start) exit with 1.
"""

from __future__ import annotations

import argparse
import sys

from backends.process import TierStartError
from model_optimizer import __version__
from model_optimizer.models import ModelError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="model-optimizer",
        description="Serve one LLM at several precisions behind one OpenAI-compatible endpoint.",
    )
    parser.add_argument("--version", action="version", version=f"model-optimizer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser("up", help="run the model's tier(s) and the gateway on 127.0.0.1")
    up.add_argument("--model", default="default", help="'default', an HF folder or a GGUF file")
    up.add_argument("--served-model-name", default=None, help="public model id")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument("--tier-port", type=int, default=8101, help="first tier's port")
    up.add_argument("--max-model-len", type=int, default=2048)
    up.add_argument("--start-timeout", type=float, default=300.0, help="seconds per tier")
    return parser


def _up(args: argparse.Namespace) -> int:
    from model_optimizer.stack import UpOptions, run_up

    return run_up(
        UpOptions(
            model=args.model,
            served_model_name=args.served_model_name,
            gateway_port=args.port,
            tier_port=args.tier_port,
            max_model_len=args.max_model_len,
            start_timeout=args.start_timeout,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("model-optimizer: error: a command is required", file=sys.stderr)
        return 2
    try:
        return _up(args)
    except ModelError as exc:
        print(f"model-optimizer: error: {exc}", file=sys.stderr)
        return 2
    except TierStartError as exc:
        code = 2 if "already in use" in str(exc) else 1
        print(f"\nmodel-optimizer: error: {exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
