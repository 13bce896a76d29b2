"""``up``'s admission phase with plain values (model_optimizer/serving_check.py's ``admit``):
the in-engine check replaced by recorded verdicts, so the remedy's steps are checked without a
tier: a vLLM tier failing on its own kernels is re-served from its dequantized copy and checked
again; the copy is kept only when it helps; llama.cpp tiers are never re-served."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from backends.launch import TierLaunch
from backends.spec import AdmissionSpec
from measure.admission import CategoryVerdict, TierVerdict
from measure.admission_run import CheckResult
from model_optimizer import serving_check
from model_optimizer.models import ModelError

SPEC = AdmissionSpec()


def _verdict(tier: str, mode: str, chat: float) -> TierVerdict:
    categories = tuple(
        CategoryVerdict(
            c, passed=a >= 0.5, forced_agreement=a, free_agreement=a, floor=0.5, probes=4
        )
        for c, a in (("chat", chat), ("code", 0.9), ("math", 0.9))
    )
    return TierVerdict(tier, "fp16", categories, mode)


def _launch(name: str, engine: str = "vllm", folder: str = "v") -> TierLaunch:
    return TierLaunch(
        name=name, model_dir=Path(f"/{folder}/{name}"), served_model_name="m", port=1, engine=engine
    )


def _emulated(launch: TierLaunch) -> TierLaunch:
    return dataclasses.replace(launch, model_dir=Path("/v.emulated") / launch.name)


class Checks:
    """Answers each check with the next recorded verdicts; remembers what was checked."""

    def __init__(self, *answers: dict[str, TierVerdict]) -> None:
        self.answers = list(answers)
        self.checked: list[list[str]] = []

    def __call__(self, launches, spec, probes):  # type: ignore[no-untyped-def]
        self.checked.append([str(t.model_dir) for t in launches])
        return CheckResult("fp16", (), self.answers.pop(0))


def _admit(
    monkeypatch: pytest.MonkeyPatch, checks: Checks, launches: list[TierLaunch]
) -> tuple[list[TierLaunch], serving_check.Admission, list[str], list[str]]:
    monkeypatch.setattr(serving_check, "check", checks)
    restarted: list[str] = []
    said: list[str] = []
    out, admission = serving_check.admit(
        launches,
        SPEC,
        [],
        _emulated,
        lambda launch: restarted.append(str(launch.model_dir)),
        said.append,
    )
    return out, admission, restarted, said


def test_a_failing_vllm_tier_is_re_served_emulated_when_that_helps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = Checks(
        {"int8": _verdict("int8", "native", 0.2)}, {"int8": _verdict("int8", "emulated", 0.9)}
    )
    out, admission, restarted, said = _admit(
        monkeypatch, checks, [_launch("fp16"), _launch("int8")]
    )
    assert restarted == ["/v.emulated/int8"]
    assert checks.checked[1] == ["/v/fp16", "/v.emulated/int8"]  # checked again, in the engine
    assert out[1].model_dir == Path("/v.emulated/int8")
    assert admission.verdicts["int8"].mode == "emulated" and admission.verdicts["int8"].passed
    assert any("serving it emulated and checking again" in line for line in said)


def test_an_emulated_copy_that_does_not_help_goes_back_to_the_native_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = Checks(
        {"int8": _verdict("int8", "native", 0.2)}, {"int8": _verdict("int8", "emulated", 0.2)}
    )
    out, admission, restarted, said = _admit(
        monkeypatch, checks, [_launch("fp16"), _launch("int8")]
    )
    assert restarted == ["/v.emulated/int8", "/v/int8"]  # tried, then restarted as it was
    assert out[1].model_dir == Path("/v/int8")
    assert not admission.verdicts["int8"].passed and admission.verdicts["int8"].mode == "native"
    assert any("back to the native kernels" in line for line in said)


def test_a_failing_llama_cpp_tier_is_kept_out_not_re_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks = Checks({"int8": _verdict("int8", "native", 0.2)})
    launches = [_launch("fp16", "llama.cpp", "g"), _launch("int8", "llama.cpp", "g")]
    out, admission, restarted, _ = _admit(monkeypatch, checks, launches)
    assert restarted == [] and len(checks.checked) == 1
    assert out == launches
    assert "tolerant" not in admission.verdicts["int8"].admitted_classes()


def test_a_reference_that_answers_wrong_stops_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(launches, spec, probes):  # type: ignore[no-untyped-def]
        return CheckResult("fp16", ("'What is the capital of France?' -> 'Lyon'",), {})

    monkeypatch.setattr(serving_check, "check", wrong)
    with pytest.raises(ModelError, match="the reference tier fp16 answers wrong"):
        serving_check.admit([_launch("fp16"), _launch("int8")], SPEC, [], _emulated, print, print)
