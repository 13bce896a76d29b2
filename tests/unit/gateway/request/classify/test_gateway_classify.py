from pathlib import Path
from typing import Any

import pytest

from common.class_categories import CODE, LONG, MATH, TOLERANT
from gateway.policy.classes import ClassesPolicy
from gateway.policy.schema import parse_policy
from gateway.request.classify.classes import CompiledClasses, classify_request
from gateway.request.classify.classification import Classification
from gateway.request.classify.keyword_rules import count_numbers
from gateway.request.tokens.prompt_text import read_texts, request_parts

ROOT = Path(__file__).resolve().parents[5]
ROUTES = """\
tiers: [fp16]
routes: {tolerant: [fp16], code: [fp16], math: [fp16], long: [fp16]}
"""
KEYWORD_RULES = ROOT / "policies" / "classes-keyword-rules.yaml"


def classify(
    text: str, token_count: int, policy: ClassesPolicy | CompiledClasses
) -> Classification:
    """The class the gateway gives a completions request of ``text`` (one prompt)."""
    rules = policy if isinstance(policy, CompiledClasses) else CompiledClasses.build(policy)
    return classify_request({"prompt": text}, token_count, rules)


def _classes(yaml_classes: str) -> ClassesPolicy:
    return parse_policy(ROUTES + "classes:\n" + yaml_classes, "t.yaml").classes


# The keyword rules (the classifier without a model), as the repository ships them.
SHIPPED = parse_policy(
    ROUTES + KEYWORD_RULES.read_text(encoding="utf-8"), str(KEYWORD_RULES)
).classes


SMALL = _classes(
    """\
  long: {min_tokens: 100}
  code:
    threshold: 2
    fence_weight: 3
    keywords: [python, unit test]
    task: {verbs: [write], objects: [function], window: 3, weight: 2}
    patterns:
      - {name: semicolon_line, weight: 1, regex: ';\\n'}
      - {name: def_line, weight: 2, regex: 'def \\w{1,64}\\('}
  math:
    threshold: 2
    keywords: [solve, how many]
    patterns:
      - {name: equals_digit, weight: 2, regex: '= ?\\d'}
    number_density: 0.2
    min_numbers: 2
    number_weight: 1
"""
)


# --------------------------------------------------------------------------- shipped rules


@pytest.mark.parametrize(
    "text",
    [
        "```python\nprint('hello')\n```\nWhy does this print nothing?",
        "~~~\nls -la | grep foo\n~~~",
        "Fix this please:\n```\nfor i in range(10) print(i)\n```",
    ],
)
def test_fenced_code_is_code(text: str) -> None:
    result = classify(text, 40, SHIPPED)
    assert result.cls == CODE
    assert "fenced block" in result.reason


@pytest.mark.parametrize(
    ("text", "signal"),
    [
        ("def area(r):\n    return 3.14 * r * r\n\nWhat is wrong here?", "python_def"),
        ("import numpy as np\nx = np.zeros(3)\nprint(x)", "python_import"),
        ("const total = items.reduce((a, b) => a + b, 0);\nconsole.log(total);", "js_declaration"),
        ("function add(a, b) {\n  return a + b;\n}", "js_function"),
        ('#include <stdio.h>\nint main() {\n  printf("hi");\n}', "c_include"),
        ("SELECT name, age FROM users WHERE age > 30;", "sql_query"),
    ],
)
def test_code_syntax_without_fences_is_code(text: str, signal: str) -> None:
    result = classify(text, 40, SHIPPED)
    assert result.cls == CODE, result.reason
    assert signal in result.reason


def test_a_request_to_write_code_is_code() -> None:
    result = classify("Write a Python function that reverses a linked list.", 20, SHIPPED)
    assert result.cls == CODE
    assert "task (write ... function)" in result.reason
    assert "linked list" in result.reason


@pytest.mark.parametrize(
    "text",
    [
        "Solve for x: 3x + 5 = 20",
        "If f(x) = x^2 + 2x, what is f(3)?",
        "Compute \\frac{1}{2} + \\sqrt{16}.",
        "Show that ∑ 1/n² converges.",
        "Prove that the square root of 2 is irrational.",
    ],
)
def test_equations_and_math_notation_are_math(text: str) -> None:
    result = classify(text, 20, SHIPPED)
    assert result.cls == MATH, result.reason


def test_a_word_problem_with_numbers_is_math() -> None:
    text = "Tom has 12 apples. He gives 5 to Ann and buys 7 more. How many apples does he have now?"
    result = classify(text, 30, SHIPPED)
    assert result.cls == MATH
    assert "how many" in result.reason and "3 numbers" in result.reason


@pytest.mark.parametrize(
    "text",
    [
        "Hi! How are you today?",
        "What's a good name for a golden retriever puppy?",
        "Tell me about the history of Rome in 3 paragraphs.",
        "Can you suggest a weekend trip from Paris?",
        "How many times does the average human blink in a lifetime?",
    ],
)
def test_chit_chat_is_tolerant(text: str) -> None:
    result = classify(text, 20, SHIPPED)
    assert result.cls == TOLERANT, result.reason
    assert result.reason.startswith("tolerant: code ")


