"""Classification with the trained model: thresholds, conversations, lists, overrides, windows.

Most tests use a tiny hand-made weights file (the arithmetic is then known); a few check the
shipped policy and weights on the prompts the issue names.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from common.class_categories import CODE, LONG, MATH, TOLERANT
from gateway.policy.schema import PolicyError, load_policy, parse_policy
from gateway.request.classify.classes import CompiledClasses, classify_request
from gateway.request.tokens.prompt_text import request_parts

ROOT = Path(__file__).resolve().parents[5]
POLICY = ROOT / "policies" / "routing.yaml"
ROUTES = "tiers: [t]\nroutes: {tolerant: [t], code: [t], math: [t], long: [t]}\n"
WEIGHTS = {
    "format": "model-optimizer/prompt-model",
    "format_version": 1,
    "name": "tiny",
    "version": 1,
    "window": {"head_chars": 200, "tail_chars": 100},
    # python/function/dice push precise, poem/joke push tolerant; code vs math by python/dice.
    "precise": {
        "bias": -2.0,
        "weights": {"w:python": 6.0, "w:function": 4.0, "w:dice": 6.0, "w:poem": -6.0},
    },
    "code": {"bias": 0.0, "weights": {"w:python": 5.0, "w:function": 3.0, "w:dice": -6.0}},
}


def _rules(tmp_path: Path, classes: str = "", threshold: float = 0.5) -> CompiledClasses:
    (tmp_path / "tiny.json").write_text(json.dumps(WEIGHTS))
    text = (
        ROUTES
        + "classes:\n"
        + f"  model: {{weights: tiny.json, threshold: {threshold}}}\n"
        + "  long: {min_tokens: 1000}\n"
        + classes
    )
    policy = parse_policy(text, str(tmp_path / "p.yaml"))
    return CompiledClasses.build(policy.classes, tmp_path)


def _chat(*turns: str, system: str | None = None) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    for i, text in enumerate(turns):
        if i:
            messages.append({"role": "assistant", "content": "Sure, here it is."})
        messages.append({"role": "user", "content": text})
    return {"messages": messages}


def test_the_threshold_on_p_precise_decides(tmp_path: Path) -> None:
    body = _chat("tell me about python")  # 4 words + the stem pytho: -2 + 6/sqrt(5): p = 0.664
    below, above = _rules(tmp_path, threshold=0.66), _rules(tmp_path, threshold=0.67)
    found = classify_request(body, 10, below)
    assert found.cls == CODE and found.p_precise == pytest.approx(0.664, abs=1e-3)
    assert found.reason.startswith("code: p(precise) 0.664 >= 0.66 (tiny v1: +python)")
    assert "p(code)" in found.reason
    kept = classify_request(body, 10, above)
    assert kept.cls == TOLERANT and kept.reason.startswith("tolerant: p(precise) 0.664 < 0.67")


def test_code_or_math_comes_from_the_second_regression(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    assert classify_request(_chat("roll the dice"), 10, rules).cls == MATH
    assert classify_request(_chat("a python function"), 10, rules).cls == CODE
    tolerant = classify_request(_chat("a poem please"), 10, rules)
    assert tolerant.cls == TOLERANT and "-poem" in tolerant.reason


def test_long_is_decided_by_tokens_first(tmp_path: Path) -> None:
    found = classify_request(_chat("a python function"), 1000, _rules(tmp_path))
    assert found.cls == LONG and found.p_precise is None


def test_a_follow_up_keeps_the_class_the_conversation_earned(tmp_path: Path) -> None:
    rules = _rules(tmp_path, threshold=0.2)
    alone = classify_request(_chat("now make it faster"), 10, rules)
    assert alone.cls == TOLERANT
    follow = classify_request(_chat("write a python function", "now make it faster"), 10, rules)
    assert follow.cls == CODE
    assert "conversation (2 user turns): last turn" in follow.reason
    dice = classify_request(_chat("two dice: chance of a double?", "and if loaded?"), 10, rules)
    assert dice.cls == MATH


def _band_rules(tmp_path: Path, band: str | None) -> CompiledClasses:
    (tmp_path / "tiny.json").write_text(json.dumps(WEIGHTS))
    extra = f", followup_band: {band}" if band else ""
    text = ROUTES + f"classes:\n  model: {{weights: tiny.json, threshold: 0.1{extra}}}\n"
    return CompiledClasses.build(parse_policy(text, str(tmp_path / "p.yaml")).classes, tmp_path)


def test_an_unsure_follow_up_takes_the_class_of_the_conversation_before_it(
    tmp_path: Path,
) -> None:
    # "make it funnier" alone: p = sigmoid(-2) = 0.119, precise at threshold 0.1 (unsure).
    poem = _chat("a poem please", "make it funnier")
    assert classify_request(poem, 10, _band_rules(tmp_path, None)).cls in (CODE, MATH)
    found = classify_request(poem, 10, _band_rules(tmp_path, "[0.0, 0.5]"))
    assert found.cls == TOLERANT and "follow-up (last turn 0.119, unsure: [0, 0.5))" in found.reason
    code = _chat("a python function", "make it funnier")
    assert classify_request(code, 10, _band_rules(tmp_path, "[0.0, 0.5]")).cls == CODE
    # A follow-up sure of itself is judged as before: a poem, then code, is code.
    turned = _chat("a poem please", "write a python function")
    found = classify_request(turned, 10, _band_rules(tmp_path, "[0.0, 0.5]"))
    assert found.cls == CODE and "follow-up" not in found.reason
    # A first turn has no conversation before it.
    alone = classify_request(_chat("make it funnier"), 10, _band_rules(tmp_path, "[0.0, 0.5]"))
    assert alone.cls in (CODE, MATH) and "follow-up" not in alone.reason


def test_a_follow_up_band_must_be_an_interval_of_probabilities(tmp_path: Path) -> None:
    for band in ("[0.6, 0.2]", "[0.2, 1.5]"):
        with pytest.raises(PolicyError, match="followup_band"):
            _band_rules(tmp_path, band)


def test_older_turns_weigh_less(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    recent = classify_request(_chat("a", "python", "ok then"), 10, rules).p_precise
    old = classify_request(_chat("python", "a", "ok then"), 10, rules).p_precise
    assert recent is not None and old is not None and recent > old


def test_a_system_prompt_that_sets_up_coding_counts(tmp_path: Path) -> None:
    rules = _rules(tmp_path, threshold=0.2)
    body = _chat("how do I handle a missing file", system="You write python code.")
    found = classify_request(body, 10, rules)
    assert found.cls == CODE and ", system" in found.reason
    assert classify_request(_chat("how do I handle a missing file"), 10, rules).cls == TOLERANT


def test_context_never_lowers_the_last_turn(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    body = _chat("a poem", "write a python function", system="You love a poem.")
    found = classify_request(body, 10, rules)
    assert found.cls == CODE and "conversation" not in found.reason


def test_assistant_messages_are_not_read() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "U1"}]},
            {"role": "assistant", "content": "python python"},
            {"role": "user", "content": "U2"},
        ]
    }
    parts = request_parts(body)
    assert (parts.system, parts.turns, parts.chat) == (("S",), ("U1", "U2"), True)


def test_every_prompt_of_a_list_is_classified_and_the_most_precise_decides(
    tmp_path: Path,
) -> None:
    rules = _rules(tmp_path)
    found = classify_request({"prompt": ["a poem", "roll the dice", "a joke"]}, 10, rules)
    assert found.cls == MATH and "3 prompts, #2 decides" in found.reason
    only = classify_request({"prompt": ["a poem", "a joke"]}, 10, rules)
    assert only.cls == TOLERANT


def test_a_long_list_is_read_within_max_prompts(tmp_path: Path) -> None:
    rules = _rules(tmp_path, "  window: {max_prompts: 4}\n", threshold=0.2)
    prompts = [f"item {i}" for i in range(1000)] + ["a python function"]
    found = classify_request({"prompt": prompts}, 10, rules)
    # The first 3 one by one, the other 998 joined: the python prompt is in the joined tail.
    assert found.cls == CODE and "1001 prompts, #4 decides" in found.reason


def test_a_before_override_skips_the_model(tmp_path: Path) -> None:
    overrides = (
        "  overrides:\n"
        "    - {name: fenced, class: code, regex: '\\n[ \\t]{0,8}```'}\n"
        "    - {name: ours, class: math, stage: after, keywords: [abacus, slide rule]}\n"
    )
    rules = _rules(tmp_path, overrides)
    fenced = classify_request(_chat("a poem\n```\nroses\n```"), 10, rules)
    assert (fenced.cls, fenced.reason, fenced.p_precise) == (CODE, "code: override fenced", None)
    after = classify_request(_chat("a poem about a Slide  Rule"), 10, rules)
    assert after.cls == MATH and after.reason.startswith("math: override ours (after tolerant:")
    assert after.p_precise is not None and after.p_precise < 0.5


def test_the_window_bounds_the_work_on_any_input(tmp_path: Path) -> None:
    rules = CompiledClasses.build(load_policy(POLICY).classes, POLICY.parent)
    huge = "word " * 200_000  # 1 MB
    started = time.perf_counter()
    for _ in range(5):
        classify_request(_chat(huge), 10, rules)
    assert (time.perf_counter() - started) / 5 < 0.05  # ~1 ms here; generous for loaded CI


def test_a_missing_weights_file_refuses_the_policy(tmp_path: Path) -> None:
    text = ROUTES + "classes:\n  model: {weights: nowhere.json, threshold: 0.5}\n"
    policy = parse_policy(text, str(tmp_path / "p.yaml"))
    with pytest.raises(PolicyError) as info:
        CompiledClasses.build(policy.classes, tmp_path)
    assert "classes.model.weights" in str(info.value) and "nowhere.json" in str(info.value)


def test_model_and_keyword_rules_are_alternatives(tmp_path: Path) -> None:
    text = ROUTES + "classes:\n  model: {weights: w.json, threshold: 0.5}\n  code: {threshold: 2}\n"
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    assert "either model or the keyword rules (code)" in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Develop a Python program that reads all the text files under a directory "
            "and counts the words.",
            CODE,
        ),
        ("Write a simple website in HTML.", CODE),
        ("I roll two six-sided dice. What is the probability the sum is 7?", MATH),
        ("Write a short poem about autumn in Paris.", TOLERANT),
    ],
)
def test_the_shipped_policy_on_the_issues_prompts(text: str, expected: str) -> None:
    rules = CompiledClasses.build(load_policy(POLICY).classes, POLICY.parent)
    found = classify_request(_chat(text), 30, rules)
    assert found.cls == expected, found.reason
    assert found.reason.isascii() and "prompt-model v4" in found.reason


def test_the_shipped_policy_keeps_a_conversations_class() -> None:
    rules = CompiledClasses.build(load_policy(POLICY).classes, POLICY.parent)
    code = _chat("Write a Python function that reverses a linked list.", "now make it run in O(n)")
    assert classify_request(code, 40, rules).cls == CODE
    dice = _chat(
        "I roll two dice. What is the chance of a double six?", "what if the dice are loaded?"
    )
    assert classify_request(dice, 40, rules).cls == MATH
    poem = _chat("Write a short poem about the autumn rain.", "Make it funnier.")
    assert classify_request(poem, 40, rules).cls == TOLERANT
    trip = _chat("Plan a relaxed weekend in Lisbon for two.", "Shorter, please.")
    assert classify_request(trip, 40, rules).cls == TOLERANT
