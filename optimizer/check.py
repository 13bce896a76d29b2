"""The precision check ("trial run"): compare a quantized variant with its original.

``compare_models`` runs both models on the probe prompts (batch of one, plain text, no
chat template) and measures, over every token position:

- next-token KL divergence KL(p_original || p_candidate), mean and max, overall and per
  probe category;
- top-1 agreement, the share of positions whose argmax tokens match;
- for every ``nn.Linear`` of the original (matched by module name in the candidate, whatever
  that module's class), two relative errors ``||y_cand - y_orig||_F / ||y_orig||_F`` pooled
  over all probes:

  * ``rel_error`` (isolated): the candidate layer and the original layer fed the *same*
    input (the candidate's). This is the layer's own quantization error; it drives the
    verdict and the ``layer_overrides`` advice, since it points at the layer to blame.
  * ``output_rel_error`` (accumulated): the candidate model's layer output against the
    original model's. It also carries the error of every earlier layer, so it grows with
    depth; it is recorded for diagnosis.

Only squared norms are accumulated; one probe's original layer outputs are held at a time.
``evaluate`` and ``failure_message`` are pure.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from optimizer.probes import Probe

if TYPE_CHECKING:  # torch is imported where it runs, so the verdict side works without it
    import torch
    from torch import nn

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_Hook = Callable[..., None]


class CheckError(ValueError):
    """The two models cannot be compared; the message is one line naming why."""


@dataclass(frozen=True)
class TokenStats:
    """Next-token agreement over a set of positions."""

    mean_kl: float
    max_kl: float
    top1: float
    positions: int


@dataclass(frozen=True)
class LayerError:
    """One linear layer's relative output errors (see the module docstring)."""

    name: str
    rel_error: float
    output_rel_error: float


@dataclass(frozen=True)
class CheckReport:
    """What ``compare_models`` measured; ``to_dict`` is what metadata.json records."""

    mean_kl: float
    max_kl: float
    top1: float
    positions: int
    probes: int
    categories: dict[str, TokenStats]
    layers: list[LayerError]
    seconds: float

    @property
    def layer_errors(self) -> dict[str, float]:
        """Isolated relative error per layer name."""
        return {layer.name: layer.rel_error for layer in self.layers}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite numbers become None)."""
        return {
            "probes": self.probes,
            "positions": self.positions,
            "mean_kl": _finite(self.mean_kl),
            "max_kl": _finite(self.max_kl),
            "top1": _finite(self.top1),
            "categories": {
                name: {key: _finite(value) for key, value in asdict(stats).items()}
                for name, stats in self.categories.items()
            },
            "layers": {
                layer.name: {
                    "rel_error": _finite(layer.rel_error),
                    "output_rel_error": _finite(layer.output_rel_error),
                }
                for layer in self.layers
            },
            "seconds": round(self.seconds, 3),
        }


class Thresholds(Protocol):
    """Anything with the three limits (``CheckThresholds``, or the recipe's model)."""

    @property
    def max_kl(self) -> float: ...
    @property
    def min_top1(self) -> float: ...
    @property
    def max_layer_rel_error(self) -> float: ...


@dataclass(frozen=True)
class CheckThresholds:
    """Per-variant limits from the recipe.

    ``max_kl`` bounds the mean next-token KL and ``min_top1`` the top-1 agreement, both
    overall and in every probe category; ``max_layer_rel_error`` bounds each layer's
    isolated relative error.
    """

    max_kl: float
    min_top1: float
    max_layer_rel_error: float


@dataclass(frozen=True)
class CheckVerdict:
    """Pass or fail, why, and the layers most worth keeping at higher precision."""

    passed: bool
    failures: list[str]
    worst_layers: list[tuple[str, float]]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "passed": self.passed,
            "failures": list(self.failures),
            "worst_layers": [
                {"name": name, "rel_error": _finite(error)} for name, error in self.worst_layers
            ],
        }


@dataclass
class _TokenAcc:
    kl_sum: float = 0.0
    kl_max: float = 0.0
    agree: int = 0
    count: int = 0

    def add(self, kl: torch.Tensor, agree: torch.Tensor) -> None:
        self.kl_sum += float(kl.sum())
        self.kl_max = max(self.kl_max, float(kl.max()), key=_nan_high)
        self.agree += int(agree.sum())
        self.count += int(kl.numel())

    def stats(self) -> TokenStats:
        count = max(self.count, 1)
        return TokenStats(self.kl_sum / count, self.kl_max, self.agree / count, self.count)


@dataclass
class _LayerAcc:
    diff_sq: float = 0.0
    ref_sq: float = 0.0
    out_diff_sq: float = 0.0
    out_ref_sq: float = 0.0


