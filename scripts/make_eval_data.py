"""Regenerate measure/data/: the held-aside evaluation texts and the labeled routing set.

Deterministic: ``$(python3 -m model_optimizer.envs path gateway)/bin/python
scripts/make_eval_data.py [SHARED_DATA] [--tokenizer PATH/tokenizer.json]``
(the tokenizer sizes the ``long`` prompts; default: the default model's fp16 variant's).

- ``gsm8k_eval.jsonl``: GSM8K test lines 241-340 (calibration takes lines 1-240, the
  precision-check probes lines 1301-1319), unchanged (MIT, LICENSE.gsm8k).
- ``vicuna_bench_questions.jsonl``: the 80 Vicuna benchmark questions, unchanged
  (Apache-2.0, LICENSE.fastchat).
- ``routing_prompts.jsonl``: every Vicuna question's first turn labeled by its category
  (coding -> code, math -> math, every other -> tolerant), then ``LONG_PROMPTS`` prompts
  labeled ``long``: a fixed instruction followed by GSM8K test questions from line 1001 on,
  concatenated until the prompt has ``LONG_TOKENS`` tokens (between the policy's
  ``long.min_tokens``, 1,024, and ``limits.max_input_tokens``, 1,536).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "measure" / "data"
GSM8K_LINES = (241, 340)  # 1-based, inclusive
LONG_FIRST_LINE = 1001
LONG_PROMPTS = 3
LONG_TOKENS = 1200
LONG_INSTRUCTION = "Summarize the following word problems in three sentences.\n\n"
LABELS = {"coding": "code", "math": "math"}


def _default_tokenizer() -> Path:
    sys.path.insert(0, str(ROOT))
    from model_optimizer.envs import cache_root

    return cache_root() / "variants" / "SmolLM2-135M-Instruct" / "fp16" / "tokenizer.json"


def long_prompts(questions: list[str], tokenizer_path: Path) -> list[str]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    prompts, at = [], 0
    for _ in range(LONG_PROMPTS):
        text = LONG_INSTRUCTION
        while len(tokenizer.encode(text, add_special_tokens=False).ids) < LONG_TOKENS:
            text += questions[at] + "\n\n"
            at += 1
        prompts.append(text.rstrip("\n"))
    return prompts


def main(shared: Path, tokenizer_path: Path) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    gsm = (shared / "gsm8k_test.jsonl").read_text(encoding="utf-8").splitlines()
    first, last = GSM8K_LINES
    (OUT / "gsm8k_eval.jsonl").write_text("\n".join(gsm[first - 1 : last]) + "\n", "utf-8")
    vicuna = (shared / "vicuna_bench_questions.jsonl").read_text(encoding="utf-8")
    (OUT / "vicuna_bench_questions.jsonl").write_text(vicuna, "utf-8")
    rows = [json.loads(line) for line in vicuna.splitlines() if line.strip()]
    labeled = [
        {"prompt": r["turns"][0], "label": LABELS.get(r["category"], "tolerant")} for r in rows
    ]
    questions = [json.loads(line)["question"] for line in gsm[LONG_FIRST_LINE - 1 :]]
    labeled += [{"prompt": p, "label": "long"} for p in long_prompts(questions, tokenizer_path)]
    with (OUT / "routing_prompts.jsonl").open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in labeled)
    print(f"wrote {OUT.relative_to(ROOT)}: {last - first + 1} GSM8K, {len(labeled)} labeled")


if __name__ == "__main__":
    args = sys.argv[1:]
    tok = _default_tokenizer()
    if "--tokenizer" in args:
        i = args.index("--tokenizer")
        tok = Path(args[i + 1])
        del args[i : i + 2]
    main(Path(args[0]) if args else ROOT.parent / "shared" / "data", tok)
