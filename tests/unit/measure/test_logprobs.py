"""measure/logprobs.py: vLLM's prompt_logprobs shape → Scored."""

from __future__ import annotations

import pytest

from measure.logprobs import LogprobsError, parse_continuation, parse_position


def rec(logprob: float, rank: int) -> dict[str, object]:
    return {"logprob": logprob, "rank": rank, "decoded_token": "x"}


def test_the_actual_token_is_the_top1() -> None:
    pos = parse_position(7, {"7": rec(-0.1, 1)})
    assert (pos.token_id, pos.logprob, pos.top1_id) == (7, -0.1, 7)


def test_the_actual_token_differs_from_the_top1() -> None:
    pos = parse_position(7, {"7": rec(-3.5, 12), "9": rec(-0.2, 1)})
    assert (pos.token_id, pos.logprob, pos.top1_id) == (7, -3.5, 9)


def test_a_continuation_keeps_only_positions_after_the_prompt() -> None:
    ids = [1, 2, 3, 4]
    choice = {
        "prompt_logprobs": [
            None,
            {"2": rec(-1.0, 1)},
            {"3": rec(-2.0, 4), "5": rec(-0.5, 1)},
            {"4": rec(-0.25, 1)},
        ]
    }
    scored = parse_continuation(choice, ids, start=2)
    assert scored.logprobs == (-2.0, -0.25)
    assert scored.top1 == (5, 4)


@pytest.mark.parametrize(
    ("choice", "start", "message"),
    [
        ({}, 1, "no prompt_logprobs"),
        ({"prompt_logprobs": [None]}, 1, "1 entries for a 2-token prompt"),
        ({"prompt_logprobs": [None, {"2": rec(-1.0, 1)}]}, 0, "outside 1..2"),
        ({"prompt_logprobs": [None, {"9": rec(-1.0, 1)}]}, 1, "lacks the prompt's token 2"),
        ({"prompt_logprobs": [None, {"2": rec(-1.0, 3)}]}, 1, "0 rank-1 tokens"),
        ({"prompt_logprobs": [None, {"2": {"logprob": "x", "rank": 1}}]}, 1, "not a number"),
        ({"prompt_logprobs": [None, None]}, 1, "not a non-empty object"),
    ],
)
def test_bad_shapes_are_refused(choice: dict[str, object], start: int, message: str) -> None:
    with pytest.raises(LogprobsError, match=message):
        parse_continuation(choice, [1, 2], start)
