"""``model-optimizer eval`` arguments: bad input is one line and exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from measure import eval_cli, sandbox
from measure.eval_cli import UsageError, parse_tiers
from model_optimizer.cli import main


def test_tiers_by_name_or_consecutive_ports() -> None:
    assert parse_tiers("fp16=http://h:1/,x=http://h:9", "", "") == {
        "fp16": "http://h:1",
        "x": "http://h:9",
    }
    assert parse_tiers("", "http://127.0.0.1:18100", "fp16,int8,int4") == {
        "fp16": "http://127.0.0.1:18100",
        "int8": "http://127.0.0.1:18101",
        "int4": "http://127.0.0.1:18102",
    }
    for bad in ("fp16", "fp16=ftp://x", "a=http://h:1,a=http://h:2", "=http://h:1"):
        with pytest.raises(UsageError):
            parse_tiers(bad, "", "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "--tiers", "int8=http://127.0.0.1:1"], "--reference fp16 is not among"),
        (["eval", "--tiers", "fp16"], "is not name=URL"),
        (["eval", "--limit", "0"], "--limit must be positive"),
        (["eval", "--runs", "-1"], "--runs must be positive"),
        (["eval", "--tier-base", "http://127.0.0.1"], "has no port"),
        (
            ["eval", "routing", "{data}/absent.jsonl", "--tier-base", "http://127.0.0.1:1"],
            "cannot read",
        ),
        (["eval", "routing", "{data}/bad.jsonl", "--max-tokens", "0"], "--max-tokens must be"),
        (["eval", "routing", "{data}/bad.jsonl"], "bad.jsonl:1: 'label' must be one of"),
        (["eval", "routing", "{data}/bad.jsonl", "--gateway", "x"], "is not an http(s) URL"),
        (["eval", "--output", "{data}/bad.jsonl"], "exists and is not an empty folder"),
    ],
)
def test_bad_input(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "label": "nope"}\n')
    argv = [a.replace("{data}", str(tmp_path)) for a in argv]
    if "--output" not in argv:
        argv += ["--output", str(tmp_path / "out")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("model-optimizer: error: ") and message in err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_tier_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from backends.process import free_port

    base = f"http://127.0.0.1:{free_port()}"
    assert main(["eval", "--tiers", f"fp16={base}", "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and base in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "tiers",
    [
        "fp16=http://10.1.2.3:8000",
        "fp16=http://127.0.0.1:1,int4=https://models.example.com",
        "fp16=http://0.0.0.0:8000",
    ],
)
def test_eval_runs_no_code_from_another_machine_unless_told(
    tiers: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HumanEval executes what the tiers answer: a tier off this machine is refused (exit 2,
    nothing contacted) unless --allow-remote-code says the operator trusts it."""
    assert main(["eval", "--tiers", tiers, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-remote-code" in err
    assert not (tmp_path / "o").exists()


def test_allow_remote_code_lets_a_remote_tier_through(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []
    monkeypatch.setattr(eval_cli, "_quality", lambda args, tiers, output: seen.append(tiers) or 0)
    argv = ["eval", "--tiers", "fp16=http://10.1.2.3:8000", "--allow-remote-code"]
    assert main(argv) == 0
    assert seen == [{"fp16": "http://10.1.2.3:8000"}]
    # eval routing runs no generated code: remote tiers need no flag there.
    assert eval_cli.remote_tiers({"a": "http://[::1]:1", "b": "http://localhost:2"}) == []


def test_no_sandbox_means_no_eval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the code sandbox cannot run, eval stops before asking any tier (exit 1)."""

    def unavailable() -> str:
        raise sandbox.SandboxUnavailable("code sandbox unavailable: unshare not found")

    monkeypatch.setattr(eval_cli, "check_sandbox", unavailable)
    argv = ["eval", "--tiers", "fp16=http://127.0.0.1:1", "--output", str(tmp_path / "o")]
    assert main(argv) == 1
    assert (
        capsys.readouterr().err
        == "model-optimizer: error: code sandbox unavailable: unshare not found\n"
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no measured tier speeds at {cache}/measured/gateway-1.json"),
        (["--gateway", "http://10.1.2.3:8000"], "is not on this machine: pass --measured FILE"),
        (["--measured", "{data}/bad.json"], "bad.json: not a measurement file written by up"),
        (["--measured", "{data}/fp16only.json"], "no measured speed for tier(s) int8, int4"),
    ],
)
def test_eval_routing_needs_measured_speeds(
    extra: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No cost axis is made up: without up's figures for every tier, exit 2, nothing asked."""
    from gateway.config import MeasuredTier
    from gateway.measured import MeasuredStack, write_measured

    monkeypatch.setenv("MODEL_OPTIMIZER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "set.jsonl").write_text('{"prompt": "p", "label": "code"}\n')
    (tmp_path / "bad.json").write_text('{"tiers": 3}')
    fp16 = MeasuredTier(quality={"chat": 1.0}, ttft_s=0.1, tpot_s=0.02, throughput_tok_s=50)
    stack = MeasuredStack(written_at="t", gateway_port=1, reference="fp16", tiers={"fp16": fp16})
    write_measured(tmp_path / "fp16only.json", stack)
    argv = ["eval", "routing", str(tmp_path / "set.jsonl"), "--gateway", "http://127.0.0.1:1"]
    argv += [a.replace("{data}", str(tmp_path)) for a in extra]
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message.replace("{cache}", str(tmp_path / "cache")) in err
    assert not (tmp_path / "out").exists()
