import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from gateway.policy.schema import LimitsPolicy
from gateway.request.tokens.limits import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_VALUE,
    TokenCounter,
    TokenizerError,
    check_limits,
    read_chat_template,
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
SENTENCES = [
    "The capital of France is Paris.",
    "You are a helpful assistant that answers briefly.",
    "system user assistant tool",
    "Write a Python function that adds two numbers.",
    "def add(a, b):\n    return a + b\n",
    "How many apples are left if Tom eats 3 of 12?",
]
# SmolLM2's template shape (ChatML with a default system message), a shorter system text.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_PLAIN = CHATML.replace(
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}", ""
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    """A tiny byte-level BPE trained in memory, with ChatML and Llama 3 special tokens."""
    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS + LLAMA_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 5, trainer)
    return tok


def _exact(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def _chatml(messages: list[dict[str, Any]], system: str | None, generation: bool = True) -> str:
    out = ""
    if system is not None and messages[0]["role"] != "system":
        out += f"<|im_start|>system\n{system}<|im_end|>\n"
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    return out + ("<|im_start|>assistant\n" if generation else "")


CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "Write a Python function that adds two numbers."},
]


# --------------------------------------------------------------------------- counting


def test_count_text(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer)
    text = "The capital of France is Paris."
    assert counter.count_text(text) == len(tokenizer.encode(text).ids) > 0
    assert counter.count_text("") == 0


def test_a_chatml_conversation_counts_as_the_rendered_template(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML)
    assert counter.chat_format(CHATML).family == "chatml"
    rendered = _chatml(CONVERSATION, system="You are a helpful assistant")
    assert counter.count_chat(CONVERSATION) == _exact(tokenizer, rendered)


def test_the_default_system_message_is_counted_when_none_is_given(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML)
    messages = CONVERSATION[1:2]
    with_default = _chatml(messages, system="You are a helpful assistant")
    assert counter.count_chat(messages) == _exact(tokenizer, with_default)
    assert counter.count_chat(messages, CHATML_PLAIN) == _exact(tokenizer, _chatml(messages, None))
    assert counter.count_chat(messages) > counter.count_chat(messages, CHATML_PLAIN)


def test_without_the_generation_prompt(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML_PLAIN)
    rendered = _chatml(CONVERSATION, None, generation=False)
    assert counter.count_chat(CONVERSATION, add_generation_prompt=False) == _exact(
        tokenizer, rendered
    )


def test_content_parts_and_tool_calls(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML_PLAIN)
    parts = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is the capital"},
                {"type": "image_url", "image_url": {"url": "http://x"}},
                {"type": "text", "text": "of France?"},
            ],
        }
    ]
    joined = [{"role": "user", "content": "What is the capital\nof France?"}]
    assert counter.count_chat(parts) == counter.count_chat(joined)
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}],
    }
    empty = {"role": "assistant", "content": ""}
    extra = _exact(tokenizer, "add") + _exact(tokenizer, '{"a": 1, "b": 2}')
    assert counter.count_chat([*joined, call]) == counter.count_chat([*joined, empty]) + extra


def test_a_llama3_template(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, LLAMA3)
    assert counter.chat_format(LLAMA3).family == "llama3"
    rendered = (
        "<|begin_of_text|>"
        + "".join(
            f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
            for m in CONVERSATION
        )
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert counter.count_chat(CONVERSATION) == _exact(tokenizer, rendered)


def test_no_template_counts_a_few_tokens_per_message(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer)
    chat = counter.chat_format(None)
    assert chat.family == "generic"
    content = sum(_exact(tokenizer, m["content"]) for m in CONVERSATION)
    total = counter.count_chat(CONVERSATION)
    assert content + 4 * len(CONVERSATION) <= total <= content + 6 * len(CONVERSATION) + 4


def test_loading_from_a_model_folder(tokenizer: Tokenizer, tmp_path: Path) -> None:
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    counter = TokenCounter.from_model_dir(tmp_path)
    assert counter.chat_template == CHATML
    assert counter.count_chat(CONVERSATION) == TokenCounter(tokenizer, CHATML).count_chat(
        CONVERSATION
    )


def test_the_template_may_live_in_tokenizer_config(tmp_path: Path) -> None:
    assert read_chat_template(tmp_path) is None
    config = {
        "chat_template": [
            {"name": "tool_use", "template": "x"},
            {"name": "default", "template": CHATML},
        ]
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert read_chat_template(tmp_path) == CHATML
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": LLAMA3}))
    assert read_chat_template(tmp_path) == LLAMA3
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"cannot read the chat template"):
        read_chat_template(tmp_path)


def test_a_missing_or_broken_tokenizer_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError) as missing:
        TokenCounter.from_file(tmp_path / "tokenizer.json")
    assert str(missing.value).startswith(f"{tmp_path / 'tokenizer.json'}: cannot load tokenizer:")
    assert "\n" not in str(missing.value)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot load tokenizer"):
        TokenCounter.from_file(tmp_path / "tokenizer.json")


# --------------------------------------------------------------------------- deciding


def _limits(**values: Any) -> LimitsPolicy:
    return LimitsPolicy.model_validate(values)


def test_within_limits_is_ok() -> None:
    decision = check_limits(1000, 500, 2048, _limits(max_input_tokens=1536))
    assert (decision.action, decision.max_tokens, decision.error_code) == ("ok", 500, None)


def test_without_max_tokens_the_room_left_is_given() -> None:
    decision = check_limits(1000, None, 2048, _limits())
    assert (decision.action, decision.max_tokens) == ("ok", 1048)
    capped = check_limits(1000, None, 2048, _limits(max_output_tokens=256))
    assert capped.max_tokens == 256


