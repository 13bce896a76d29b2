"""The four request classes, named here once for the whole project (the policy schema, the
classifier, the gateway's routing and measure/ all read them from here), and which probe
categories each class needs (one table for the admission check in measure/ and the route
derivation in the gateway): a tier serves a class only when it passes, or is measured on,
every category listed."""

from __future__ import annotations

from typing import Literal, get_args

ClassName = Literal["tolerant", "code", "math", "long"]
CLASS_NAMES: tuple[ClassName, ...] = get_args(ClassName)
TOLERANT, CODE, MATH, LONG = CLASS_NAMES

CLASS_CATEGORIES: dict[str, tuple[str, ...]] = {
    TOLERANT: ("chat",),
    CODE: ("code",),
    MATH: ("math",),
    LONG: ("chat", "code", "math"),
}
