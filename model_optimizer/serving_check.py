"""``up``'s admission phase: serve only what was measured to work in the engine, here.

After the tiers start, every tier is compared with the reference tier through vLLM itself
(measure/admission_run.py). A quantized tier that fails while running its own kernels is
restarted from its emulated copy (the same weights dequantized: the engine's float path) and
measured again; a tier that still fails a category is not routed the classes that need it.
The reference failing its factual probes stops ``up``: nothing can be judged against it. The
figures (agreement, speed, admitted classes) also go to a file for the offline tools
(``record_measurements``, gateway/measured.py).

Verdicts are cached under ``<cache>/admission/<key>.json``, the key hashing what decides them
(each variant's digest, the engine version, the CPU model and flags or the GPU, the serving
dtype, the probes, the floors): a second ``up`` on the same machine starts each tier the way
that passed and measures nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.launch import TierLaunch
from backends.spec import AdmissionSpec
from common.cpu import CPUINFO
from gateway.config import GatewayConfig
from gateway.measured import MeasuredStack, measured_path, write_measured
from measure.admission import (
    AdmissionError,
    AdmissionProbe,
    TierVerdict,
    emulation_helps,
    load_facts,
    verdict_from_json,
    verdict_to_json,
)
from measure.admission_run import CheckOptions, CheckResult, run_check
from measure.speed import SpeedOptions, TierSpeed, calibrate
from model_optimizer.envs import cache_root
from model_optimizer.models import ModelError
from optimizer.probes import load_probes

VERSION = "7"  # bump when the check's procedure changes (2: speeds; 3: interleaved; 4: 8 alone;
# 5: a tie between native and emulated goes back to native; 6: facts judged on the reference's
# path, llama.cpp tiers; 7: per-prompt speed samples kept, for the gain's interval)
EMULABLE = ("int8", "int4")


@dataclass(frozen=True)
class Admission:
    """The outcome: each checked tier's verdict (the reference has none), by tier name."""

    reference: str
    verdicts: dict[str, TierVerdict]
    speeds: dict[str, TierSpeed] = dataclasses.field(default_factory=dict)  # every tier's

    def admitted_classes(self) -> dict[str, list[str]]:
        """Tier → the classes it may serve (tiers not listed serve every class)."""
        return {name: list(v.admitted_classes()) for name, v in self.verdicts.items()}

    def modes(self) -> dict[str, str]:
        return {name: v.mode for name, v in self.verdicts.items()}

    def lines(self) -> list[str]:
        out = [v.summary() for v in self.verdicts.values()]
        for name, speed in self.speeds.items():
            n = sum(t is not None for t in speed.tpots_s)  # none kept: an older cache entry
            of = f" (medians of {n} prompts)" if n else ""
            out.append(
                f"tier {name} speed: TTFT {speed.ttft_s * 1000:.0f} ms, TPOT "
                f"{speed.tpot_s * 1000:.1f} ms alone{of}; {speed.throughput_tok_s:.0f} output "
                f"tok/s at {speed.concurrency} at once"
            )
        return out

    def measured(self) -> dict[str, dict[str, Any]]:
        """Per tier: quality per category (agreement with the reference; 1 for the reference)
        and speed, as the gateway's ``GatewayConfig.measured`` takes them."""
        out: dict[str, dict[str, Any]] = {}
        for name, speed in self.speeds.items():
            verdict = self.verdicts.get(name)
            quality = (
                {c.category: c.forced_agreement for c in verdict.categories}
                if verdict is not None
                else {"chat": 1.0, "code": 1.0, "math": 1.0}
            )
            out[name] = {
                "quality": quality,
                "ttft_s": speed.ttft_s,
                "tpot_s": speed.tpot_s,
                "throughput_tok_s": speed.throughput_tok_s,
                "ttfts_s": list(speed.ttfts_s),
                "tpots_s": list(speed.tpots_s),
                "concurrency": speed.concurrency,
            }
        return out


def admission_probes() -> list[AdmissionProbe]:
    """The precision check's held-aside probes (chat, code, math) and the factual probes."""
    held_aside = [AdmissionProbe(p.category, p.text) for p in load_probes()]
    return [*held_aside, *load_facts()]


