"""gateway/request/stream/degeneration.py: loops and script mixes found, ordinary text left
alone."""

from __future__ import annotations

import time

import pytest

from gateway.request.stream.degeneration import LoopCheck, ScriptCheck, find_loop, find_script_mix

LOOP = LoopCheck(max_period=40, min_repeats=4, min_chars=40)
SCRIPTS = ScriptCheck(window_chars=32, max_scripts=2)

ORDINARY = [
    "The capital of France is Paris. It is known for the Eiffel Tower and the Louvre.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # 5\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n",
    "Let x = 3. Then 2x + 1 = 7, and x² = 9; the mean μ = 4.5 and σ ≈ 1.2.",
    "東京は日本の首都です。カタカナとひらがなと漢字を使います。",  # kanji, kana: one script group
    "Москва — столица России. Moscow is the capital of Russia.",  # two scripts
    "Ha ha ha! That was funny.",
    "このAPIはサーバーで動きます。",  # kana, kanji, Latin and the prolonged-sound mark
    "Let x ∈ ℝ, 𝑥 = 2 µm. Україна's ʼ apostrophe.",  # letter-like symbols: no script
    "Пусть α > 0 and the angle β = π/2.",  # lone Greek letters are symbols
    "-" * 60 + "\n" + "=" * 60 + "\n" + "." * 60,
    "0x" + "0" * 60,
    "[" + "0, " * 30 + "0]",
    "| --- " * 12 + "|\n" + "| 1 " * 20 + "|",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_neither_a_loop_nor_a_mix(text: str) -> None:
    for end in range(1, len(text) + 1):  # as it streams
        assert find_loop(text[:end], LOOP) is None, text[:end]
        assert find_script_mix(text[:end], SCRIPTS) is None, text[:end]


def test_a_loop_is_cut_after_its_first_occurrence() -> None:
    text = "De la biblié" + "KISS" + "ISS" * 20
    found = find_loop(text, LOOP)
    assert found is not None and found.kind == "loop"
    kept = text[: found.cut]
    assert kept.startswith("De la biblié") and len(kept) < len("De la biblié") + 8
    assert text[found.cut : -3] == text[found.cut + 3 :]  # all that is dropped is the loop


def test_a_loop_is_cut_after_its_first_whole_occurrence_whatever_the_phase() -> None:
    text = "Answer:" + " Paris" * 7  # the check's span starts mid-unit
    found = find_loop(text, LOOP)
    assert found is not None and text[: found.cut] == "Answer: Paris"


def test_a_repeated_sentence_is_a_loop() -> None:
    sentence = "I am a helpful assistant. "
    found = find_loop("Sure! " + sentence * 4, LOOP)
    assert found is not None
    # The repetition starts one character early (the space before the first "I"): the unit
    # kept is " I am a helpful assistant." in that phase.
    assert ("Sure! " + sentence * 4)[: found.cut] == "Sure! " + sentence.rstrip()


def test_a_loop_shorter_than_the_thresholds_is_not_one() -> None:
    assert find_loop("ab" * 19, LOOP) is None  # 38 characters < min_chars
    assert find_loop("x" * 39, LOOP) is None
    assert find_loop("x" * 40, LOOP) is not None


def test_many_scripts_in_the_window_are_a_mix_cut_at_the_third() -> None:
    text = "The answer is Promachevredjacouter ბა%(Β¥#ינגערא"
    found = find_script_mix(text, SCRIPTS)
    assert found is not None and found.kind == "scripts"
    assert text[: found.cut] == "The answer is Promachevredjacouter ბა%(Β¥#"  # Hebrew: third
    assert "LATIN, GEORGIAN, HEBREW" in found.detail  # a lone Greek letter is no script


def test_the_checks_read_a_bounded_tail_whatever_the_length() -> None:
    long = "word " * 200_000  # a million characters, a loop of "word "
    started = time.perf_counter()
    for _ in range(100):
        find_loop(long, LOOP)
        find_script_mix(long, SCRIPTS)
    assert time.perf_counter() - started < 1.0  # ~10 ms a call would be linear in the length


def test_low_confidence_needs_a_full_window_under_the_mean() -> None:
    from gateway.request.stream.degeneration import ConfidenceCheck, LowConfidence

    watch = LowConfidence(ConfidenceCheck(window_tokens=4, min_mean=-3.0))
    assert watch.add([-0.1, -0.2], start=0) is None
    assert watch.add([-8.0], start=5) is None  # three tokens: no window yet
    assert watch.add([-0.3], start=9) is None  # mean -2.15: confident enough
    found = watch.add([-6.0, -7.0], start=12)  # the window: -8, -0.3, -6, -7
    assert found is not None and found.kind == "logprob"
    assert found.cut == 5  # where the window's first token under the mean starts
    assert "-5.33" in found.detail
    watch.clear()
    assert watch.add([-9.0] * 3, start=20) is None  # a new window after clear


def test_a_minus_infinity_logprob_counts_as_the_floor() -> None:
    from gateway.request.stream.degeneration import LOGPROB_FLOOR, ConfidenceCheck, LowConfidence

    watch = LowConfidence(ConfidenceCheck(window_tokens=2, min_mean=-30.0))
    assert watch.add([-9999.0, -0.1], start=0) is None  # (-50 - 0.1) / 2 > -30
    assert LOGPROB_FLOOR == -50.0
