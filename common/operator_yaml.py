"""Operator YAML: read a file, parse it, validate it into a pydantic model; one-line errors.

Shared by the recipe (optimizer/recipe.py), the deployment spec (backends/spec.py), the routing
policy (gateway/policy/schema.py) and the gateway config (gateway/config.py). Each of them keeps
only its models and raises its own error class, a subclass of ``OperatorYamlError``.

Every problem is one line, ``<file>:<line>: <dotted.field>: <message>``; the line is found by
walking the YAML node tree along the field's path (the nearest enclosing key when the field
itself is absent). A file that cannot be read is ``<file>: cannot read <what>: <reason>``.
Standard library + pydantic + pyyaml only, so it imports in every environment.

Bounded work, whoever edits the file (a policy is reloaded while the gateway serves): a file
is at most ``MAX_BYTES`` (1 MiB, a Kubernetes ConfigMap's own limit), read no further than
that; YAML aliases (``*name``, and so ``<<: *name`` merges) are refused where the parser meets
them, so the node tree is a tree, parsed once, and every walk over it is linear in the file (a
~400-byte file of nested aliases expanded to millions of nodes: seconds to minutes).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

Loc = tuple[str | int, ...]
ModelT = TypeVar("ModelT", bound=BaseModel)
ErrorT = TypeVar("ErrorT", bound="OperatorYamlError")
MAX_BYTES = 1 << 20  # an operator file's bound, in bytes (and in characters for text)


class OperatorYamlError(ValueError):
    """An operator file that cannot be used; ``str()`` is one line naming file, line and field."""


class Section(BaseModel):
    """A part of an operator file: unknown fields are rejected, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- the whole path


def load_model(
    path: str | Path,
    model: type[ModelT],
    what: str,
    error: type[OperatorYamlError],
    *,
    suggest: bool = False,
) -> ModelT:
    """Read ``path`` and validate it as ``model``; ``error`` (one line) on any problem.

    ``what`` names the file's kind in read errors ("recipe"); ``suggest``: name the closest
    allowed field for an unknown one ("did you mean ...?") instead of listing them all.
    """
    path = Path(path)
    return parse_model(read_text(path, what, error), str(path), model, error, suggest=suggest)


def parse_model(
    text: str,
    source: str,
    model: type[ModelT],
    error: type[OperatorYamlError],
    *,
    suggest: bool = False,
) -> ModelT:
    """Validate YAML ``text`` as ``model``; ``source`` is the file named in errors."""
    root, data = compose_yaml(text, source, error)
    return validate(model, data, root, source, error, suggest=suggest)


# --------------------------------------------------------------------------- the steps


def read_text(path: Path, what: str, error: type[OperatorYamlError]) -> str:
    """The file's text; ``error("<path>: cannot read <what>: <reason>")`` when it cannot be."""
    try:
        return read_bytes(path, what, error).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: cannot read {what}: {exc}") from None


def read_bytes(path: Path, what: str, error: type[OperatorYamlError]) -> bytes:
    """The file's bytes, at most ``MAX_BYTES`` of them (a bigger file is an error, read no
    further); ``error("<path>: cannot read <what>: <reason>")`` when it cannot be read."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: cannot read {what}: {_too_big('bytes')}")
    return data


def compose_yaml(
    text: str, source: str, error: type[OperatorYamlError]
) -> tuple[yaml.Node | None, Any]:
    """Parse YAML into its node tree (for error lines) and its data, in one pass.

    Syntax errors, aliases, duplicate keys, a text over ``MAX_BYTES`` characters and nesting
    too deep for PyYAML's recursive composer raise ``error`` with one line:
    ``source:line: ...``.
    """
    if len(text) > MAX_BYTES:
        raise error(f"{source}:1: {_too_big('characters')}")
    loader = _NoAliasLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
        if root is not None:
            _reject_duplicate_keys(root, (), source, error)
    except RecursionError:
        raise error(f"{source}:1: invalid YAML: nested too deeply") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise error(f"{source}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}:1: invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return root, data


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses an alias where it meets one (before any expansion)."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor}: YAML aliases are not allowed in operator files"
                " (write the value out)",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _too_big(unit: str) -> str:
    return f"larger than {MAX_BYTES:,} {unit} (the bound on an operator file)"


def validate(
    model: type[ModelT],
    data: Any,
    root: yaml.Node | None,
    source: str,
    error: type[OperatorYamlError],
    *,
    suggest: bool = False,
    yaml_loc: Callable[[Loc], Loc] | None = None,
) -> ModelT:
    """``data`` (``None``: an empty file) as ``model``; the first problem raised as ``error``.

    ``yaml_loc`` maps a field's path in the model to its path in the file, where they differ.
    """
    try:
        return model.model_validate({} if data is None else data)
    except ValidationError as exc:
        loc, message = first_problem(exc, model, suggest=suggest)
        raise located(error, source, root, yaml_loc(loc) if yaml_loc else loc, message) from None


def located(
    error: type[ErrorT], source: str, root: yaml.Node | None, loc: Loc, message: str
) -> ErrorT:
    """``error("<source>:<line>: <dotted.loc>: <message>")``, the line found under ``root``."""
    return error(f"{source}:{line_of(root, loc)}: {dotted(loc)}: {message}")


def first_problem(
    exc: ValidationError, model: type[BaseModel], *, suggest: bool = False
) -> tuple[Loc, str]:
    """The first error's path in ``model`` and its message, with ``(and N more problems)``."""
    error = exc.errors(include_url=False)[0]
    loc: Loc = tuple(
        part
        for part in error["loc"]
        if not (isinstance(part, str) and (part == "[key]" or part.startswith("function-")))
    )
    if error["type"] == "extra_forbidden":
        allowed = fields_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1) if suggest and loc else []
        hint = f"did you mean {close[0]}?" if close else f"allowed: {', '.join(allowed) or '-'}"
        message = f"unknown field ({hint})"
    elif error["type"] == "missing":
        message = "required field is missing"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    more = exc.error_count() - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return loc, message + suffix


# --------------------------------------------------------------------------- paths and lines


def dotted(loc: Sequence[str | int]) -> str:
    """``("tiers", 2, "port")`` → ``tiers[2].port``; ``()`` → ``(top level)``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def line_of(root: yaml.Node | None, loc: Sequence[str | int]) -> int:
    """1-based line of the key at ``loc``; the deepest existing ancestor's line otherwise."""
    if root is None:
        return 1
    node: yaml.Node = root
    line = root.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if str(key_node.value) == str(part):
                    line, child = key_node.start_mark.line + 1, value_node
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part >= 0:
            child = node.value[part] if part < len(node.value) else None
            line = child.start_mark.line + 1 if child is not None else line
        if child is None:
            break
        node = child
    return line


def fields_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the section found by following ``loc`` from ``model`` ([] if none)."""
    annotation: Any = model
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) in (list, dict):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` and ``X | None`` → ``X``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _reject_duplicate_keys(
    node: yaml.Node, path: Loc, source: str, error: type[OperatorYamlError]
) -> None:
    # PyYAML keeps the last of two equal keys silently; in an operator file that hides a mistake.
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise error(f"{source}:{line}: {dotted((*path, key))}: duplicate key")
            seen.add(key)
            _reject_duplicate_keys(value_node, (*path, key), source, error)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _reject_duplicate_keys(item, (*path, index), source, error)
