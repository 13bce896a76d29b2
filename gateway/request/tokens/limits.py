"""Length limits: count prompt tokens with the model's tokenizer, then decide what to do (pure).

``TokenCounter`` wraps a ``tokenizers.Tokenizer`` loaded from the variant's ``tokenizer.json``
(the only I/O here is loading it and the chat template). ``check_limits`` is a pure function of
the counts, the tier's ``max_model_len`` and the policy's ``limits`` section.

Counting chat messages applies the chat template approximately, without a Jinja engine (the
gateway environment has none): each message's content is tokenized on its own and a fixed
overhead is added per message, derived from the template's markers:

- ChatML (``<|im_start|>``, SmolLM2, Qwen): ``<|im_start|>{role}\\n`` + ``<|im_end|>\\n``
  around each message, ``<|im_start|>assistant\\n`` for the generation prompt, and the default
  system message the template inserts when the first message is not a system one (found as
  the literal ``<|im_start|>system\\n...<|im_end|>`` in the template);
- Llama 3 (``<|start_header_id|>``): ``<|start_header_id|>{role}<|end_header_id|>\\n\\n`` +
  ``<|eot_id|>`` per message, ``<|begin_of_text|>`` once;
- anything else (or no template): the role's tokens + 3 per message, the assistant role's + 2
  for the generation prompt, a guess in the spirit of OpenAI's "about 4 tokens a message".

For ChatML templates this is exact when token merges do not cross a content boundary (a
content starting or ending with whitespace may differ by a token or two); tool calls count
their function names and arguments only. A request's ``tools`` are counted as their JSON
(gateway/request/tokens/prompt_count.py's ``count_prompt``), about as a chat template renders them.

Counting is bounded work whatever the prompt's length: given a ``limit`` (the gateway passes the
longest context of its tiers), a count is exact up to ``limit`` and stops early past it,
returning some number above ``limit``. A long text is then tokenized in pieces, the first of
``_piece_chars(limit)`` characters and each next one twice as long, cut before a space where
one is near; the pieces' counts (less two per cut, for a word split in two) are summed until
they pass ``limit``; a text whose pieces never pass it is counted again whole, exactly. So the
work is bounded by the limit times the characters of the tokenizer's longest token, not by the
body (a 1 MB prompt took ~0.5 s of the event loop to count in full; now some 10-90 ms).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tokenizers import Tokenizer

from gateway.policy.schema import LimitsPolicy
from gateway.request.tokens.count_cache import CountCache
from gateway.request.tokens.prompt_bound import byte_level, message_texts, utf8_length

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
INVALID_VALUE = "invalid_value"
Action = Literal["ok", "reject", "route_long", "clamp"]
_CHATML_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


class TokenizerError(ValueError):
    """A tokenizer or chat template that cannot be loaded; the message is one line."""


# --------------------------------------------------------------------------- counting


@dataclass(frozen=True)
class ChatFormat:
    """Token overheads of one chat template (see the module docstring)."""

    family: Literal["chatml", "llama3", "generic"]
    role_overheads: Mapping[str, int]  # tokens around a message's content, per role
    default_overhead: int  # for a role not in role_overheads
    generation_prompt: int  # tokens that open the assistant's answer
    default_system: int  # tokens of the system message added when none is given (0: none)
    begin: int  # tokens once at the start (a BOS the template writes)

    def overhead(self, role: str) -> int:
        return self.role_overheads.get(role, self.default_overhead)


class TokenCounter:
    """Counts prompt tokens as the model's tokenizer does (chat template applied roughly)."""

    def __init__(
        self, tokenizer: Tokenizer, chat_template: str | None = None, cache_chars: int = 4_000_000
    ) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self._formats: dict[str | None, ChatFormat] = {}
        self.cache = CountCache(cache_chars)  # a conversation's history is counted once
        self._byte_level: bool | None = None  # prompt_bound.byte_level, found on first use

    @property
    def tokenizer(self) -> Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tokenizer

    @classmethod
    def from_file(
        cls, tokenizer_json: str | Path, chat_template: str | None = None
    ) -> TokenCounter:
        """Load ``tokenizer.json``; ``TokenizerError`` naming the file when it cannot be."""
        path = Path(tokenizer_json)
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise TokenizerError(f"{path}: cannot load tokenizer: {reason}") from None
        return cls(tokenizer, chat_template)

    @classmethod
    def from_model_dir(cls, folder: str | Path) -> TokenCounter:
        """A model or variant folder: its ``tokenizer.json`` and chat template."""
        folder = Path(folder)
        return cls.from_file(folder / "tokenizer.json", read_chat_template(folder))

    def count_text(self, text: str, limit: int | None = None) -> int:
        """Tokens of a completions prompt (special tokens added as the tokenizer says); with
        ``limit``, exact up to it and some number above it past it (see the module docstring)."""
        return self._bounded(text, limit, special=True)

    def count_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        chat_template: str | None = None,
        *,
        add_generation_prompt: bool = True,
        limit: int | None = None,
    ) -> int:
        """Tokens of ``messages`` rendered by ``chat_template`` (default: the counter's); with
        ``limit``, exact up to it and some number above it past it (counting stops there)."""
        chat = self.chat_format(chat_template if chat_template is not None else self.chat_template)
        total = chat.begin
        if not messages or messages[0].get("role") != "system":
            total += chat.default_system
        for message in messages:
            role = message.get("role")
            total += chat.overhead(role if isinstance(role, str) else "")
            for piece in message_texts(message):
                total += self._bounded(piece, limit) if piece else 0
                if limit is not None and total > limit:
                    return total
        return total + (chat.generation_prompt if add_generation_prompt else 0)

    def bound_text(self, text: str) -> int | None:
        """At least what ``count_text`` finds, without tokenizing (gateway/request/
        prompt_bound.py); ``None`` when the tokenizer is not a byte-level BPE or the text is
        not valid UTF-8 (a lone surrogate: the count refuses it)."""
        if not self._bytes_bound_tokens():
            return None
        with suppress(UnicodeEncodeError):
            return utf8_length(text) + self._tokenizer.num_special_tokens_to_add(False)
        return None

    def bound_chat(self, messages: Sequence[Mapping[str, Any]]) -> int | None:
        """At least what ``count_chat`` finds (default template), without tokenizing."""
        if not self._bytes_bound_tokens():
            return None
        chat = self.chat_format(self.chat_template)
        total = chat.begin + chat.generation_prompt
        if not messages or messages[0].get("role") != "system":
            total += chat.default_system
        with suppress(UnicodeEncodeError):
            for message in messages:
                role = message.get("role")
                total += chat.overhead(role if isinstance(role, str) else "")
                total += sum(utf8_length(piece) for piece in message_texts(message))
            return total
        return None

    def _bytes_bound_tokens(self) -> bool:
        if self._byte_level is None:
            self._byte_level = byte_level(self._tokenizer)
        return self._byte_level

    def chat_format(self, chat_template: str | None) -> ChatFormat:
        """The overheads of ``chat_template``, derived once per template."""
        chat = self._formats.get(chat_template)
        if chat is None:
            chat = derive_chat_format(chat_template, self._count)
            self._formats[chat_template] = chat
        return chat

    def _count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    def _bounded(self, text: str, limit: int | None, *, special: bool = False) -> int:
        """Tokens of ``text``: exact up to ``limit``, some number above it past it (an exact
        count is kept in the cache, the pieces' sum of a text over the limit is not)."""
        cached = self.cache.get(text, special)
        if cached is not None:
            return cached
        encode = self._tokenizer.encode
        size = _piece_chars(limit) if limit is not None else 0
        if limit is not None and len(text) > size:
            total, start = 0, 0
            while start < len(text):
                end = _cut(text, start, start + size)
                size *= 2
                # The special tokens are added once, with the first piece.
                total += len(encode(text[start:end], add_special_tokens=special and not start).ids)
                start = end
                if start < len(text):
                    total -= 2  # the next piece may start inside a word of this one
                if total > limit:
                    return total
        count = len(encode(text, add_special_tokens=special).ids)
        self.cache.put(text, special, count)
        return count