def machine_identity(device: str) -> str:
    """What the engine's kernels depend on: the CPU model and flags (or the GPU's name)."""
    if device != "cpu":
        return f"{device}:{os.environ.get('CUDA_VISIBLE_DEVICES', '')}"
    try:
        text = CPUINFO.read_text()
    except OSError:
        return "cpu:unknown"
    keep = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.split(":", 1)[0].strip() in ("model name", "flags")
    ][:2]
    return "cpu:" + " | ".join(keep)


def admission_key(
    launches: Sequence[TierLaunch],
    digests: Mapping[str, str],
    engine: str,
    machine: str,
    spec: AdmissionSpec,
    probes: Sequence[AdmissionProbe],
) -> str:
    """A hash of everything that decides the verdicts (see the module docstring)."""
    material = {
        "version": VERSION,
        "tiers": {t.name: [digests.get(t.name, ""), t.dtype or "", t.device] for t in launches},
        "engine": engine,
        "machine": machine,
        "spec": spec.model_dump(mode="json"),
        "probes": [dataclasses.astuple(p) for p in probes],
    }
    blob = json.dumps(material, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def variant_digest(folder: Path) -> str:
    """What identifies a variant's weights: the optimizer's digest (metadata.json
    ``input_key.digest``) and the bytes of each weights file (so a folder edited by hand is
    judged again; about a second for SmolLM2's three variants)."""
    digest = hashlib.sha256()
    try:
        meta = json.loads((folder / "metadata.json").read_text())
        digest.update(str(meta["input_key"]["digest"]).encode())
    except (OSError, ValueError, KeyError, TypeError):
        digest.update(b"no metadata digest")
    for file in sorted([*folder.glob("*.safetensors"), *folder.glob("*.gguf")]):
        with file.open("rb") as fh:
            digest.update(f"{file.name}:{hashlib.file_digest(fh, 'sha256').hexdigest()}".encode())
    return digest.hexdigest()[:16]


def cache_file(key: str) -> Path:
    return cache_root() / "admission" / f"{key}.json"


def load_cached(key: str) -> Admission | None:
    try:
        data = json.loads(cache_file(key).read_text())
        return Admission(
            str(data["reference"]),
            {name: verdict_from_json(v) for name, v in data["verdicts"].items()},
            {name: TierSpeed.from_json(v) for name, v in data.get("speeds", {}).items()},
        )
    except (OSError, ValueError, KeyError, TypeError, AdmissionError):
        return None


def save(key: str, admission: Admission) -> None:
    """Written whole (a temporary file renamed), so a crash leaves no half verdict."""
    path = cache_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "reference": admission.reference,
        "verdicts": {name: verdict_to_json(v) for name, v in admission.verdicts.items()},
        "speeds": {name: dataclasses.asdict(v) for name, v in admission.speeds.items()},
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


Emulate = Callable[[TierLaunch], TierLaunch]  # the tier's emulated copy (built if need be)
Restart = Callable[[TierLaunch], None]  # serve the tier from this launch instead


def apply_cached_modes(
    launches: Sequence[TierLaunch], cached: Admission | None, emulate: Emulate
) -> list[TierLaunch]:
    """Tiers the cached verdicts served emulated start emulated at once."""
    if cached is None:
        return list(launches)
    modes = cached.modes()
    return [
        emulate(t) if modes.get(t.name) == "emulated" and not is_emulated(t) else t
        for t in launches
    ]


def is_emulated(launch: TierLaunch) -> bool:
    return launch.model_dir.parent.name.endswith(".emulated")


def check_tiers(
    tiers: Mapping[str, str],
    spec: AdmissionSpec,
    probes: Sequence[AdmissionProbe],
    modes: Mapping[str, str] | None = None,
    engines: Mapping[str, str] | None = None,
    api_key: str | None = None,
) -> CheckResult:
    """One admission run over running tiers (name -> base URL), judged by ``spec``: what
    ``up`` does after the start and ``check --serving`` on demand."""
    opts = CheckOptions(
        tiers=tiers,
        reference=spec.reference,
        floors={str(k): v for k, v in spec.floors.items()},
        max_tokens=spec.max_tokens,
        modes=modes or {},
        engines=engines or {},
        api_key=api_key,
    )
    return run_check(opts, probes)


def check(
    launches: Sequence[TierLaunch], spec: AdmissionSpec, probes: Sequence[AdmissionProbe]
) -> CheckResult:
    """One admission run over the tiers ``up`` launched."""
    tiers = {t.name: f"http://{t.host}:{t.port}" for t in launches}
    modes = {t.name: "emulated" if is_emulated(t) else "native" for t in launches}
    engines = {t.name: t.engine for t in launches}
    key = next((t.api_key for t in launches if t.api_key), None)
    return check_tiers(tiers, spec, probes, modes, engines, key)


def admit(
    launches: list[TierLaunch],
    spec: AdmissionSpec,
    probes: Sequence[AdmissionProbe],
    emulate: Emulate,
    restart: Restart,
    say: Callable[[str], None],
) -> tuple[list[TierLaunch], Admission]:
    """Check the running tiers; re-serve a failing quantized tier emulated and check it again."""
    names = [t.name for t in launches]
    if spec.reference not in names:
        raise ModelError(f"admission.reference {spec.reference} is not among the tiers started")
    say(f"checking {len(names) - 1} tier(s) against {spec.reference} in the engine ...")
    result = check(launches, spec, probes)
    if result.reference_problems:
        raise ModelError(
            f"the reference tier {spec.reference} answers wrong in this engine: "
            f"{result.reference_problems[0]}"
        )
    verdicts = dict(result.verdicts)
    out = list(launches)
    for i, launch in enumerate(out):
        verdict = verdicts.get(launch.name)
        if verdict is None or verdict.passed:
            continue
        if launch.name not in EMULABLE or is_emulated(launch) or launch.engine != "vllm":
            continue
        say(f"{verdict.summary()}; serving it emulated and checking again")
        copy = emulate(launch)
        restart(copy)
        pair = [t for t in out if t.name == spec.reference] + [copy]
        again = check(pair, spec, probes).verdicts[launch.name]
        if emulation_helps(verdict, again):
            out[i], verdicts[launch.name] = copy, again
        else:  # emulation did not help (measure/admission.py): back to the engine's own kernels
            say(f"{again.summary()}; back to the native kernels")
            restart(launch)
    return out, Admission(spec.reference, verdicts)


def measure_speeds(launches: Sequence[TierLaunch], tokenizer_dir: Path) -> dict[str, TierSpeed]:
    """Each tier's speed alone and under a little load (measure/speed.py), one at a time."""
    tiers = {t.name: f"http://{t.host}:{t.port}" for t in launches}
    key = next((t.api_key for t in launches if t.api_key), None)
    headers = {"authorization": f"Bearer {key}"} if key else None
    return calibrate(tiers, launches[0].served_model_name, tokenizer_dir, headers=headers)


def print_admission(admission: Admission) -> None:
    for line in admission.lines():
        print(f"up: {line}", file=sys.stderr, flush=True)


def measured_record(
    port: int, config: GatewayConfig, floors: Mapping[str, float], speed: str
) -> MeasuredStack | None:
    """What ``config`` holds of the measurements, as the file ``policy check`` and ``eval
    routing`` read (gateway/measured.py); ``None`` when nothing was measured."""
    if not config.measured or config.reference_tier is None:
        return None
    return MeasuredStack(
        written_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        gateway_port=port,
        reference=config.reference_tier,
        tiers=dict(config.measured),
        tier_urls={t.name: t.base_url for t in config.tiers},
        classes={t.name: list(t.classes) for t in config.tiers if t.classes is not None},
        floors=dict(floors),
        speed=speed,
    )


def record_measurements(
    port: int, config: GatewayConfig, floors: Mapping[str, float]
) -> Path | None:
    """Write the stack's measurement file (its path), or remove it when nothing was measured
    (``None``): a file from an earlier ``up`` on this port must not stand for this one."""
    path = measured_path(port)
    o = SpeedOptions()
    speed = (
        f"medians of {o.requests} prompts of {o.input_len} tokens, {o.output_len} generated, "
        f"alone (each prompt's TTFT and TPOT kept, paired across tiers); output tokens/s at "
        f"{o.concurrency} at once"
    )
    record = measured_record(port, config, floors, speed)
    if record is None:
        path.unlink(missing_ok=True)
        return None
    write_measured(path, record)
    return path
