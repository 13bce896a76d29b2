"""prompts: exact token counts by the tokenizer, fixed by the seed."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from measure.prompts import PromptError, corpus_texts, load_tokenizer, make_prompts


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A small byte-level BPE trained on the calibration text (like SmolLM2's kind)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus_texts()[:100], trainer)
    return tok


def test_every_prompt_has_exactly_the_length(tokenizer: Tokenizer) -> None:
    for length in (1, 32, 257):
        prompts = make_prompts(tokenizer, 5, length, seed=0)
        assert len(prompts) == 5
        for p in prompts:
            assert p.tokens == length
            assert len(tokenizer.encode(p.text, add_special_tokens=False).ids) == length


def test_same_seed_same_prompts_other_seed_other_prompts(tokenizer: Tokenizer) -> None:
    first = make_prompts(tokenizer, 4, 64, seed=7)
    assert make_prompts(tokenizer, 4, 64, seed=7) == first
    assert make_prompts(tokenizer, 4, 64, seed=8) != first
    assert len({p.text for p in first}) == 4


def test_too_little_text_is_a_prompt_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(PromptError, match="too few"):
        make_prompts(tokenizer, 1, 500, seed=0, texts=["only a few words here"])


def test_load_tokenizer_needs_a_tokenizer_json(tmp_path: Path, tokenizer: Tokenizer) -> None:
    with pytest.raises(PromptError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(tmp_path).get_vocab_size() == tokenizer.get_vocab_size()
    assert load_tokenizer(tmp_path / "tokenizer.json").get_vocab_size() > 0


def test_special_tokens_in_the_text_keep_their_count(tokenizer: Tokenizer) -> None:
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.add_special_tokens(["<|im_start|>"])
    texts = ["<|im_start|>user\nHow many eggs? " * 40]
    prompts = make_prompts(tok, 20, 24, seed=1, texts=texts)
    assert any("<|im_start|>" in p.text for p in prompts)
    for p in prompts:
        assert len(tok.encode(p.text, add_special_tokens=False).ids) == 24