def _piece_chars(limit: int) -> int:
    """Characters of the first piece of a text counted up to ``limit`` tokens: a text denser
    than one token per 2 characters is known to be over the limit after it."""
    return 2 * (limit + 1) + 1024


def _cut(text: str, start: int, end: int) -> int:
    """Where to end the piece ``text[start:end]``: before its last space in the second half,
    so that words (and a space's word) stay whole; else at ``end``."""
    if end >= len(text):
        return len(text)
    space = text.rfind(" ", (start + end) // 2, end)
    return space if space > start else end


def derive_chat_format(template: str | None, count: Any) -> ChatFormat:
    """Overheads of ``template`` given ``count(text) -> tokens`` (see the module docstring)."""
    roles = ("system", "user", "assistant", "tool")
    text = (template or "").replace("\\n", "\n")
    if "<|im_start|>" in text:

        def chatml(role: str) -> int:
            return int(count(f"<|im_start|>{role}\n") + count("<|im_end|>\n"))

        found = _CHATML_SYSTEM.search(text)
        system = chatml("system") + int(count(found.group(1))) if found else 0
        return ChatFormat(
            family="chatml",
            role_overheads={role: chatml(role) for role in roles},
            default_overhead=chatml("user"),
            generation_prompt=int(count("<|im_start|>assistant\n")),
            default_system=system,
            begin=int(count("<|begin_of_text|>")) if "bos_token" in text else 0,
        )
    if "<|start_header_id|>" in text:

        def llama3(role: str) -> int:
            header = f"<|start_header_id|>{role}<|end_header_id|>\n\n"
            return int(count(header) + count("<|eot_id|>"))

        return ChatFormat(
            family="llama3",
            role_overheads={role: llama3(role) for role in roles},
            default_overhead=llama3("user"),
            generation_prompt=int(count("<|start_header_id|>assistant<|end_header_id|>\n\n")),
            default_system=0,
            begin=int(count("<|begin_of_text|>")),
        )
    return ChatFormat(
        family="generic",
        role_overheads={role: int(count(role)) + 3 for role in roles},
        default_overhead=4,
        generation_prompt=int(count("assistant")) + 2,
        default_system=0,
        begin=0,
    )


def read_chat_template(folder: str | Path) -> str | None:
    """The chat template of a model folder: ``chat_template.jinja``, else the
    ``chat_template`` of ``tokenizer_config.json`` (the ``default`` one of a list); ``None``."""
    folder = Path(folder)
    jinja = folder / "chat_template.jinja"
    try:
        if jinja.is_file():
            return jinja.read_text(encoding="utf-8")
        config_path = folder / "tokenizer_config.json"
        if not config_path.is_file():
            return None
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TokenizerError(f"{folder}: cannot read the chat template: {exc}") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


# --------------------------------------------------------------------------- deciding


@dataclass(frozen=True)
class LimitDecision:
    """What to do with a request on one tier.

    ``ok``: send it with ``max_tokens``; ``clamp``: send it with the lowered ``max_tokens``;
    ``route_long``: route it again with class ``long``; ``reject``: answer 400 with
    ``error_code`` (``param`` names the offending field when it is ``max_tokens``; for the
    prompt it is ``messages`` or ``prompt``, which the caller knows).
    """

    action: Action
    max_tokens: int  # what to send (the room left when the client gave none); 0 on reject
    error_code: str | None
    message: str
    param: str | None = None


def check_limits(
    input_tokens: int,
    max_tokens: int | None,
    tier_max_model_len: int,
    policy: LimitsPolicy,
    *,
    tier: str | None = None,
    long_route: bool = False,
) -> LimitDecision:
    """Check a prompt of ``input_tokens`` asking for ``max_tokens`` against a tier.

    ``tier`` names the tier (for ``tier_max_input_tokens``); ``long_route`` says the request
    already goes by the long route, where ``max_input_tokens`` no longer applies and
    ``route_long`` is not offered again.
    """
    if max_tokens is not None and max_tokens < 1:
        message = f"max_tokens must be at least 1, got {max_tokens}"
        return LimitDecision("reject", 0, INVALID_VALUE, message, "max_tokens")
    room = tier_max_model_len - input_tokens
    cap = policy.tier_input_cap(tier)
    if room < 1 or (cap is not None and input_tokens > cap):
        if room < 1:
            what = f"This model's maximum context length is {tier_max_model_len} tokens"
        else:
            what = f"This tier accepts at most {cap} prompt tokens"
        return _too_long(input_tokens, what, policy, long_route)
    if not long_route:
        over = check_prompt(input_tokens, policy)
        if over is not None:
            return over

    allowed = room if policy.max_output_tokens is None else min(room, policy.max_output_tokens)
    if max_tokens is None:
        default = policy.default_max_tokens
        given = allowed if default is None else min(allowed, default)
        return LimitDecision("ok", given, None, f"max_tokens not given: up to {given}")
    if max_tokens <= allowed:
        return LimitDecision("ok", max_tokens, None, f"max_tokens {max_tokens} <= {allowed}")
    why = (
        f"{input_tokens} prompt + {max_tokens} completion tokens > max_model_len "
        f"{tier_max_model_len}"
        if max_tokens > room
        else f"max_output_tokens is {policy.max_output_tokens}"
    )
    if policy.on_max_tokens_too_large == "clamp":
        return LimitDecision(
            "clamp", allowed, None, f"max_tokens {max_tokens} lowered to {allowed} ({why})"
        )
    if max_tokens > room:
        message = (
            f"This model's maximum context length is {tier_max_model_len} tokens. However, you "
            f"requested {input_tokens + max_tokens} tokens ({input_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
        return LimitDecision("reject", 0, CONTEXT_LENGTH_EXCEEDED, message, "max_tokens")
    message = (
        f"max_tokens is too large: {max_tokens}. This model supports at most "
        f"{allowed} completion tokens, whereas you provided {max_tokens}."
    )
    return LimitDecision("reject", 0, INVALID_VALUE, message, "max_tokens")


def check_prompt(input_tokens: int, policy: LimitsPolicy) -> LimitDecision | None:
    """The gateway-wide prompt limit (``max_input_tokens``), whatever the tier: ``None`` when
    the prompt is within it, else a ``reject`` or ``route_long`` decision."""
    limit = policy.max_input_tokens
    if limit is None or input_tokens <= limit:
        return None
    return _too_long(input_tokens, f"This gateway accepts at most {limit} prompt tokens", policy)


def _too_long(
    input_tokens: int, what: str, policy: LimitsPolicy, long_route: bool = False
) -> LimitDecision:
    if not long_route and policy.on_input_too_long == "route_long":
        message = f"{what}; {input_tokens} prompt tokens go by the long route"
        return LimitDecision("route_long", 0, None, message)
    message = (
        f"{what}. However, your messages resulted in {input_tokens} tokens. Please reduce the "
        "length of the messages."
    )
    return LimitDecision("reject", 0, CONTEXT_LENGTH_EXCEEDED, message)
