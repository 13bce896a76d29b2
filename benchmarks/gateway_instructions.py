"""Instructions the gateway process executes per proxied request, counted by callgrind.

    ./mo setup && $(python3 -m model_optimizer.envs path gateway)/bin/python \\
        benchmarks/gateway_instructions.py [--requests 200] [--stream] [--redis] [--keep]
        [--trace-ratio 1] [--whole-answers regenerate|continue]

Wall-clock latency on a shared 2-core VM moves by half between runs minutes apart (see
docs/benchmarks.md#gateway-overhead); the number of instructions a request costs does not
(~1 % between runs, whatever else the machine does), so changes to the request path are
compared with this. The stub upstream of bench_gateway.py answers; the gateway runs as
bench_gateway.py runs it (one tier, the shipped classifier, the default model's tokenizer,
spans) under ``valgrind --tool=callgrind`` with counting off; after 50 warm-up requests
counting is switched on (``callgrind_control -i on``), --requests requests are sent one at a
time (each prompt its own, as in bench_gateway.py: the gateway caches token counts per text),
and the counters are dumped. Without --redis the gateway keeps its state locally: its
Redis writes are timed (one per ``shared_flush_interval``) and valgrind's ~50x slowdown would
put one on every request. Needs Debian's valgrind (``callgrind_control``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backends.process import free_port  # noqa: E402
from benchmarks.bench_gateway import (  # noqa: E402
    HEADERS,
    LOCAL,
    Server,
    clean_env,
    find_tokenizer_dir,
    gateway_env,
    request_bodies,
    say,
    start,
    wait_ready,
    write_gateway_config,
)
from benchmarks.http_load import Pool, post_bytes  # noqa: E402
from model_optimizer.tier_setup import DEFAULT_SERVED_NAME  # noqa: E402

WARM_UP = 50


async def send(port: int, raws: list[bytes]) -> None:
    pool = Pool(LOCAL, port, 1, 60.0)
    try:
        for raw in raws:
            answer = await pool.request(raw)
            if answer.status != 200:
                raise SystemExit(f"the gateway answered {answer.status}: {answer.tail[-200:]!r}")
    finally:
        pool.close()


def total_instructions(dump: Path) -> int:
    """The ``summary:`` (or ``totals:``) line of a callgrind dump: instructions executed."""
    text = dump.read_text(encoding="utf-8", errors="replace")
    found = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if found is None:
        raise SystemExit(f"{dump}: no summary line (is it a callgrind dump?)")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--stream", action="store_true", help="streamed answers")
    parser.add_argument("--redis", action="store_true", help="shared state in Redis")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--trace-ratio", type=float, default=1.0, help="share of requests traced (default 1)"
    )
    parser.add_argument(
        "--whole-answers",
        choices=("regenerate", "continue"),
        default="regenerate",
        help="the policy's failover.whole_answers (continue: whole answers asked as streams)",
    )
    args = parser.parse_args()
    if args.requests < 1:
        parser.error("--requests must be positive")
    if not 0 < args.trace_ratio <= 1:
        parser.error(f"--trace-ratio: a share in (0, 1], not {args.trace_ratio:g}")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("gateway_instructions: valgrind is not installed", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="mo-instr-"))
    servers: list[Server] = []
    try:
        stub_port, port = free_port(), free_port()
        cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_gateway.py")]
        cmd += ["--serve-stub", str(stub_port), "--model", DEFAULT_SERVED_NAME]
        servers.append(start("stub", cmd, workdir, clean_env()))
        upstream = f"http://{LOCAL}:{stub_port}"
        if why := wait_ready(servers[-1], f"{upstream}/health", 30):
            raise SystemExit(f"stub upstream did not start: {why}")
        prefix = "mo:instr" if args.redis else None
        config = write_gateway_config(
            workdir, upstream, DEFAULT_SERVED_NAME, find_tokenizer_dir(), prefix, args.whole_answers
        )
        dump = workdir / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        cmd += [f"--callgrind-out-file={dump}", sys.executable, "-m", "gateway"]
        cmd += ["--config", str(config), "--host", LOCAL, "--port", str(port)]
        gateway = start("gateway", cmd, workdir, gateway_env(args.trace_ratio))
        servers.append(gateway)
        say("gateway starting under callgrind (a minute or two)")
        if why := wait_ready(gateway, f"http://{LOCAL}:{port}/readyz", 600):
            raise SystemExit(f"gateway did not start: {why}\n{gateway.tail()}")
        bodies = request_bodies(DEFAULT_SERVED_NAME, args.stream, 8, WARM_UP + args.requests)
        raws = [post_bytes(LOCAL, port, "/v1/chat/completions", b, HEADERS) for b in bodies]
        asyncio.run(send(port, raws[:WARM_UP]))
        pid = str(gateway.process.pid)
        subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
        say(f"{args.requests} requests, counted")
        asyncio.run(send(port, raws[WARM_UP:]))
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        dumps = sorted(workdir.glob("callgrind.out*"), key=lambda p: p.stat().st_size)
        if not dumps:
            raise SystemExit(f"no callgrind dump in {workdir}")
        total = total_instructions(dumps[-1])
        mode = "streamed" if args.stream else f"whole, {args.whole_answers}"
        state = "Redis" if args.redis else "local state"
        if args.trace_ratio < 1:
            state += f", a share of {args.trace_ratio:g} traced"
        print(
            f"{total / args.requests:,.0f} instructions per request ({mode} answers, {state}; "
            f"{total:,} over {args.requests} requests)"
        )
        return 0
    finally:
        for server in reversed(servers):
            server.stop()
        if args.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
