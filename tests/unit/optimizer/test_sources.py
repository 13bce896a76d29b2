import json
from pathlib import Path

import pytest

from optimizer.sources import (
    SAMPLING_DEFAULTS,
    SourceError,
    converted_dir,
    describe_source,
    source_fingerprint,
    write_sampling_defaults,
)


def test_missing_path_is_named(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"model not found: .*nope does not exist"):
        describe_source(tmp_path / "nope")


def test_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "weights.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(SourceError, match=r"not a model: .*weights.gguf"):
        describe_source(bogus)


def test_folder_without_config_or_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"has no config.json"):
        describe_source(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SourceError, match=r"has no weights"):
        describe_source(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(SourceError, match=r"corrupt model folder"):
        describe_source(tmp_path)


def test_hf_folder_and_gguf_are_described(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"x")
    assert describe_source(folder).kind == "hf"
    gguf = tmp_path / "Tiny-1B.Q4_0.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    src = describe_source(gguf)
    assert (src.kind, src.name) == ("gguf", "Tiny-1B")


def test_fingerprint_follows_content_not_mtime(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"a" * 100)
    first = source_fingerprint(describe_source(gguf))
    gguf.touch()
    assert source_fingerprint(describe_source(gguf)) == first
    gguf.write_bytes(b"GGUF" + b"b" * 100)
    changed = source_fingerprint(describe_source(gguf))
    assert changed != first
    assert converted_dir(tmp_path, describe_source(gguf)).name == f"m-{changed}-c2"


def test_sampling_defaults_merge_into_generation_config(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text('{"bos_token_id": 1, "temperature": 1.0}')
    write_sampling_defaults(tmp_path, SAMPLING_DEFAULTS["SmolLM2-135M-Instruct"])
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config == {"bos_token_id": 1, "temperature": 0.2, "top_p": 0.9, "do_sample": True}
    write_sampling_defaults(tmp_path / "x", {})  # nothing to write: no file made
    assert not (tmp_path / "x").exists()
