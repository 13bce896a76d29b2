"""measure/evaluate.py's pure parts: HumanEval's program passes with the canonical solution."""

from __future__ import annotations

from measure.eval_data import load_humaneval
from measure.evaluate import humaneval_program, math_prompt
from measure.sandbox import run_program


def test_canonical_solutions_pass_and_a_wrong_body_fails() -> None:
    for item in load_humaneval(3):
        assert run_program(humaneval_program(item, item.solution), timeout=20).passed
        wrong = humaneval_program(item, "    return None\n")
        assert not run_program(wrong, timeout=20).passed


def test_math_prompt() -> None:
    assert math_prompt("How many?") == "Question: How many?\nAnswer:\n"