@dataclass
class _LayerTracker:
    """Forward-hook state: the original's outputs for the current probe, and the sums."""

    reference: dict[str, nn.Module]
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    sums: dict[str, _LayerAcc] = field(default_factory=dict)

    def record(self, name: str) -> _Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            self.outputs.setdefault(name, []).append(_tensor(output))

        return hook

    def compare(self, name: str) -> _Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            y_cand = _tensor(output)
            pending = self.outputs.get(name)
            if not pending:
                raise CheckError(f"layer {name} ran in the candidate but not in the original")
            y_orig = pending.pop(0)
            reference = self.reference[name]
            weight = next(reference.parameters())
            x = args[0].to(device=weight.device, dtype=weight.dtype)
            # .forward skips hooks: the original layer on the candidate's input.
            y_ref = reference.forward(x)
            acc = self.sums.setdefault(name, _LayerAcc())
            acc.diff_sq += _sq_norm(y_cand, y_ref)
            acc.ref_sq += _sq_norm(y_ref)
            acc.out_diff_sq += _sq_norm(y_cand, y_orig)
            acc.out_ref_sq += _sq_norm(y_orig)

        return hook

    def layers(self, names: Sequence[str]) -> list[LayerError]:
        sums = [self.sums.get(name, _LayerAcc()) for name in names]
        return [
            LayerError(
                name, _ratio(acc.diff_sq, acc.ref_sq), _ratio(acc.out_diff_sq, acc.out_ref_sq)
            )
            for name, acc in zip(names, sums, strict=True)
        ]


def linear_names(model: nn.Module) -> list[str]:
    """Names of the model's ``nn.Linear`` modules, in module order."""
    from torch import nn  # here, not at the top: see TYPE_CHECKING above

    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def compare_models(
    original: nn.Module,
    candidate: nn.Module,
    tokenizer: Any,
    probes: Sequence[Probe],
    max_tokens: int = 128,
) -> CheckReport:
    """Run both models on ``probes`` (each truncated to ``max_tokens``) and compare them."""
    if not probes:
        raise CheckError("precision check needs at least one probe")
    if candidate is original:
        raise CheckError("precision check needs two models; the candidate is the original")
    import torch  # here, not at the top: see TYPE_CHECKING above

    started = time.perf_counter()
    names = linear_names(original)
    tracker = _LayerTracker(reference=_modules(original, names, "original"))
    cand_modules = _modules(candidate, names, "candidate")
    overall = _TokenAcc()
    categories: dict[str, _TokenAcc] = {}
    with (
        _eval_mode(original),
        _eval_mode(candidate),
        torch.no_grad(),
        _hooks(tracker.reference, tracker.record),
        _hooks(cand_modules, tracker.compare),
    ):
        for probe in probes:
            ids = _encode(tokenizer, probe.text, max_tokens)
            logits_orig = _logits(original, ids)
            logits_cand = _logits(candidate, ids)
            tracker.outputs.clear()
            kl, agree = _token_metrics(logits_orig, logits_cand)
            overall.add(kl, agree)
            categories.setdefault(probe.category, _TokenAcc()).add(kl, agree)
    stats = overall.stats()
    return CheckReport(
        mean_kl=stats.mean_kl,
        max_kl=stats.max_kl,
        top1=stats.top1,
        positions=stats.positions,
        probes=len(probes),
        categories={name: acc.stats() for name, acc in sorted(categories.items())},
        layers=tracker.layers(names),
        seconds=time.perf_counter() - started,
    )


def evaluate(
    report: CheckReport,
    thresholds: Thresholds,
    top: int = 5,
    metric: str = "output_rel_error",
    judged: Collection[str] | None = None,
) -> CheckVerdict:
    """Judge ``report`` against ``thresholds``. NaN always fails.

    ``metric`` picks the layer error the limit applies to. The default, ``output_rel_error``
    (the variant's layer output against the original's), stays valid under SmoothQuant,
    which rescales a layer's input and weights together: the isolated ``rel_error`` feeds the
    original layer the *smoothed* input and so reports errors above 1 for healthy layers
    (measured on the int8 variant). ``judged`` limits the layer verdict to those names (the
    quantized layers: an unquantized lm_head only carries the error of the layers before it).
    ``worst_layers``: the judged layers over ``max_layer_rel_error``, worst first (at most
    ``top``); when none is over, the ``top`` worst layers.
    """
    categories = report.categories
    max_kl, min_top1 = thresholds.max_kl, thresholds.min_top1
    failures = [
        *_limit_failures(
            "kl",
            report.mean_kl,
            {name: stats.mean_kl for name, stats in categories.items()},
            lambda value: not value <= max_kl,
            f"> {max_kl:g}",
            "{:.3g}",
        ),
        *_limit_failures(
            "top-1",
            report.top1,
            {name: stats.top1 for name, stats in categories.items()},
            lambda value: not value >= min_top1,
            f"< {min_top1:g}",
            "{:.3f}",
        ),
    ]

    def error(layer: LayerError) -> float:
        return float(getattr(layer, metric))

    layers = [layer for layer in report.layers if judged is None or layer.name in judged]
    ranked = sorted(layers, key=lambda layer: _nan_high(error(layer)), reverse=True)
    over = [layer for layer in ranked if not error(layer) <= thresholds.max_layer_rel_error]
    if over:
        failures.append(
            f"{len(over)} layer(s) with relative error > {thresholds.max_layer_rel_error:g}"
        )
    worst = (over or ranked)[:top]
    return CheckVerdict(
        passed=not failures,
        failures=failures,
        worst_layers=[(layer.name, error(layer)) for layer in worst],
    )


