"""Every repo path named in code and docs exists (a docstring or page naming a moved file misleads
the next reader): ``gateway/request/stream/relay.py``-style paths, bare file names of modules,
``package/module.attr`` references, dotted module names (``gateway.request.stream.relay``, and after
``-m``, ``import`` or ``from``), and a name a text says a module defines (the module's file,
``'s`` and the name in double backquotes: defined there, not only imported), in every Python,
Markdown and YAML file of the repo."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = (
    "gateway|backends|common|model_optimizer|optimizer|measure|classifier|benchmarks|tests"
    "|scripts|docs|policies|deploy|monitoring|requirements"
)
PATH = re.compile(rf"(?<![\w./-])((?:{TOPS})/[\w./-]*[\w/])")
BARE = re.compile(r"(?<![\w./-])([A-Za-z_]\w*\.py)\b")
PACKAGES = TOPS.split("|")[:-6]  # importable (not scripts nor the data folders)
# gateway.request.stream.relay (a package's module, then maybe a name: checked when the package's
# second part is a module or package); any dotted name after -m, import or from.
DOTTED = re.compile(
    rf"(?:(?<=-m )|(?<=import )|(?<=from ))((?:{'|'.join(PACKAGES)})(?:\.\w+)+)"
    rf"|(?<![\w./-])((?:{'|'.join(PACKAGES)})\.\w+\.\w+(?:\.\w+)*)(?![\w-])"
)
# gateway/request/route/plan.py's ``assess`` / plan.py ``assess``: a name said to be that module's.
OWNED = re.compile(
    rf"(?<![\w./-])((?:(?:{TOPS})/[\w/]*)?[A-Za-z_]\w*\.py)(?:'s)?\s+``([A-Za-z_]\w*)(?:\(\))?``"
)
# Files named that live outside this repo (in llama.cpp's source, in the sandbox a check
# writes, in a dataset package), and the example strings of this test and the link test.
ELSEWHERE = {
    "convert_hf_to_gguf.py",
    "llama.py",
    "program.py",
    "templates.py",
    "constants_niv2.py",
    "docs/a.md",
}
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__"}


def _files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*")
        if p.suffix in {".py", ".md", ".yaml", ".yml"}
        and p.is_file()
        and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
    )


def _exists(named: str) -> bool:
    """A path, a folder, a prefix of file names (``optimizer/gguf_``), or ``module.attr``."""
    path = ROOT / named
    if path.exists() or any(path.parent.glob(f"{path.name}*")):
        return True
    stem, dot, _attr = named.rpartition(".")
    return bool(dot) and (ROOT / f"{stem}.py").exists()


def _defines(module: Path, name: str, *, imported: bool = False) -> bool:
    """Whether ``module`` defines ``name`` (a def, class or assignment; an import only when
    ``imported``: a dotted name may be a test's monkeypatch target)."""
    text = module.read_text(encoding="utf-8", errors="replace")
    if imported and re.search(rf"^(?:from \S+ )?import [^\n]*\b{name}\b", text, re.M):
        return True
    found = (
        rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=(]|^[\w, ]*\b{name}\b[\w, ]*="
    )
    return re.search(found, text, re.M) is not None


def _dotted_exists(named: str) -> bool:
    """A dotted module name: its longest module prefix exists and defines what follows it."""
    parts = named.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        module = module or (base / "__init__.py" if (base / "__init__.py").is_file() else None)
        if module is not None or base.is_dir():
            rest = parts[n:]
            return not rest or (module is not None and _defines(module, rest[0], imported=True))
    return False


def named_paths(text: str, basenames: dict[str, list[Path]]) -> list[str]:
    """The names in ``text`` that point at nothing in the repo (``basenames``: the repo's
    Python files by file name)."""
    missing = []
    for match in PATH.finditer(text):
        named = match.group(1).rstrip("/.")
        if named not in ELSEWHERE and not _exists(named):
            missing.append(named)
    for match in BARE.finditer(text):
        if match.group(1) not in basenames and match.group(1) not in ELSEWHERE:
            missing.append(match.group(1))
    for match in DOTTED.finditer(text):
        named = match.group(1) or match.group(2)
        package = ROOT.joinpath(*named.split(".")[:2])  # gateway.route.tier: a span attribute
        claimed = match.group(1) or package.is_dir() or package.with_suffix(".py").is_file()
        if claimed and not _dotted_exists(named):
            missing.append(named)
    for match in OWNED.finditer(text):
        named, name = match.groups()
        modules = [ROOT / named] if "/" in named else basenames.get(named, [])
        modules = [m for m in modules if m.is_file()]
        if modules and not any(_defines(m, name) for m in modules):
            missing.append(f"{named}'s {name}")
    return missing


def test_every_named_path_exists() -> None:
    files = _files()
    basenames: dict[str, list[Path]] = {}
    for p in files:
        if p.suffix == ".py":
            basenames.setdefault(p.name, []).append(p)
    missing = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in files
        for name in named_paths(f.read_text(encoding="utf-8", errors="replace"), basenames)
    ]
    assert not missing, "named but not in the repo: " + "; ".join(sorted(set(missing)))


def test_the_check_sees_moved_files() -> None:
    moved, gone = "gateway" + "/relay.py", "relay_old" + ".py"  # split: this file is scanned too
    text = f"see {moved}, {gone}, gateway/request/stream/relay.py and measure/admission.x"
    assert named_paths(text, {"relay.py": []}) == [moved, gone]


def test_the_check_sees_moved_modules_and_misplaced_names() -> None:
    relay = ROOT / "gateway" / "request" / "relay.py"
    old, old_too = "gateway." + "relay", "gateway.request." + "relay_old"  # split: scanned too
    misplaced = "gateway/request/stream/relay.py" + "'s ``count_prompt``"
    text = (
        f"python -m {old}; import {old}; {old_too}; gateway.request.stream.relay; "
        "gateway.request.stream.relay.relay_sse; gateway.route.tier (a span attribute); "
        "gateway/request/stream/relay.py's ``relay_sse``; relay.py ``relay_sse``; "
        f"{misplaced}"
    )
    missing = named_paths(text, {"relay.py": [relay]})
    assert missing == [
        old,
        old,
        old_too,
        "gateway/request/stream/relay.py's count_prompt",
    ]
