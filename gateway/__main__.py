"""``python -m gateway --config gateway.yaml [--host 127.0.0.1] [--port 8000]``.

Bound beyond loopback (``--host 0.0.0.0``, an address, a name), the gateway refuses to start
without API keys (``MO_GATEWAY_API_KEYS``, or ``api_key_hashes`` in the config): an open
endpoint on the network is never a default.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from gateway.app import load_counter, load_policies, serve
from gateway.config import API_KEYS_ENV, ConfigError, keys_from_environment, load_config
from gateway.policy.schema import PolicyError
from gateway.request.tokens.limits import TokenizerError


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); anything else reaches beyond."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, load the config, serve; exit code 2 on usage or config errors."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file with a GatewayConfig")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    try:
        config = keys_from_environment(load_config(args.config))
        if not is_loopback(args.host) and not config.api_key_hashes:
            raise ConfigError(
                f"--host {args.host} listens beyond loopback: set {API_KEYS_ENV} (comma "
                "separated keys) or api_key_hashes in the config; the gateway does not serve "
                "an open endpoint"
            )
        load_policies(config)  # a bad policy or tokenizer stops the gateway here, in one line
        load_counter(config)
    except (ConfigError, PolicyError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve(config, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