def test_a_long_prompt_is_long_whatever_it_says() -> None:
    text = "```python\nprint(1)\n```"
    assert classify(text, 1023, SHIPPED).cls == CODE
    result = classify(text, 1024, SHIPPED)
    assert result == classify(text, 1024, SHIPPED)
    assert result.cls == LONG
    assert result.reason == "long: 1024 prompt tokens >= 1024"


# --------------------------------------------------------------------------- the mechanics


def test_scores_add_weights_against_the_threshold() -> None:
    one = classify("It's python, nothing else.", 5, SMALL)
    assert (one.cls, one.code_score) == (TOLERANT, 1.0)
    two = classify("python and a unit test", 5, SMALL)
    assert two.cls == CODE
    assert two.reason == "code 2 >= 2: 2 keywords (python, unit test)"


def test_keywords_are_whole_words_case_insensitive_and_count_once() -> None:
    assert classify("Pythonic pythons", 5, SMALL).code_score == 0
    assert classify("PYTHON, python; Python!", 5, SMALL).code_score == 1
    assert classify("a unit-test", 5, SMALL).code_score == 1  # a phrase: one space or mark apart
    assert classify("a unit\ntest", 5, SMALL).code_score == 1
    assert classify("a unit, test", 5, SMALL).code_score == 0
    assert classify("a unit of test", 5, SMALL).code_score == 0


def test_the_task_needs_its_object_within_the_window() -> None:
    near = classify("Please write a small function for me", 5, SMALL)
    assert near.cls == CODE
    assert near.reason == "code 2 >= 2: task (write ... function)"
    far = classify("Please write me a very small function", 5, SMALL)
    assert far.cls == TOLERANT


def test_a_pattern_counts_once_however_often_it_matches() -> None:
    result = classify("a;\nb;\nc;\n", 5, SMALL)
    assert (result.cls, result.code_score) == (TOLERANT, 1.0)
    assert "semicolon_line" in result.reason


def test_patterns_see_the_first_and_last_line_anchored_by_newlines() -> None:
    assert classify("a;", 5, SMALL).code_score == 1  # the text gets a newline at its end


def test_number_density() -> None:
    dense = classify("3 apples and 4 pears", 5, SMALL)
    assert dense.math_score == 1 and "2 numbers in 5 words" in dense.reason
    sparse = classify("In 1969 people walked on the moon, and in 1972 they stopped.", 5, SMALL)
    assert sparse.math_score == 0
    assert classify("Only 7 here", 5, SMALL).math_score == 0  # fewer than min_numbers


def test_count_numbers() -> None:
    assert count_numbers(b"") == 0
    assert count_numbers(b"4.5 and 1,000 and 7") == 3
    assert count_numbers(b"the end 5.") == 1


def test_when_both_classes_win_the_higher_score_wins() -> None:
    result = classify("solve x = 3, how many", 5, SMALL)
    assert result.cls == MATH
    tied = classify("python unit test: solve how many", 5, SMALL)
    assert (tied.code_score, tied.math_score) == (2, 2)
    assert tied.cls == CODE
    assert tied.reason == "code 2 >= 2: 2 keywords (python, unit test) (math 2)"


def test_evaluation_stops_once_the_class_is_decided() -> None:
    # The fence (3) + python (1) beat anything math's one pattern (2) could add.
    result = classify("```\npython\nx = 1\n```", 5, SMALL)
    assert result.cls == CODE
    assert result.math_score == 0  # equals_digit was never run
    # Undecided, math's pattern does run.
    assert classify("python\nx = 1", 5, SMALL).math_score == 2


def test_reasons_are_ascii() -> None:
    classes = _classes("  math:\n    keywords: [π, ∞]\n")
    result = classify("π and ∞", 5, classes)
    assert result.cls == MATH
    assert result.reason.isascii()
    assert "\\u03c0" in result.reason


def test_compiled_rules_classify_as_the_policy_does() -> None:
    policy = _classes("  code:\n    keywords: [go]\n")
    compiled = CompiledClasses.build(policy)
    text = "go go python 1 2 3 = 4"
    assert classify(text, 9, policy) == classify(text, 9, compiled)
    changed = policy.model_copy(update={"long": policy.long.model_copy(update={"min_tokens": 5})})
    assert CompiledClasses.build(changed).long_min_tokens == 5
    assert classify("hello there", 6, changed).cls == LONG
    assert classify("hello there", 6, compiled).cls == TOLERANT


def test_an_empty_text_is_tolerant() -> None:
    assert classify("", 0, SHIPPED).cls == TOLERANT


# --------------------------------------------------------------------------- request text


def _texts_read(body: dict[str, Any]) -> list[str]:
    """The texts the classifier reads of ``body``, within bounds no test body reaches."""
    return read_texts(request_parts(body), 8, 8, 10**6, 10**6)


def test_the_texts_read_of_chat_messages() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                    {"type": "text", "text": "what is it?"},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": []},
            "not a message",
        ]
    }
    assert _texts_read(body) == ["Be brief.", "Look:\n\nwhat is it?"]


def test_the_texts_read_of_completions() -> None:
    assert _texts_read({"prompt": "Once upon a time"}) == ["Once upon a time"]
    assert _texts_read({"prompt": ["a", "b"]}) == ["a", "b"]
    assert _texts_read({"prompt": [1, 2, 3]}) == []
    assert _texts_read({"prompt": [[1, 2]]}) == []
    assert _texts_read({}) == []