def test_without_max_tokens_the_policy_default_is_given_within_the_room() -> None:
    policy = _limits(default_max_tokens=512)
    assert check_limits(1000, None, 2048, policy).max_tokens == 512
    assert check_limits(1800, None, 2048, policy).max_tokens == 248  # less room than the default
    assert check_limits(1000, 900, 2048, policy).max_tokens == 900  # asked for: not the default


def test_an_over_long_prompt_is_rejected_like_openai() -> None:
    decision = check_limits(1600, 10, 2048, _limits(max_input_tokens=1536))
    assert decision.action == "reject"
    assert decision.error_code == CONTEXT_LENGTH_EXCEEDED
    assert decision.message == (
        "This gateway accepts at most 1536 prompt tokens. However, your messages resulted in "
        "1600 tokens. Please reduce the length of the messages."
    )


def test_an_over_long_prompt_goes_to_the_long_route_when_the_policy_says_so() -> None:
    policy = _limits(max_input_tokens=1536, on_input_too_long="route_long")
    decision = check_limits(1600, 10, 4096, policy)
    assert decision.action == "route_long"
    assert decision.error_code is None
    # On the long route max_input_tokens no longer applies...
    assert check_limits(1600, 10, 4096, policy, long_route=True).action == "ok"
    # ...but the tier's own length does, and there is no further route.
    beyond = check_limits(5000, 10, 4096, policy, long_route=True)
    assert (beyond.action, beyond.error_code) == ("reject", CONTEXT_LENGTH_EXCEEDED)
    assert beyond.message.startswith("This model's maximum context length is 4096 tokens.")


def test_a_prompt_filling_the_whole_context_is_too_long() -> None:
    decision = check_limits(2048, None, 2048, _limits())
    assert (decision.action, decision.error_code) == ("reject", CONTEXT_LENGTH_EXCEEDED)
    assert check_limits(2047, None, 2048, _limits()).max_tokens == 1


def test_a_tier_prompt_cap() -> None:
    policy = _limits(tier_max_input_tokens={"int4": 512})
    assert check_limits(600, 10, 2048, policy, tier="int8").action == "ok"
    decision = check_limits(600, 10, 2048, policy, tier="int4", long_route=True)
    assert (decision.action, decision.error_code) == ("reject", CONTEXT_LENGTH_EXCEEDED)
    assert decision.message.startswith("This tier accepts at most 512 prompt tokens.")


def test_max_tokens_over_the_room_is_clamped() -> None:
    decision = check_limits(1500, 1000, 2048, _limits(on_max_tokens_too_large="clamp"))
    assert (decision.action, decision.max_tokens, decision.error_code) == ("clamp", 548, None)
    assert decision.message == (
        "max_tokens 1000 lowered to 548 (1500 prompt + 1000 completion tokens > max_model_len 2048)"
    )


def test_max_tokens_over_the_room_is_rejected() -> None:
    decision = check_limits(1500, 1000, 2048, _limits(on_max_tokens_too_large="reject"))
    assert (decision.action, decision.error_code, decision.param) == (
        "reject",
        CONTEXT_LENGTH_EXCEEDED,
        "max_tokens",
    )
    assert decision.message.startswith(
        "This model's maximum context length is 2048 tokens. However, you requested 2500 tokens "
        "(1500 in the messages, 1000 in the completion)."
    )


def test_max_tokens_over_max_output_tokens() -> None:
    clamp = check_limits(100, 900, 2048, _limits(max_output_tokens=512))
    assert (clamp.action, clamp.max_tokens) == ("clamp", 512)
    assert clamp.message.endswith("(max_output_tokens is 512)")
    reject = check_limits(
        100, 900, 2048, _limits(max_output_tokens=512, on_max_tokens_too_large="reject")
    )
    assert (reject.action, reject.error_code, reject.param) == (
        "reject",
        INVALID_VALUE,
        "max_tokens",
    )


def test_max_tokens_below_one_is_rejected() -> None:
    decision = check_limits(10, 0, 2048, _limits())
    assert (decision.action, decision.error_code, decision.param) == (
        "reject",
        INVALID_VALUE,
        "max_tokens",
    )


class Recording:
    """Wraps a tokenizer and records how many characters it was asked to encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer, self.chars = tokenizer, 0

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        self.chars += len(text)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("text", ["The capital of France is Paris. " * 30_000, " " * 1_000_000])
def test_counting_with_a_limit_stops_early_past_it(tokenizer: Tokenizer, text: str) -> None:
    # Tokenizing a 1 MB prompt took ~0.5 s of the event loop; past the largest context the
    # exact count is of no use, so the work is bounded by the limit, not by the body.
    recording = Recording(tokenizer)
    counter = TokenCounter(recording, CHATML)  # type: ignore[arg-type]
    assert counter.count_text(text, limit=100) > 100
    assert recording.chars < 100_000
    recording.chars = 0
    messages = [{"role": "user", "content": text}] * 3
    assert counter.count_chat(messages, limit=100) > 100
    assert recording.chars < 100_000
    many = [{"role": "user", "content": "hi"}] * 50_000
    assert counter.count_chat(many, limit=100) > 100
    assert recording.chars < 100_000


def test_counting_with_a_limit_is_exact_within_it(tokenizer: Tokenizer) -> None:
    counter = TokenCounter(tokenizer, CHATML)
    text = " ".join(SENTENCES) * 4
    exact = counter.count_text(text)
    for limit in (exact, exact + 1, 10 * exact):
        assert counter.count_text(text, limit=limit) == exact
    assert counter.count_text(text, limit=exact - 1) > exact - 1
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
    exact_chat = counter.count_chat(messages)
    assert counter.count_chat(messages, limit=exact_chat) == exact_chat
    assert counter.count_chat(messages, limit=exact_chat - 1) > exact_chat - 1
