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
"$PYTHON" -m model_optimizer.envs ensure
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
        "$GW/bin/python" -m pytest --ignore=tests/optimize "$@"
        if [ -d tests/optimize ] && ls tests/optimize/test_*.py >/dev/null 2>&1; then
          OMP_WAIT_POLICY=PASSIVE exec "$OPT/bin/python" -m pytest tests/optimize "$@"
        fi ;;
      *) exec "$GW/bin/python" -m pytest "$@" ;;
    esac ;;
  check)
    "$GW/bin/ruff" check . && "$GW/bin/ruff" format --check . && exec "$GW/bin/mypy" ;;
  *) exec "$GW/bin/model-optimizer" "$@" ;;
esac
