"""The shared operator-YAML loader: one-line errors naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from common.operator_yaml import (
    MAX_BYTES,
    OperatorYamlError,
    Section,
    compose_yaml,
    dotted,
    line_of,
    load_model,
    parse_model,
)


class LoaderError(OperatorYamlError):
    pass


class Port(Section):
    name: str
    number: int = Field(strict=True, ge=1024)


class Limits(Section):
    max_tokens: int = 16
    max_requests: int = 4


class Server(Section):
    host: str = "127.0.0.1"
    limits: Limits = Field(default_factory=Limits)
    ports: list[Port] = Field(default_factory=list)


GOOD = """\
host: 127.0.0.1
limits:
  max_tokens: 32
ports:
  - name: api
    number: 8000
  - name: admin
    number: 8001
"""


def _error(text: str, *, suggest: bool = False) -> str:
    with pytest.raises(LoaderError) as info:
        parse_model(text, "s.yaml", Server, LoaderError, suggest=suggest)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_good_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD, encoding="utf-8")
    server = load_model(path, Server, "server file", LoaderError)
    assert server.limits.max_tokens == 32
    assert [p.number for p in server.ports] == [8000, 8001]


def test_an_empty_file_is_all_defaults() -> None:
    assert parse_model("", "s.yaml", Server, LoaderError) == Server()


def test_a_bad_value_names_its_line_and_dotted_field() -> None:
    text = GOOD.replace("number: 8001", "number: 80")
    assert _error(text) == (
        "s.yaml:8: ports[1].number: Input should be greater than or equal to 1024"
    )


def test_a_missing_field_points_at_its_section() -> None:
    text = "host: h\nports:\n  - number: 8000\n"
    assert _error(text) == "s.yaml:3: ports[0].name: required field is missing"


def test_more_problems_are_counted() -> None:
    text = "ports:\n  - {number: 1}\n  - {number: 2}\n"
    assert _error(text).endswith("(and 3 more problems)")


def test_unknown_keys_list_the_allowed_fields() -> None:
    text = "limits:\n  max_token: 8\n"
    assert _error(text) == (
        "s.yaml:2: limits.max_token: unknown field (allowed: max_tokens, max_requests)"
    )
    assert _error("surprise: 1\n") == (
        "s.yaml:1: surprise: unknown field (allowed: host, limits, ports)"
    )


def test_unknown_keys_can_suggest_the_closest_field() -> None:
    text = "limits:\n  max_token: 8\n"
    assert _error(text, suggest=True) == (
        "s.yaml:2: limits.max_token: unknown field (did you mean max_tokens?)"
    )
    assert _error("zzz: 1\n", suggest=True).startswith("s.yaml:1: zzz: unknown field (allowed: ")


def test_a_duplicate_key_is_refused() -> None:
    text = "limits:\n  max_tokens: 8\n  max_tokens: 9\n"
    assert _error(text) == "s.yaml:3: limits.max_tokens: duplicate key"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("host: h\nlimits: [unclosed\n", 3),
        ("host: h\n  bad: indent\n", 2),
        ("\tport: 1\n", 1),
    ],
)
def test_a_file_that_is_not_yaml_names_its_line(text: str, line: int) -> None:
    assert _error(text).startswith(f"s.yaml:{line}: invalid YAML: ")


def test_a_top_level_that_is_not_a_mapping_is_one_line() -> None:
    assert _error("- a\n- b\n").startswith("s.yaml:1: (top level): ")


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LoaderError) as info:
        load_model(tmp_path / "absent.yaml", Server, "server file", LoaderError)
    assert str(info.value) == (
        f"{tmp_path / 'absent.yaml'}: cannot read server file: No such file or directory"
    )


def test_a_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"host: \xff\xfe\n")
    with pytest.raises(LoaderError) as info:
        load_model(path, Server, "server file", LoaderError)
    assert str(info.value).startswith(f"{path}: cannot read server file: ")
    assert "\n" not in str(info.value)


def test_dotted_and_line_of() -> None:
    assert dotted(()) == "(top level)"
    assert dotted(("ports", 1, "number")) == "ports[1].number"
    assert line_of(None, ("ports",)) == 1


@pytest.mark.parametrize("text", ["limits: " + "[" * 5000, "limits: " + "[" * 5000 + "]" * 5000])
def test_a_file_nested_too_deeply_is_one_line(text: str) -> None:
    # PyYAML composes recursively: a deep file must be refused, not raise RecursionError.
    assert _error(text) == "s.yaml:1: invalid YAML: nested too deeply"


def test_an_alias_bomb_is_refused_at_its_first_alias() -> None:
    # 360 bytes, 9**6 nodes once expanded: the duplicate-key walk took 1.3 s (8 levels: 17 s,
    # 10 levels: ~25 min) of whoever parsed it, the gateway's event loop on a policy reload.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 7)]
    with pytest.raises(LoaderError) as info:
        compose_yaml("\n".join(lines) + "\n", "s.yaml", LoaderError)
    assert str(info.value) == (
        "s.yaml:2: invalid YAML: alias *a0: YAML aliases are not allowed in operator files"
        " (write the value out)"
    )


def test_an_alias_and_a_merge_of_one_are_refused() -> None:
    text = "host: &h example\nlimits:\n  max_tokens: 8\nports:\n  - name: *h\n    number: 8000\n"
    assert _error(text).startswith("s.yaml:5: invalid YAML: alias *h: ")
    merged = "base: &b {max_tokens: 8}\nlimits:\n  <<: *b\n"
    assert _error(merged).startswith("s.yaml:3: invalid YAML: alias *b: ")
    # An anchor no alias uses costs nothing: it is left alone.
    assert parse_model("host: &h example\n", "s.yaml", Server, LoaderError).host == "example"


def test_a_file_over_1_mib_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(GOOD + "# " + "x" * MAX_BYTES + "\n", encoding="utf-8")
    with pytest.raises(LoaderError) as info:
        load_model(path, Server, "server file", LoaderError)
    assert str(info.value) == (
        f"{path}: cannot read server file: larger than 1,048,576 bytes (the bound on an"
        " operator file)"
    )
    path.write_text(GOOD + "# " + "x" * (MAX_BYTES - len(GOOD) - 3) + "\n", encoding="utf-8")
    assert load_model(path, Server, "server file", LoaderError).limits.max_tokens == 32


def test_a_text_over_the_bound_is_refused_unparsed() -> None:
    assert _error(GOOD + "# " + "x" * MAX_BYTES + "\n") == (
        "s.yaml:1: larger than 1,048,576 characters (the bound on an operator file)"
    )
