"""Pure layer planning: which linear layer gets which precision, and the int4 group size.

Works on plain ``LinearInfo`` values (the quantizer lists them from the torch model), so every
decision here is tested without torch.

Layer-name rule (used by ``layer_overrides`` and ``ignore``), applied to full module names such
as ``model.layers.0.self_attn.q_proj``:

* ``re:<regex>`` — ``re.fullmatch`` against the full name (``re:.*\\.q_proj`` matches every
  q_proj; ``re:q_proj`` matches nothing, since the whole name must match);
* anything else — equal to the full name, or to a whole-segment dotted suffix of it:
  ``embed_tokens`` matches ``model.embed_tokens``, ``self_attn.q_proj`` matches every layer's
  q_proj, but ``proj`` does not match ``q_proj`` (suffixes start after a dot).

A pattern never matches a module's children: ``model.layers.0`` names the block, not its linears.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from optimizer.recipe import UNQUANTIZED, LayerOverride, Precision, normalize_precision

GROUP_SIZE_CANDIDATES: tuple[int, ...] = (128, 64, 32)
# vLLM loads these sibling linears as one fused layer and refuses shards with different schemes
# ("Found different quantization schemes for the shards of ..."); llama.py's mapping, which most
# decoder models share.
VLLM_FUSED: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


class PlanError(ValueError):
    """A layer plan that cannot be made; ``str()`` is one line naming the culprit."""


@dataclass(frozen=True)
class LinearInfo:
    """One linear layer of the model: full module name and weight geometry."""

    name: str
    in_features: int
    out_features: int


@dataclass(frozen=True)
class LayerPlan:
    name: str
    precision: Precision
    in_features: int
    out_features: int


@dataclass(frozen=True)
class VariantPlan:
    """What one variant does to every linear layer.

    ``ignore`` lists the exact names of the layers left unquantized (llm-compressor's
    ``ignore``); ``group_size`` is set when some layer is int4.
    """

    precision: Precision
    layers: tuple[LayerPlan, ...]
    ignore: tuple[str, ...]
    group_size: int | None
    overridden: dict[str, Precision] = field(default_factory=dict)

    def targets(self, precision: str) -> tuple[str, ...]:
        """Exact names of the layers planned at ``precision``."""
        wanted = normalize_precision(precision)
        return tuple(layer.name for layer in self.layers if layer.precision == wanted)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for layer in self.layers:
            out[layer.precision] = out.get(layer.precision, 0) + 1
        return out


@functools.lru_cache(maxsize=256)
def _compiled(regex: str) -> re.Pattern[str]:
    try:
        return re.compile(regex)
    except re.error as exc:
        raise PlanError(f"bad regular expression 're:{regex}': {exc}") from None


def matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` names module ``name`` (see the module docstring for the rule)."""
    if pattern.startswith("re:"):
        return _compiled(pattern[3:]).fullmatch(name) is not None
    return name == pattern or name.endswith("." + pattern)


def resolve_overrides(
    overrides: Sequence[LayerOverride], all_module_names: Iterable[str]
) -> dict[str, Precision]:
    """Map every module an override names to its precision; later overrides win.

    ``all_module_names`` is every module of the model (not only linears), so an override naming
    ``embed_tokens`` is valid. A pattern that matches no module is a ``PlanError`` naming it.
    """
    names = list(all_module_names)
    resolved: dict[str, Precision] = {}
    for index, override in enumerate(overrides):
        for pattern in override.layers:
            hits = [name for name in names if matches(pattern, name)]
            if not hits:
                raise PlanError(
                    f"quantization.layer_overrides[{index}]: '{pattern}' matches no layer of "
                    f"the model{_suggest(pattern, names)}"
                )
            for name in hits:
                resolved[name] = override.precision
    return resolved


