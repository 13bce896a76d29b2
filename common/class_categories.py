"""Which probe categories a request class needs (one table for the admission check in
measure/ and the route derivation in the gateway): a tier serves a class only when it passes,
or is measured on, every category listed."""

from __future__ import annotations

CLASS_CATEGORIES: dict[str, tuple[str, ...]] = {
    "tolerant": ("chat",),
    "code": ("code",),
    "math": ("math",),
    "long": ("chat", "code", "math"),
}
