"""``model-optimizer policy check FILE [--deploy SPEC]``: the gateway's validation, offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import MeasuredTier
from gateway.measured import MeasuredStack, measured_path, write_measured
from model_optimizer.cli import main

ROOT = Path(__file__).resolve().parents[3]
POLICY = ROOT / "policies" / "routing.yaml"
SPEC = ROOT / "policies" / "deploy" / "tiers.yaml"
TWO_TIERS_SPEC = """\
model_name: m
tiers:
  - {name: fp16, variant: fp16, port: 8101}
  - {name: int8, variant: int8, port: 8102}
"""
SHIPPED_SUMMARY = (
    "tiers fp16, int8, int4; routes tolerant -> derived (floor 0.6, latency) from int4, int8, "
    "fp16; code -> derived (floor 0.9, latency) from fp16, int8; math -> derived (floor 0.9, "
    "latency) from fp16, int8; long -> derived (floor 0.6, latency) from fp16, int8, int4"
)


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of its own: no test reads the measurements of a stack running here."""
    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_measurements() -> str:
    path = measured_path(8000)
    return (
        f"policy check: no measurements at {path} (written by up): routes not checked "
        "against them\n"
    )


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err.startswith("model-optimizer: error: ") and err.endswith("\n") and err.count("\n") == 1
    )
    return err.removeprefix("model-optimizer: error: ").rstrip("\n")


def test_the_shipped_policy_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(POLICY)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{POLICY}: ok ({SHIPPED_SUMMARY})\n"
    assert err == _no_measurements()


def test_the_shipped_policy_passes_against_the_shipped_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policy", "check", str(POLICY), "--deploy", str(SPEC)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{POLICY}: ok ({SHIPPED_SUMMARY}; all in {SPEC})\n"
    assert err == _no_measurements()


def test_a_bad_policy_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "routing.yaml"
    text = POLICY.read_text().replace("code: {tiers: [fp16, int8]", "code: {tiers: [fp16, int9]")
    path.write_text(text)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "int9" in text)
    message = _fails(["policy", "check", str(path)], capsys)
    assert message == (
        f"{path}:{line}: routes.code.tiers[1]: unknown tier int9 (tiers: fp16, int8, int4)"
    )


def test_invalid_yaml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("tiers: [fp16, int8\nroutes: {}\n")
    assert _fails(["policy", "check", str(path)], capsys).startswith(f"{path}:2: invalid YAML")


def test_a_missing_policy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.yaml"
    message = _fails(["policy", "check", str(path)], capsys)
    assert message == f"{path}: cannot read routing policy: No such file or directory"


def test_a_tier_missing_from_the_spec_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "tiers.yaml"
    spec.write_text(TWO_TIERS_SPEC)
    message = _fails(["policy", "check", str(POLICY), "--deploy", str(spec)], capsys)
    line = next(
        i for i, text in enumerate(POLICY.read_text().splitlines(), 1) if text.startswith("tiers:")
    )
    assert message == f"{POLICY}:{line}: tiers[2]: unknown tier int4 (the gateway has fp16, int8)"


def test_without_deploy_the_spec_is_not_consulted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(POLICY.read_text().replace("int4", "int2"))
    assert main(["policy", "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (tiers fp16, int8, int2;")


def test_a_bad_spec_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "tiers.yaml"
    spec.write_text(TWO_TIERS_SPEC.replace("port: 8102", "port: 8101"))
    message = _fails(["policy", "check", str(POLICY), "--deploy", str(spec)], capsys)
    assert message == f"{spec}:4: tiers[1].port: port 8101 is already used by tier fp16"


def test_policy_needs_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["policy"])
    assert info.value.code == 2
    assert "ACTION" in capsys.readouterr().err


def test_check_without_a_variant_or_serving_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check"]) == 2
    assert "check needs --variant DIR (or --serving)" in capsys.readouterr().err


def test_check_serving_with_a_reference_not_among_the_tiers_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--serving", "--tier-urls", "int8=http://127.0.0.1:9"]) == 2
    assert "reference tier fp16 is not among them" in capsys.readouterr().err


