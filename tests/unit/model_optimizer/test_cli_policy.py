"""``model-optimizer policy check FILE [--deploy SPEC]``: the gateway's validation, offline."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert err == ""


def test_the_shipped_policy_passes_against_the_shipped_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["policy", "check", str(POLICY), "--deploy", str(SPEC)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{POLICY}: ok ({SHIPPED_SUMMARY}; all in {SPEC})\n"
    assert err == ""


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
