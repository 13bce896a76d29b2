"""Every repo path named in code and docs exists (a docstring or page naming a moved file misleads
the next reader): ``gateway/request/relay.py``-style paths, bare file names of modules and
``package/module.attr`` references, in every Python, Markdown and YAML file of the repo."""

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


def named_paths(text: str, basenames: set[str]) -> list[str]:
    """The names in ``text`` that point at nothing in the repo."""
    missing = []
    for match in PATH.finditer(text):
        named = match.group(1).rstrip("/.")
        if named not in ELSEWHERE and not _exists(named):
            missing.append(named)
    for match in BARE.finditer(text):
        if match.group(1) not in basenames and match.group(1) not in ELSEWHERE:
            missing.append(match.group(1))
    return missing


def test_every_named_path_exists() -> None:
    files = _files()
    basenames = {p.name for p in files if p.suffix == ".py"}
    missing = [
        f"{f.relative_to(ROOT)}: {name}"
        for f in files
        for name in named_paths(f.read_text(encoding="utf-8", errors="replace"), basenames)
    ]
    assert not missing, "named but not in the repo: " + "; ".join(sorted(set(missing)))


def test_the_check_sees_moved_files() -> None:
    moved, gone = "gateway" + "/relay.py", "relay_old" + ".py"  # split: this file is scanned too
    text = f"see {moved}, {gone}, gateway/request/relay.py and measure/admission.x"
    assert named_paths(text, {"relay.py"}) == [moved, gone]
