"""Regenerate optimizer/data/calibration.jsonl: the shipped calibration mix (chat, code, math).

Deterministic, standard library only: ``python3 scripts/make_calibration_data.py SHARED_DATA``.
- math: the first 240 GSM8K test problems with their solutions (MIT, LICENSE.gsm8k); the end of
  the file stays held aside for probes and evaluation.
- chat: the Vicuna benchmark questions outside its coding and math categories (Apache-2.0,
  LICENSE.fastchat), in SmolLM2's chat format, less those the probes hold aside.
- code: this project's own Python modules (Apache-2.0), cut into function-sized chunks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "optimizer" / "data" / "calibration.jsonl"
CODE_DIRS = ("gateway", "backends", "model_optimizer")


def math_samples(shared: Path, count: int = 240) -> list[dict[str, str]]:
    lines = (shared / "gsm8k_test.jsonl").read_text().splitlines()[:count]
    rows = [json.loads(line) for line in lines]
    return [
        {"category": "math", "text": f"Question: {r['question']}\nAnswer: {r['answer']}"}
        for r in rows
    ]


def probe_ids(prefix: str) -> set[int]:
    """Question ids the precision-check probes use: calibration must not see them."""
    probes = ROOT / "optimizer" / "data" / "probes.jsonl"
    sources = [json.loads(line).get("source", "") for line in probes.open() if line.strip()]
    return {int(s.split(":")[1]) for s in sources if s.startswith(f"{prefix}:")}


def chat_samples(shared: Path) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in (shared / "vicuna_bench_questions.jsonl").open()]
    held_aside = probe_ids("vicuna_bench")
    return [
        {
            "category": "chat",
            "text": f"<|im_start|>user\n{r['turns'][0]}<|im_end|>\n<|im_start|>assistant\n",
        }
        for r in rows
        if r["category"] not in ("coding", "math") and r["question_id"] not in held_aside
    ]


def code_samples(max_chars: int = 1200) -> list[dict[str, str]]:
    samples = []
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).glob("*.py")):
            chunk: list[str] = []
            for line in path.read_text().splitlines():
                if line.startswith(("def ", "class ", "async def ")) and chunk:
                    text = "\n".join(chunk).strip()
                    if len(text) > 200:
                        samples.append({"category": "code", "text": text[:max_chars]})
                    chunk = []
                chunk.append(line)
            text = "\n".join(chunk).strip()
            if len(text) > 200:
                samples.append({"category": "code", "text": text[:max_chars]})
    return samples


def main(shared: Path) -> None:
    rows = math_samples(shared) + chat_samples(shared) + code_samples()
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = {c: sum(r["category"] == c for r in rows) for c in ("chat", "code", "math")}
    print(f"wrote {OUT.relative_to(ROOT)}: {counts}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data")