def _limit_failures(
    label: str,
    overall: float,
    by_category: dict[str, float],
    bad: Callable[[float], bool],
    limit: str,
    fmt: str,
) -> list[str]:
    """``kl 0.44 > 0.1 (chat 0.62, code 0.45)`` when the overall value fails, else one entry
    per failing category: ``kl[chat] 0.62 > 0.1``."""
    failing = {name: value for name, value in by_category.items() if bad(value)}
    if bad(overall):
        detail = ", ".join(f"{name} {fmt.format(value)}" for name, value in failing.items())
        return [f"{label} {fmt.format(overall)} {limit}" + (f" ({detail})" if detail else "")]
    return [f"{label}[{name}] {fmt.format(value)} {limit}" for name, value in failing.items()]


def failure_message(
    verdict: CheckVerdict, variant_name: str, layers: Sequence[str] | None = None
) -> str:
    """The one-line failure summary, then a recipe snippet keeping layers in float16.

    The snippet names ``layers`` if given (say, the worst layers plus the layers vLLM fuses
    with them), else the worst layers.
    """
    if verdict.passed:
        raise ValueError(f"precision check for {variant_name} passed; there is no failure")
    worst = ", ".join(f"{name} {error:.3g}" for name, error in verdict.worst_layers)
    summary = f"precision check failed for {variant_name}: {'; '.join(verdict.failures)}"
    if worst:
        summary += f"; worst layers: {worst}"
    if not verdict.worst_layers:
        return summary
    return "\n".join(
        [
            summary,
            "to keep these layers at higher precision, add to the recipe:",
            overrides_snippet(layers or [name for name, _ in verdict.worst_layers]),
        ]
    )


def overrides_snippet(layers: Sequence[str], precision: str = "float16") -> str:
    """A recipe ``layer_overrides`` YAML block keeping ``layers`` at ``precision``."""
    names = ", ".join(name if _PLAIN_NAME.match(name) else json.dumps(name) for name in layers)
    lines = ["quantization:", "  layer_overrides:", f"    - layers: [{names}]"]
    return "\n".join([*lines, f"      precision: {precision}"])


def _modules(model: nn.Module, names: Sequence[str], role: str) -> dict[str, nn.Module]:
    modules = dict(model.named_modules())
    missing = [name for name in names if name not in modules]
    if missing:
        raise CheckError(
            f"the {role} model has no module {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    return {name: modules[name] for name in names}


@contextmanager
def _hooks(modules: dict[str, nn.Module], factory: Callable[[str], _Hook]) -> Iterator[None]:
    handles = []
    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(factory(name)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def _encode(tokenizer: Any, text: str, max_tokens: int) -> torch.Tensor:
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)
    ids: torch.Tensor = encoded["input_ids"]
    if ids.numel() == 0:
        raise CheckError(f"probe tokenizes to nothing: {text[:40]!r}")
    return ids


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    device = next(model.parameters()).device
    output = model(input_ids=ids.to(device), use_cache=False)
    logits: torch.Tensor = output.logits[0]
    return logits.float().cpu()


def _token_metrics(
    logits_orig: torch.Tensor, logits_cand: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position KL(p_orig || p_cand) and argmax agreement."""
    import torch  # here, not at the top: see TYPE_CHECKING above

    if logits_orig.shape != logits_cand.shape:
        raise CheckError(
            f"logit shapes differ: original {tuple(logits_orig.shape)}, "
            f"candidate {tuple(logits_cand.shape)}"
        )
    log_p = torch.log_softmax(logits_orig, dim=-1)
    log_q = torch.log_softmax(logits_cand, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1).clamp_min(0.0)  # clamp keeps NaN
    agree = logits_orig.argmax(dim=-1) == logits_cand.argmax(dim=-1)
    return kl, agree


def _tensor(output: Any) -> torch.Tensor:
    import torch  # here, not at the top: see TYPE_CHECKING above

    tensor = output[0] if isinstance(output, tuple | list) else output
    if not isinstance(tensor, torch.Tensor):
        raise CheckError(f"a linear layer returned {type(tensor).__name__}, not a tensor")
    return tensor.detach()


def _sq_norm(a: torch.Tensor, b: torch.Tensor | None = None) -> float:
    a = a.float()
    diff = a if b is None else a - b.to(a.device).float()
    return float(diff.pow(2).sum())


def _ratio(diff_sq: float, ref_sq: float) -> float:
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def _nan_high(value: float) -> float:
    return math.inf if math.isnan(value) else value


def _finite(value: float | int) -> float | int | None:
    return value if math.isfinite(value) else None