def _suggest(pattern: str, names: Sequence[str]) -> str:
    if pattern.startswith("re:"):
        return ""
    tails = sorted({name.rsplit(".", 1)[-1] for name in names} | set(names))
    close = difflib.get_close_matches(pattern, tails, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def choose_group_size(
    layers: Iterable[LinearInfo], candidates: Sequence[int] = GROUP_SIZE_CANDIDATES
) -> int:
    """The largest candidate dividing every layer's ``in_features`` (576 → 64, 768 → 128)."""
    layers = list(layers)
    if not layers:
        raise PlanError("no layer to quantize, so no group size to choose")
    for size in sorted(candidates, reverse=True):
        if all(layer.in_features % size == 0 for layer in layers):
            return size
    smallest = min(candidates)
    worst = next((lay for lay in layers if lay.in_features % smallest), layers[0])
    tried = "/".join(str(size) for size in sorted(candidates, reverse=True))
    raise PlanError(
        f"no int4 group size of {tried} divides every layer's input size "
        f"({worst.name} has {worst.in_features}); set quantization.group_size or keep such "
        f"layers at higher precision with layer_overrides"
    )


def plan_variant(
    precision: str,
    linears: Sequence[LinearInfo],
    ignore: Sequence[str] = ("lm_head",),
    overrides: dict[str, Precision] | None = None,
    *,
    group_size: int | str = "auto",
    float_precision: str = "fp16",
    fused: Mapping[str, Sequence[str]] = VLLM_FUSED,
) -> VariantPlan:
    """Plan one variant.

    * ``precision`` fp16/bf16: every layer stays in that floating-point type (a cast); overrides
      and ``ignore`` do not apply.
    * ``precision`` int8/int4: each layer gets, in order of priority, its override (from
      ``resolve_overrides``), ``float_precision`` if an ``ignore`` pattern names it, else
      ``precision``. Overrides may mix int8 and int4 layers in one variant.

    ``group_size`` (``"auto"`` or an int) applies to int4 layers; an int that does not divide
    some int4 layer's input size is a ``PlanError``. So is a plan giving the shards of one
    ``fused`` layer (q/k/v, gate/up) different precisions, which vLLM cannot load.
    """
    variant = normalize_precision(precision)
    floating = normalize_precision(float_precision)
    if floating not in UNQUANTIZED:
        raise PlanError(f"float_precision must be fp16 or bf16, not {float_precision!r}")
    overrides = dict(overrides or {})
    planned: list[LayerPlan] = []
    applied: dict[str, Precision] = {}
    for linear in linears:
        chosen: Precision
        if variant in UNQUANTIZED:
            chosen = variant
        elif linear.name in overrides:
            chosen = overrides[linear.name]
            chosen = floating if chosen in UNQUANTIZED else chosen
            applied[linear.name] = chosen
        elif any(matches(pattern, linear.name) for pattern in ignore):
            chosen = floating
        else:
            chosen = variant
        planned.append(LayerPlan(linear.name, chosen, linear.in_features, linear.out_features))
    _check_fused(planned, fused)
    int4 = [
        linear for linear, plan in zip(linears, planned, strict=True) if plan.precision == "int4"
    ]
    size: int | None = None
    if int4:
        size = _group_size_for(int4, group_size)
    unquantized = tuple(plan.name for plan in planned if plan.precision in UNQUANTIZED)
    ignored = () if variant in UNQUANTIZED else unquantized
    return VariantPlan(variant, tuple(planned), ignored, size, applied)


def _fused_key(name: str, fused: Mapping[str, Sequence[str]]) -> tuple[str, str] | None:
    parent, _, leaf = name.rpartition(".")
    for fused_name, shards in fused.items():
        if leaf in shards:
            return parent, fused_name
    return None


def _check_fused(planned: Sequence[LayerPlan], fused: Mapping[str, Sequence[str]]) -> None:
    groups: dict[tuple[str, str], list[LayerPlan]] = {}
    for plan in planned:
        key = _fused_key(plan.name, fused)
        if key is not None:
            groups.setdefault(key, []).append(plan)
    for (parent, fused_name), shards in groups.items():
        if len({shard.precision for shard in shards}) > 1:
            listed = ", ".join(f"{s.name.rpartition('.')[2]}={s.precision}" for s in shards)
            where = f"{parent}.{fused_name}" if parent else fused_name
            raise PlanError(
                f"{where}: vLLM fuses {listed} into one layer, so they need one precision; "
                f"name all of them in the same layer_overrides entry"
            )


def fused_siblings(
    names: Iterable[str],
    all_names: Iterable[str],
    fused: Mapping[str, Sequence[str]] = VLLM_FUSED,
) -> list[str]:
    """``names`` plus every layer fused with one of them (for override suggestions)."""
    wanted = list(dict.fromkeys(names))
    keys = {key for key in (_fused_key(name, fused) for name in wanted) if key is not None}
    extra = [name for name in all_names if _fused_key(name, fused) in keys]
    return list(dict.fromkeys([*wanted, *extra]))


def _group_size_for(layers: Sequence[LinearInfo], group_size: int | str) -> int:
    if group_size == "auto":
        return choose_group_size(layers)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
        raise PlanError("quantization.group_size must be 'auto' or a positive integer")
    bad = [layer for layer in layers if layer.in_features % group_size]
    if bad:
        raise PlanError(
            f"quantization.group_size: {group_size} does not divide the input size of "
            f"{bad[0].name} ({bad[0].in_features}); try 'auto'"
        )
    return group_size
