"""Build classifier/data/heldout-followups.jsonl: the held-out prompts as first turns, each
followed by a short follow-up that names no class of its own (issue 33: "a conversation keeps
the class it earned").

    python3 scripts/make_followups.py

Each row is ``{"history": [first turn], "prompt": follow-up, "label": the first turn's label,
"source": "followup-<first turn's source>"}``; ``model-optimizer classifier evaluate`` sends it
as a chat (the first turn, an answer, the follow-up) and reports it under "follow-up turns".
The first turns are classifier/data/heldout.jsonl's (sources never trained on); the follow-ups
are written for this project, by class, in words the training file does not use as prompts
(the training data's written follow-ups are other phrases), and are picked in turn.
Deterministic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "classifier" / "data"
FOLLOW_UPS = {
    "code": (
        "Now make it run faster.",
        "Can you add comments to it?",
        "It fails on an empty input, fix that.",
        "Rewrite it without any library.",
        "Add a test for it.",
    ),
    "math": (
        "Explain each step, please.",
        "What if the numbers were doubled?",
        "Check your answer another way.",
        "Give the result rounded to two decimals.",
        "Are you sure? Show the working.",
    ),
    "tolerant": (
        "Make it funnier.",
        "Shorter, please.",
        "Can you make it sound friendlier?",
        "Give me two more.",
        "Thanks! Can you put that in a table?",
    ),
}


def main() -> int:
    rows = [json.loads(x) for x in (DATA / "heldout.jsonl").read_text().splitlines() if x]
    out = []
    for i, row in enumerate(rows):
        choices = FOLLOW_UPS[row["label"]]
        out.append(
            {
                "history": [row["prompt"]],
                "label": row["label"],
                "prompt": choices[i % len(choices)],
                "source": f"followup-{row['source']}",
            }
        )
    lines = (json.dumps(r, ensure_ascii=False, sort_keys=True) for r in out)
    (DATA / "heldout-followups.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"heldout-followups: {len(out)} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
