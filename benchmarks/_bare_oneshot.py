"""The baseline: a bare llm-compressor ``oneshot`` + ``save_pretrained`` on the same input.

Run by bench_optimizer.py in the optimize environment: ``python _bare_oneshot.py int4 MODEL OUT``.
Same model (fp32 compute), same calibration texts and token length, same scheme as the
optimizer; no planning, layout, KV config, precision check or atomic write.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("LLM_COMPRESSOR_LOG_LEVEL", "ERROR")
os.environ.setdefault("TQDM_DISABLE", "1")


def main(precision: str, model_dir: str, out: str) -> None:
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimizer.quantize import CalibrationSpec, calibration_dataset

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = calibration_dataset(tokenizer, CalibrationSpec(None, 32, 256, 0))
    if precision == "int4":
        recipe = [
            GPTQModifier(
                config_groups={
                    "g": {
                        "targets": ["Linear"],
                        "weights": {
                            "num_bits": 4,
                            "type": "int",
                            "symmetric": True,
                            "strategy": "group",
                            "group_size": 64,
                        },
                    }
                },
                ignore=["lm_head"],
            )
        ]
    else:
        recipe = [
            SmoothQuantModifier(smoothing_strength=0.8),
            GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]),
        ]
    oneshot(
        model=model,
        dataset=dataset,
        recipe=recipe,
        max_seq_length=256,
        num_calibration_samples=32,
        shuffle_calibration_samples=False,
    )
    model.save_pretrained(out, save_compressed=True)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
