"""The ``resets`` section of the routing policy: defaults, the shipped file and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy.schema import PolicyError, ResetsPolicy, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = ROOT / "policies" / "routing.yaml"
MINIMAL = """\
tiers: [fp16, int8, int4]
routes:
  tolerant: [int4, int8, fp16]
  code: [fp16, int8]
  math: [fp16, int8]
  long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}
"""
# line 7 is `resets:`, line 8 `  enabled: true`, line 9 `  windows:`, line 10 the first window
RESETS = """\
resets:
  enabled: true
  windows:
    - {start: "02:00", end: "05:00", timezone: UTC}
  quiet: {max_rps: 0.5, for_seconds: 120}
"""


def _error(text: str) -> str:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "t.yaml")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_the_shipped_policy_turns_resets_on() -> None:
    resets = load_policy(SHIPPED).resets
    assert resets.enabled is True
    assert [(w.start, w.end, w.timezone) for w in resets.windows] == [("02:00", "05:00", "UTC")]
    assert resets.quiet is not None
    assert (resets.quiet.max_rps, resets.quiet.for_seconds) == (0.5, 120)
    assert resets.when == "window_and_quiet"
    assert resets.min_interval_seconds == 21600
    assert resets.drain_timeout_seconds == 60
    assert resets.lock_ttl_seconds == 30
    assert resets.triggers.preemptions_growth is None
    assert resets.triggers.ttft_p90_factor is None


def test_resets_are_off_by_default() -> None:
    resets = parse_policy(MINIMAL, "t.yaml").resets
    assert resets == ResetsPolicy()
    assert resets.enabled is False
    assert resets.windows == [] and resets.quiet is None
    assert resets.when == "window_and_quiet"
    assert (resets.min_interval_seconds, resets.drain_timeout_seconds) == (21600, 60)
    assert resets.lock_ttl_seconds == 30


def test_a_full_section_parses() -> None:
    text = MINIMAL + (
        "resets:\n"
        "  enabled: true\n"
        "  windows:\n"
        "    - {start: '23:00', end: '02:00', timezone: America/New_York}\n"
        "    - {start: '12:00', end: '13:30'}\n"
        "  quiet: {max_rps: 2, for_seconds: 30.5}\n"
        "  when: window_or_quiet\n"
        "  min_interval_seconds: 3600\n"
        "  drain_timeout_seconds: 15\n"
        "  triggers: {preemptions_growth: 10, ttft_p90_factor: 2.0}\n"
        "  lock_ttl_seconds: 5\n"
    )
    resets = parse_policy(text, "t.yaml").resets
    first, second = resets.windows
    assert (first.start_minute, first.end_minute, first.zone.key) == (1380, 120, "America/New_York")
    assert (second.timezone, second.describe()) == ("UTC", "12:00-13:30 UTC")
    assert resets.quiet is not None and resets.quiet.for_seconds == 30.5
    assert resets.triggers.preemptions_growth == 10
    assert resets.triggers.ttft_p90_factor == 2.0
    assert resets.model_dump(mode="json")["windows"][0]["timezone"] == "America/New_York"


def test_a_window_only_policy_needs_no_quiet_and_a_quiet_only_one_no_window() -> None:
    window_only = RESETS.replace("  quiet: {max_rps: 0.5, for_seconds: 120}\n", "  when: window\n")
    assert parse_policy(MINIMAL + window_only, "t.yaml").resets.quiet is None
    quiet_only = "resets: {enabled: true, when: quiet, quiet: {max_rps: 1, for_seconds: 60}}\n"
    assert parse_policy(MINIMAL + quiet_only, "t.yaml").resets.windows == []


def test_a_disabled_section_is_not_held_to_its_when() -> None:
    policy = parse_policy(MINIMAL + "resets: {enabled: false, when: window}\n", "t.yaml")
    assert policy.resets.windows == []


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "timezone: UTC",
            "timezone: Mars/Olympus",
            "t.yaml:10: resets.windows[0].timezone: unknown time zone 'Mars/Olympus' "
            "(an IANA name such as UTC or Europe/Paris)",
        ),
        (
            "timezone: UTC",
            "timezone: ../etc/passwd",
            "t.yaml:10: resets.windows[0].timezone: unknown time zone '../etc/passwd' "
            "(an IANA name such as UTC or Europe/Paris)",
        ),
        (
            'start: "02:00"',
            'start: "25:00"',
            "t.yaml:10: resets.windows[0].start: '25:00' is not a time of day \"HH:MM\" "
            "(00:00 to 23:59)",
        ),
        (
            'end: "05:00"',
            'end: "5am"',
            "t.yaml:10: resets.windows[0].end: '5am' is not a time of day \"HH:MM\" "
            "(00:00 to 23:59)",
        ),
        (
            'start: "02:00"',
            "start: 23:00",
            't.yaml:10: resets.windows[0].start: write "23:00" in quotes '
            "(unquoted, YAML reads it as 1380)",
        ),
        (
            'end: "05:00"',
            'end: "02:00"',
            "t.yaml:10: resets.windows[0]: start and end are both 02:00: the window is empty",
        ),
        (
            "timezone: UTC}",
            "timezone: UTC, days: [mon]}",
            "t.yaml:10: resets.windows[0].days: unknown field (allowed: start, end, timezone)",
        ),
        (
            'end: "05:00", ',
            "",
            "t.yaml:10: resets.windows[0].end: required field is missing",
        ),
        (
            "max_rps: 0.5",
            "max_rps: 0",
            "t.yaml:11: resets.quiet.max_rps: Input should be greater than 0",
        ),
        (
            "for_seconds: 120",
            "for_seconds: -5",
            "t.yaml:11: resets.quiet.for_seconds: Input should be greater than 0",
        ),
        (
            "for_seconds: 120}",
            "for_seconds: 120, rps: 1}",
            "t.yaml:11: resets.quiet.rps: unknown field (allowed: max_rps, for_seconds)",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  when: sometimes\n",
            "t.yaml:9: resets.when: Input should be 'window_and_quiet', 'window_or_quiet', "
            "'window' or 'quiet'",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  min_interval_seconds: 0\n",
            "t.yaml:9: resets.min_interval_seconds: Input should be greater than 0",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  drain_timeout_seconds: -1\n",
            "t.yaml:9: resets.drain_timeout_seconds: Input should be greater than 0",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  lock_ttl_seconds: 0\n",
            "t.yaml:9: resets.lock_ttl_seconds: Input should be greater than 0",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  triggers:\n    preemptions_growth: 0\n",
            "t.yaml:10: resets.triggers.preemptions_growth: Input should be greater than 0",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  triggers: {ttft_p90_factor: 1}\n",
            "t.yaml:9: resets.triggers.ttft_p90_factor: Input should be greater than 1",
        ),
        (
            "  enabled: true\n",
            "  enabled: perhaps\n",
            "t.yaml:8: resets.enabled: Input should be a valid boolean, unable to interpret input",
        ),
        (
            "  enabled: true\n",
            "  enabled: true\n  window: []\n",
            "t.yaml:9: resets.window: unknown field (allowed: enabled, windows, quiet, when, "
            "min_interval_seconds, drain_timeout_seconds, triggers, lock_ttl_seconds)",
        ),
    ],
)
def test_errors_name_file_line_and_field(old: str, new: str, expected: str) -> None:
    assert old in RESETS
    assert _error(MINIMAL + RESETS.replace(old, new, 1)) == expected


def test_windows_are_required_when_when_needs_them() -> None:
    text = MINIMAL + "resets:\n  enabled: true\n  quiet: {max_rps: 1, for_seconds: 60}\n"
    assert _error(text) == (
        "t.yaml:7: resets.windows: give at least one window (when: window_and_quiet)"
    )
    empty = MINIMAL + RESETS.replace('    - {start: "02:00", end: "05:00", timezone: UTC}\n', "")
    assert _error(empty.replace("  windows:\n", "  windows: []\n")) == (
        "t.yaml:9: resets.windows: give at least one window (when: window_and_quiet)"
    )
    either = MINIMAL + "resets: {enabled: true, when: window_or_quiet, quiet: {}}\n"
    assert _error(either) == (
        "t.yaml:7: resets.windows: give at least one window (when: window_or_quiet)"
    )


@pytest.mark.parametrize("when", ["window_and_quiet", "window_or_quiet", "quiet"])
def test_quiet_is_required_when_when_needs_it(when: str) -> None:
    text = RESETS.replace("  quiet: {max_rps: 0.5, for_seconds: 120}\n", f"  when: {when}\n")
    assert _error(MINIMAL + text) == f"t.yaml:7: resets.quiet: required by when: {when}"
    explicit_null = text + "  quiet: null\n"
    assert _error(MINIMAL + explicit_null) == f"t.yaml:12: resets.quiet: required by when: {when}"


def test_an_unquoted_early_time_is_a_string_already() -> None:
    # YAML 1.1 reads 02:00 (leading zero) as a string but 23:00 as the number 1380
    text = MINIMAL + RESETS.replace('start: "02:00", end: "05:00"', "start: 02:00, end: 05:00")
    window = parse_policy(text, "t.yaml").resets.windows[0]
    assert (window.start, window.end) == ("02:00", "05:00")


def test_the_shipped_file_with_a_bad_zone_names_its_line(tmp_path: Path) -> None:
    text = SHIPPED.read_text()
    assert "timezone: UTC}" in text
    path = tmp_path / "routing.yaml"
    path.write_text(text.replace("timezone: UTC}", "timezone: Europe/Atlantis}"))
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "timezone: UTC}" in row)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == (
        f"{path}:{line}: resets.windows[0].timezone: unknown time zone 'Europe/Atlantis' "
        "(an IANA name such as UTC or Europe/Paris)"
    )
