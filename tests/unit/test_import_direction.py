"""Which package may import which, read from every module's imports with ``ast``.

Every ``import`` and ``from ... import`` counts, at the top of a module or inside a function:
the offline optimizer (torch's environment) stays off the request path, the CLI stays on top
of measure, and common stays below everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "common",
    "gateway",
    "backends",
    "optimizer",
    "measure",
    "model_optimizer",
    "classifier",
)
# package -> the packages none of its modules may import
FORBIDDEN = {
    "gateway": ("optimizer", "classifier"),
    "classifier": ("optimizer", "measure", "model_optimizer"),
    "backends": ("optimizer",),
    "measure": ("model_optimizer",),
    "common": ("gateway", "backends", "optimizer", "measure", "model_optimizer", "classifier"),
}


def imports_of(text: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``text``, a module of ``package`` (dotted);
    relative imports are resolved against it, ``from . import x`` counts as module ``.x``."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            if node.module is None:
                found += [(node.lineno, ".".join([*base, a.name])) for a in node.names]
            else:
                found.append((node.lineno, ".".join([*base, node.module])))
    return sorted(found)


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        dotted = ".".join(path.relative_to(ROOT).parts[:-1])
        for line, module in imports_of(path.read_text(encoding="utf-8"), dotted):
            if module.split(".")[0] in forbidden:
                out.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    return out


@pytest.mark.parametrize(("package", "forbidden"), sorted(FORBIDDEN.items()))
def test_imports_point_one_way(package: str, forbidden: tuple[str, ...]) -> None:
    assert any((ROOT / package).rglob("*.py")), f"no modules under {package}/"
    assert violations(package, forbidden) == []


def test_every_package_exists() -> None:
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package


def test_imports_inside_functions_and_relative_ones_are_seen() -> None:
    text = (
        "import os\n"
        "def f():\n"
        "    from model_optimizer.stack import run_up\n"
        "    if True:\n"
        "        import optimizer.recipe as r\n"
        "    from . import bench\n"
        "    from ..gateway.policy import PolicyError\n"
    )
    assert imports_of(text, "measure") == [
        (1, "os"),
        (3, "model_optimizer.stack"),
        (5, "optimizer.recipe"),
        (6, "measure.bench"),
        (7, "gateway.policy"),
    ]


# gateway/request/'s sub-packages, top to bottom: each may import only itself and those below
# it, and the two shared modules beside them (kind.py, exchange.py), which import none of them.
REQUEST_ORDER = ("completions", "stream", "route", "classify", "tokens", "upstream", "events")
# Imports allowed to point up, each with its reason: none today. (module path, module imported)
REQUEST_UPWARD: set[tuple[str, str]] = set()


def request_violations() -> list[str]:
    out = []
    base = ROOT / "gateway" / "request"
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(base).parts
        rank = REQUEST_ORDER.index(parts[0]) if len(parts) > 1 else len(REQUEST_ORDER)
        dotted = ".".join(path.relative_to(ROOT).parts[:-1])
        name = str(path.relative_to(ROOT))
        for line, module in imports_of(path.read_text(encoding="utf-8"), dotted):
            found = module.split(".")
            if found[:2] != ["gateway", "request"] or len(found) < 3:
                continue
            if found[2] not in REQUEST_ORDER:
                continue  # kind, exchange: below every sub-package
            if REQUEST_ORDER.index(found[2]) < rank and (name, module) not in REQUEST_UPWARD:
                out.append(f"{name}:{line}: imports {module}, above it")
    return out


def test_the_request_path_imports_point_down() -> None:
    subpackages = {p.name for p in (ROOT / "gateway" / "request").iterdir() if p.is_dir()}
    assert subpackages - {"__pycache__"} == set(REQUEST_ORDER)
    assert request_violations() == []
    for name, module in REQUEST_UPWARD:  # an exception no longer needed is taken out
        dotted = ".".join(Path(name).parts[:-1])
        found = [m for _, m in imports_of((ROOT / name).read_text(encoding="utf-8"), dotted)]
        assert module in found, f"{name} no longer imports {module}: drop the exception"
