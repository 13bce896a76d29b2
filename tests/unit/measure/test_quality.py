"""measure/quality.py: perplexity, agreement, GSM8K answers, spreads."""

from __future__ import annotations

import math

import pytest

from measure.quality import (
    agreement,
    exact_match,
    gsm8k_reference,
    last_number,
    perplexity,
    sequence_agreement,
    spread,
    strip_calculator,
)


def test_perplexity_is_token_weighted() -> None:
    # three tokens in all, mean log-probability -1: perplexity e
    assert perplexity([[-0.5, -1.5], [-1.0]]) == pytest.approx(math.e)
    assert perplexity([[0.0]]) == 1.0
    with pytest.raises(ValueError):
        perplexity([[], []])


def test_agreement_counts_positions_over_all_texts() -> None:
    assert agreement([[1, 2], [3]], [[1, 9], [3]]) == pytest.approx(2 / 3)
    assert agreement([[4, 5, 6]], [[4, 5, 6]]) == 1.0
    with pytest.raises(ValueError):
        agreement([[1]], [[1, 2]])
    with pytest.raises(ValueError):
        agreement([[1]], [])


def test_sequence_agreement_over_the_longer_answer() -> None:
    assert sequence_agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert sequence_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert sequence_agreement([9, 2, 3], [1, 2, 3]) == pytest.approx(2 / 3)
    assert sequence_agreement([], []) == 1.0
    assert sequence_agreement([], [1]) == 0.0


def test_gsm8k_numbers() -> None:
    solution = "He pays 3*<<3*2=6>>6 dollars.\nSo 1,200 in all.\n#### 1,200"
    assert gsm8k_reference(solution) == "1200"
    assert strip_calculator(solution).startswith("He pays 3*6 dollars.")
    assert last_number("so the answer is $18.00.") == "18"
    assert last_number("it is -3.5 degrees") == "-3.5"
    assert last_number("no digits") is None
    assert exact_match("First 5, then 7, so 12 apples", "12")
    assert not exact_match("12 apples, minus 2", "12")
    with pytest.raises(ValueError):
        gsm8k_reference("no final answer")


def test_spread_of_runs() -> None:
    s = spread([1.0, 2.0, 3.0])
    assert (s.mean, s.min, s.max, s.runs) == (2.0, 1.0, 3.0, (1.0, 2.0, 3.0))
    assert s.std == pytest.approx(math.sqrt(2 / 3))
    same = spread([0.5, 0.5])
    assert same.std == 0.0 and same.min == same.max == 0.5
    with pytest.raises(ValueError):
        spread([])
