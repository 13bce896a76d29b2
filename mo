#!/usr/bin/env bash
# Model-Optimizer launcher: sets up the three cached environments (seconds when cached),
# then runs the CLI in the gateway environment.
#   ./mo up            run the stack on the embedded default model
#   ./mo test [ARGS]   set up and run the test suite (what .ci/run does); tests/optimize
#                      runs in the optimize environment
#   ./mo check         ruff + mypy
#   ./mo setup         only set up
#   ./mo ANYTHING      model-optimizer ANYTHING
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
case " $* " in
  *" -h "*|*" --help "*) help=1 ;;  # the CLI's help needs only the gateway environment
  *) help=0 ;;
esac
if [ "$help" = 1 ]; then
  "$PYTHON" -m model_optimizer.envs ensure gateway
elif [ "${1:-}" = up ]; then
  # only what up serves with: llama.cpp on a CPU-only host, vLLM's environment on a GPU one
  # (up builds the other itself when the spec or --engine asks for it)
  "$PYTHON" -m model_optimizer.envs ensure --for-up
else
  "$PYTHON" -m model_optimizer.envs ensure
fi
GW="$("$PYTHON" -m model_optimizer.envs path gateway)"
case "${1:-}" in
  setup) exit 0 ;;
  test)
    # tests/optimize needs torch and llm-compressor: it runs in the optimize environment.
    shift
    OPT="$("$PYTHON" -m model_optimizer.envs path optimize)"
    case "${1:-}" in
      tests/optimize*) OMP_WAIT_POLICY=PASSIVE exec "$OPT/bin/python" -m pytest "$@" ;;
      -*|"")
        # Two phases, each timed (the ten slowest tests of each are listed too).
        # Both phases run even when the first fails; the exit code is the first failure's.
        t0=$(date +%s); rc=0; rc2=0
        "$GW/bin/python" -m pytest --ignore=tests/optimize --durations=10 "$@" || rc=$?
        echo "test: unit + integration (gateway env) took $(( $(date +%s) - t0 ))s"
        if [ -d tests/optimize ] && ls tests/optimize/test_*.py >/dev/null 2>&1; then
          t0=$(date +%s)
          OMP_WAIT_POLICY=PASSIVE "$OPT/bin/python" -m pytest tests/optimize --durations=5 "$@" \
            || rc2=$?
          echo "test: tests/optimize (optimize env) took $(( $(date +%s) - t0 ))s"
        fi
        exit $(( rc != 0 ? rc : rc2 )) ;;
      *) exec "$GW/bin/python" -m pytest "$@" ;;
    esac ;;
  check)
    "$GW/bin/ruff" check . && "$GW/bin/ruff" format --check . && exec "$GW/bin/mypy" ;;
  *) exec "$GW/bin/model-optimizer" "$@" ;;
esac
