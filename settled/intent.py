"""Intent keys (rule 21): an operation's ``action_key`` makes the action id from the
business arguments, so that one intent reaches one record whoever asks for it.

A model mints a new call id on every turn, and may mint a new ``action_id`` too; a
resumed graph re-runs its node; a second framework knows nothing of the first. With
``action_key = "receipt-{order_id}"`` every one of them that means "the receipt for
order 42" reaches the action ``receipt-42``: the same params return that record and
send nothing, other params under the same key are a conflict.

The template is literal text with placeholders: ``{order_id}`` names a top-level
param, ``{customer.id}`` one inside an object; ``{{`` and ``}}`` are literal braces.
A value substituted is a string or a whole number, never empty, and the id made must
itself be a valid action id (``settled.model.check_action_id``). Two placeholders
always stand apart, and a value with another placeholder after it never holds the
first character of the text that follows it, so that two different sets of values
can never make the same id (the last value may hold anything)::

    "order-{order}-line-{line}"  order="7-line-2", line="3"  -> refused (holds "-")
    "{a}{b}"                                                  -> refused at load

The template is checked when the config is loaded: a reference must name a param
the operation's params schema knows (when it declares properties).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .errors import ConfigError, InvalidInput
from .model import action_id_problem

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
SAMPLE = "x"  # what a placeholder stands for when the literal text is checked


@dataclass(frozen=True)
class Ref:
    """One placeholder: a param, by its path (``("customer", "id")``)."""

    path: tuple[str, ...]

    @property
    def name(self) -> str:
        return ".".join(self.path)


@dataclass(frozen=True)
class ActionKey:
    """A parsed ``action_key``: literal text and placeholders, in order."""

    template: str
    parts: tuple[str | Ref, ...]

    @property
    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]

    def action_id(self, params: Any) -> str:
        """The action id for ``params``; ``InvalidInput`` (nothing recorded, nothing
        sent) when a value is missing, of the wrong type, empty, or could make the
        same id as other values would."""
        out: list[str] = []
        for i, part in enumerate(self.parts):
            if isinstance(part, str):
                out.append(part)
                continue
            value = _text(self, part, _lookup(self, part, params))
            following = self.parts[i + 1] if i + 1 < len(self.parts) else None
            later = any(isinstance(p, Ref) for p in self.parts[i + 1 :])
            if later and isinstance(following, str) and following[0] in value:
                raise InvalidInput(
                    f"param {part.name!r} is {value!r}, which holds {following[0]!r}: in the "
                    f"action key {self.template!r} that could name another intent; use a value "
                    f"without {following[0]!r}"
                )
            out.append(value)
        made = "".join(out)
        problem = action_id_problem(made, "the action id")
        if problem:
            raise InvalidInput(
                f"the action key {self.template!r} makes {made[:60]!r} from these params, and "
                f"{problem}; shorten or clean the values it is made of"
            )
        return made


def parse(key: str, template: Any, schema: Mapping[str, Any] | None = None) -> ActionKey:
    """``template`` checked and parsed; ``ConfigError`` naming ``key`` (the config key
    path, e.g. ``operations.send.action_key``) and the fix."""
    if not isinstance(template, str) or not template:
        raise ConfigError(f'{key}: must be a template over params, e.g. "receipt-{{order_id}}"')
    parts: list[str | Ref] = []
    literal, pos = "", 0
    for m in _TOKEN.finditer(template):
        literal += template[pos : m.start()]
        pos = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            literal += token[0]
            continue
        inner = m.group(1)
        if inner is None:
            raise ConfigError(f"{key}: a stray {token!r}; write {{{{ and }}}} for literal braces")
        if not _NAME.match(inner.strip()):
            raise ConfigError(
                f"{key}: {{{inner}}} is not a param; use {{NAME}} or {{NAME.FIELD}} "
                "(letters, digits, _ and -)"
            )
        if literal:
            parts.append(literal)
            literal = ""
        elif parts and isinstance(parts[-1], Ref):
            raise ConfigError(
                f"{key}: {{{parts[-1].name}}}{{{inner.strip()}}} could split one way or "
                "another; put a separator between them, e.g. {a}-{b}"
            )
        parts.append(Ref(tuple(inner.strip().split("."))))
    literal += template[pos:]
    if literal:
        parts.append(literal)
    parsed = ActionKey(template, tuple(parts))
    if not parsed.refs:
        raise ConfigError(
            f"{key}: {template!r} names no param, so every call would be the same action; "
            'make it from the business arguments, e.g. "receipt-{order_id}"'
        )
    sample = "".join(p if isinstance(p, str) else SAMPLE for p in parts)
    problem = action_id_problem(sample, "an action id")
    if problem:
        raise ConfigError(f"{key}: {template!r} cannot make a valid action id: {problem}")
    for ref in parsed.refs:
        _known(key, ref, schema)
    return parsed


def _known(key: str, ref: Ref, schema: Mapping[str, Any] | None) -> None:
    """A reference names a param the schema declares, as deep as it declares them."""
    node: Any = schema
    for depth, name in enumerate(ref.path):
        props = node.get("properties") if isinstance(node, Mapping) else None
        if not isinstance(props, Mapping):
            return  # the schema says nothing this deep: any name may be there
        if name not in props:
            where = ".".join(ref.path[:depth]) or "params"
            known = ", ".join(sorted(map(str, props))) or "none"
            raise ConfigError(
                f"{key}: {{{ref.name}}} names no param the params schema knows in {where} "
                f"(it has: {known})"
            )
        node = props[name]


def _lookup(key: ActionKey, ref: Ref, params: Any) -> Any:
    value = params
    for depth, name in enumerate(ref.path):
        if not isinstance(value, Mapping) or name not in value:
            where = ".".join(ref.path[: depth + 1])
            raise InvalidInput(
                f"params need {where!r}: the action id is made from it (action key "
                f"{key.template!r})"
            )
        value = value[name]
    return value


def _text(key: ActionKey, ref: Ref, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        kind = type(value).__name__ if value is not None else "null"
        raise InvalidInput(
            f"param {ref.name!r} is {kind}; the action key {key.template!r} needs a string or a "
            "whole number there"
        )
    text = str(value)
    if not text:
        raise InvalidInput(
            f"param {ref.name!r} is empty; the action key {key.template!r} needs a value there"
        )
    return text


@lru_cache(maxsize=256)
def compiled(template: str) -> ActionKey:
    """A template already checked at config load, parsed once per process."""
    return parse("action_key", template)


def intended_id(spec: Any, params: Any, given: str | None) -> str | None:
    """The action id of ``params`` under the operation's ``action_key``, or ``given``
    when it declares none. A ``given`` id that is not the one the key makes is refused
    (``InvalidInput``): one intent, one action (rule 21)."""
    template = getattr(spec, "action_key", None)
    if not template:
        return given
    made = compiled(template).action_id(params)
    if given is not None and given != made:
        raise InvalidInput(
            f"action id {given!r} is not the one this operation's action key {template!r} "
            f"makes from these params ({made!r}); omit the action id, or give that one"
        )
    return made


def intent_conflict(template: str, existing: Any) -> str:
    """Why a call under an action key was refused: the intent its params name is
    already an action with other params (``existing``, when it can still be read)."""
    if existing is None:
        return f"another action already holds this id under the action key {template!r}"
    return (
        f"the intent {existing.action_id!r} (action key {template!r}) is already recorded with "
        f"other params ({existing.provider}.{existing.operation}, {existing.status}); nothing "
        "was sent. Repeating that intent needs its recorded params; another intent needs "
        "other values in the key"
    )


def required(key: ActionKey) -> list[str]:
    """The top-level params the key is made from (a tool's input requires them)."""
    return list(dict.fromkeys(r.path[0] for r in key.refs))


__all__ = ["ActionKey", "Ref", "compiled", "intended_id", "intent_conflict", "parse", "required"]
