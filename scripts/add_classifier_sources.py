"""Add the human-written sources of issue 33 to the classifier's training data.

    python3 scripts/add_classifier_sources.py --mbpp FILE --svamp FILE

- ``--mbpp``: MBPP's ``mbpp.jsonl`` (Austin et al. 2021, google-research; CC-BY-4.0): 974
  programming tasks written by crowd workers; each task's ``text`` is a ``code`` prompt.
- ``--svamp``: SVAMP's ``SVAMP.json`` (Patel et al. 2021; MIT): 1,000 math word problems varied
  by hand; ``Body`` and ``Question`` together are a ``math`` prompt.

Rewrites classifier/data/train.jsonl in place: the rows of these sources are replaced (so it can
run again), the others kept in their order; a prompt already in the training or held-out file is
left out. Deterministic. Sources and licenses: classifier/data/LICENSES.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "classifier" / "data"
SOURCES = ("mbpp", "svamp")
Row = dict[str, str]


def mbpp(path: Path) -> Iterator[Row]:
    """MBPP's tasks 1-974, the first row of each id (a copy may carry rows added later)."""
    done: set[int] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        task = json.loads(line) if line.strip() else {}
        number = task.get("task_id")
        if isinstance(number, int) and 1 <= number <= 974 and number not in done:
            done.add(number)
            yield {"label": "code", "prompt": task["text"].strip(), "source": f"mbpp:{number}"}


def svamp(path: Path) -> Iterator[Row]:
    for item in json.loads(path.read_text(encoding="utf-8")):
        body, question = item["Body"].strip(), item["Question"].strip()
        body = body if body.endswith((".", "?", "!")) else body + "."
        yield {"label": "math", "prompt": f"{body} {question}", "source": f"svamp:{item['ID']}"}


def _key(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mbpp", required=True, type=Path)
    parser.add_argument("--svamp", required=True, type=Path)
    args = parser.parse_args()
    train_path = DATA / "train.jsonl"
    rows = [json.loads(x) for x in train_path.read_text(encoding="utf-8").splitlines() if x]
    rows = [r for r in rows if r["source"].split(":")[0] not in SOURCES]
    seen = {_key(r["prompt"]) for r in rows}
    seen |= {_key(json.loads(x)["prompt"]) for x in (DATA / "heldout.jsonl").open() if x.strip()}
    added = 0
    for row in (*mbpp(args.mbpp), *svamp(args.svamp)):
        if row["prompt"] and _key(row["prompt"]) not in seen:
            seen.add(_key(row["prompt"]))
            rows.append(row)
            added += 1
    lines = (json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows)
    train_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"train: {len(rows)} rows ({added} from {', '.join(SOURCES)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