def _measure(path: Path, int4_tpot: float, int8_classes: list[str] | None = None) -> None:
    """What up would have written: fp16 and int8 as measured on an AVX-512 EPYC; int4 at
    ``int4_tpot`` s per token."""

    def tier(q: float, tpot: float) -> MeasuredTier:
        quality = {"chat": q, "code": q, "math": q}
        return MeasuredTier(quality=quality, ttft_s=0.05, tpot_s=tpot, throughput_tok_s=1 / tpot)

    stack = MeasuredStack(
        written_at="2026-12-03T10:00:00+00:00",
        gateway_port=18000,
        reference="fp16",
        tiers={
            "fp16": tier(1.0, 0.0187),
            "int8": tier(0.92, 0.0164),
            "int4": tier(0.65, int4_tpot),
        },
        classes={"int8": int8_classes} if int8_classes is not None else {},
        floors={"chat": 0.5, "code": 0.5, "math": 0.5},
    )
    write_measured(path, stack)


STATIC = (
    "tolerant: [int4, int8, fp16]",
    "code: [fp16, int8]",
    "math: [fp16, int8]",
    "long: {strategy: most_free_kv, tiers: [fp16, int8, int4]}",
)


def _static_policy(tmp_path: Path) -> Path:
    text = POLICY.read_text()
    for cls, route in zip(("tolerant", "code", "math", "long"), STATIC, strict=True):
        start = text.index(f"  {cls}: {{tiers:")
        text = text[:start] + f"  {route}" + text[text.index("\n", start) :]
    path = tmp_path / "routing.yaml"
    path.write_text(text)
    return path


def _line(path: Path, start: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith(start))


def test_a_static_chain_against_the_measurements_warns_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, measured = _static_policy(tmp_path), tmp_path / "m.json"
    _measure(measured, int4_tpot=0.0261, int8_classes=["tolerant", "math"])
    assert main(["policy", "check", str(policy), "--measured", str(measured)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"{policy}: ok (tiers fp16, int8, int4; routes tolerant -> int4, ")
    lines = err.splitlines()
    assert lines[0] == (
        f"policy check: against {measured} (up on port 18000 at 2026-12-03T10:00:00+00:00): "
        "3 warning(s)"
    )
    tolerant, code = _line(policy, "  tolerant:"), _line(policy, "  code:")
    long_line = _line(policy, "  long: {strategy")
    assert lines[1].startswith(f"{policy}:{tolerant}: routes.tolerant: warning: int4 (")
    assert "is served before int8 (" in lines[1]
    assert lines[2].startswith(f"{policy}:{code}: routes.code: warning: tier int8 (")
    assert lines[2].endswith("not admitted for code by the in-engine check (skipped)")
    assert lines[3].startswith(f"{policy}:{long_line}: routes.long: warning: tier int8 (")
    assert len(lines) == 4  # no derived route in this policy
    assert main(["policy", "check", str(policy), "--measured", str(measured), "--strict"]) == 1


def test_measurements_that_agree_with_the_chains_give_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, measured = _static_policy(tmp_path), tmp_path / "m.json"
    _measure(measured, int4_tpot=0.0120)  # int4 the fastest here, every tier admitted
    assert main(["policy", "check", str(policy), "--measured", str(measured), "--strict"]) == 0
    assert capsys.readouterr().err.endswith(": 0 warning(s)\n")


def test_by_default_the_file_up_wrote_for_port_8000_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The shipped policy derives every route: nothing to warn, and each derived chain is told
    as the gateway would serve it from these figures."""
    _measure(measured_path(8000), int4_tpot=0.0261)
    assert main(["policy", "check", str(POLICY), "--strict"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"policy check: against {measured_path(8000)} (up on port 18000")
    assert err[0].endswith(": 0 warning(s)")
    assert err[1].startswith(
        "policy check: derived here: tolerant -> int8, fp16 then overflow int4"
    )
    assert len(err) == 5


def test_a_bad_measurement_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "m.json"
    bad.write_text('{"tiers": {}}')
    message = _fails(["policy", "check", str(POLICY), "--measured", str(bad)], capsys)
    assert message.startswith(f"{bad}: not a measurement file written by up: ")
