"""Build classifier/data/dev-followups.jsonl: 450 follow-up conversations to check a follow-up
rule on before it is measured on the held-out follow-ups (never for a quoted figure).

    python3 scripts/make_dev_followups.py

First turns: 150 prompts per class drawn (seed 7) from classifier/data/train.jsonl, the training
file; follow-ups: written here, twelve per class, in turn. Each row is ``{"history": [first
turn], "prompt": follow-up, "label": the first turn's label, "source": "dev-followup-<source>"}``,
as in heldout-followups.jsonl. The model was trained on these first turns, so figures on this file
are optimistic: it only tells whether a rule does what it should. Deterministic.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "classifier" / "data"
PER_CLASS = 150
FOLLOW_UPS = {
    "tolerant": (
        "Make it more formal.", "Add a title to it.", "Translate that into Spanish.",
        "Give me three more like that.", "Use simpler words.", "Why?",
        "Expand on the second point.", "Can you make it rhyme?", "Make it a bit warmer.",
        "Say it in one sentence.", "Now for a ten-year-old.", "Any other ideas?",
    ),
    "code": (
        "Now add type hints.", "Make it faster.", "Add tests for it.",
        "Handle the empty case too.", "Explain the loop.", "Rewrite it in Go.",
        "What is its complexity?", "Can you avoid the recursion?", "Add docstrings.",
        "It fails for negative numbers, fix it.", "Make it shorter.", "Why does it work?",
    ),
    "math": (
        "Show the steps.", "What if it were 12 instead?", "Double-check the answer.",
        "Explain the second step.", "How did you get that number?", "Is there a faster way?",
        "Now round it to two decimals.", "What unit is that in?", "Are you sure?",
        "Can you verify it another way?", "And for twice as many?", "Why multiply there?",
    ),
}  # fmt: skip


def main() -> None:
    rows = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines() if line]
    rng = random.Random(7)
    out = []
    for label, phrases in FOLLOW_UPS.items():
        pool = [r for r in rows if r["label"] == label]
        for i, row in enumerate(rng.sample(pool, PER_CLASS)):
            source = row["source"].split(":")[0]
            out.append(
                {
                    "history": [row["prompt"]],
                    "label": label,
                    "prompt": phrases[i % len(phrases)],
                    "source": f"dev-followup-{source}:{i}",
                }
            )
    text = "".join(json.dumps(r) + "\n" for r in out)
    (DATA / "dev-followups.jsonl").write_text(text)
    print(f"classifier/data/dev-followups.jsonl: {len(out)} conversations")


if __name__ == "__main__":
    main()
