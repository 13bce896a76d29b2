"""``python -m gateway --config gateway.yaml [--host 127.0.0.1] [--port 8000]``."""

from __future__ import annotations

import argparse
import sys

from gateway.app import load_counter, load_policies, serve
from gateway.config import ConfigError, keys_from_environment, load_config
from gateway.policy.schema import PolicyError
from gateway.request.limits import TokenizerError


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the config, serve; exit code 2 on usage or config errors."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file with a GatewayConfig")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    try:
        config = keys_from_environment(load_config(args.config))
        load_policies(config)  # a bad policy or tokenizer stops the gateway here, in one line
        load_counter(config)
    except (ConfigError, PolicyError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve(config, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
