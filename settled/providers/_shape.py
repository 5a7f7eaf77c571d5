"""Request shapes for the ``http`` provider: JSON pointers, templates with
placeholders, form encoding, and path segments that cannot address another resource.

A template is any TOML value. Strings in it may hold placeholders:

- ``{params}`` (the whole params), ``{params.NAME}`` or ``{params.a.b}`` (one param),
- ``{reconciliation_key}``, ``{idempotency_key}``, ``{action_id}``, ``{attempt}``,
- ``{provider_object_id}`` (queries only).

A string that is exactly one placeholder takes the value with its JSON type (a number
stays a number, ``{params}`` an object); a placeholder inside a longer string is
written as text. ``{params.NAME?}`` is optional: when the param is absent, the table
member, list item or query parameter that holds it is left out. ``{{`` and ``}}``
are literal braces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..errors import ConfigError

KEYS = ("reconciliation_key", "idempotency_key", "action_id", "attempt", "provider_object_id")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_REF = re.compile(r"^(params(?:\.[A-Za-z0-9_\-]+)*|[a-z_]+)(\?)?$")


class ShapeError(Exception):
    """A request cannot be built from these params (nothing is sent)."""


# -- JSON pointers (RFC 6901) ---------------------------------------------------------------


@dataclass(frozen=True)
class Pointer:
    text: str
    tokens: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Pointer | None:
        if text == "":
            return cls(text, ())
        if not text.startswith("/") or re.search(r"~(?![01])", text):
            return None
        return cls(
            text, tuple(t.replace("~1", "/").replace("~0", "~") for t in text[1:].split("/"))
        )

    @classmethod
    def from_form_path(cls, text: str) -> Pointer | None:
        """``metadata[ref]`` → ``/metadata/ref``; a plain ``name`` → ``/name``."""
        m = re.fullmatch(r"([^\[\]]+)((?:\[[^\[\]]+\])*)", text)
        if m is None:
            return None
        tokens = (m.group(1), *re.findall(r"\[([^\[\]]+)\]", m.group(2)))
        return cls("/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens), tokens)

    def find(self, doc: Any) -> tuple[bool, Any]:
        """``(found, value)``."""
        for token in self.tokens:
            if isinstance(doc, Mapping) and token in doc:
                doc = doc[token]
            elif isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
                doc = doc[int(token)]
            else:
                return False, None
        return True, doc

    def put(self, doc: Any, value: Any) -> Any:
        """A copy of ``doc`` with ``value`` at this pointer; objects on the way are
        created. Refuses to overwrite anything (a param where the key goes)."""
        if not self.tokens:
            raise ShapeError("the key cannot replace the whole body")
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise ShapeError(f"the body must be a JSON object to carry the key at {self.text}")
        out = dict(doc)
        head, *rest = self.tokens
        if not rest:
            if head in out:
                raise ShapeError(
                    f"the params already have a value at {self.text}, where the reconciliation "
                    "key goes; rename that param (settled never overwrites a param)"
                )
            out[head] = value
            return out
        inner = out.get(head)
        if inner is not None and not isinstance(inner, Mapping):
            raise ShapeError(
                f"the params have a non-object at /{head}, where the key's path {self.text} goes"
            )
        out[head] = Pointer("", tuple(rest)).put(inner, value)
        return out


# -- templates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    name: str  # "params", "params.a.b", or one of KEYS
    optional: bool

    def path(self) -> tuple[str, ...]:
        return tuple(self.name.split(".")[1:])


class _Omit:
    """An optional placeholder whose param is absent."""


OMIT = _Omit()


@dataclass(frozen=True)
class Text:
    """A string template: literal text and placeholders."""

    parts: tuple[str | Ref, ...]

    @property
    def refs(self) -> list[Ref]:
        return [p for p in self.parts if isinstance(p, Ref)]

    @property
    def whole(self) -> Ref | None:
        return self.parts[0] if len(self.parts) == 1 and isinstance(self.parts[0], Ref) else None


def parse_text(key: str, text: str, allowed: set[str], *, optional: bool = True) -> Text:
    parts: list[str | Ref] = []
    literal, pos = "", 0
    for m in _PLACEHOLDER.finditer(text):
        literal += text[pos : m.start()]
        pos = m.end()
        token = m.group(0)
        if token in ("{{", "}}"):
            literal += token[0]
            continue
        if m.group(1) is None:
            raise ConfigError(f"{key}: a stray {token!r}; write {{{{ and }}}} for literal braces")
        ref = _parse_ref(key, m.group(1), allowed, optional=optional)
        if literal:
            parts.append(literal)
            literal = ""
        parts.append(ref)
    literal += text[pos:]
    if literal:
        parts.append(literal)
    return Text(tuple(parts))


def _parse_ref(key: str, inner: str, allowed: set[str], *, optional: bool) -> Ref:
    m = _REF.match(inner.strip())
    name = m.group(1) if m else inner
    root = name.split(".")[0]
    if m is None or root not in allowed or (root != "params" and "." in name):
        known = ", ".join(
            "{" + a + ("" if a != "params" else "} or {params.NAME") + "}" for a in sorted(allowed)
        )
        raise ConfigError(
            f"{key}: {{{inner}}} is not a placeholder here; use {known} "
            "(write {{ and }} for literal braces)"
        )
    if m.group(2) and not (optional and name.startswith("params.")):
        raise ConfigError(
            f"{key}: {{{inner}}}: only a {{params.NAME?}} in a body, query or header may be optional"
        )
    return Ref(name, bool(m.group(2)))


def compile_template(key: str, value: Any, allowed: set[str]) -> Any:
    """Checks a TOML value and turns its strings into ``Text`` templates."""
    if isinstance(value, str):
        return parse_text(key, value, allowed)
    if isinstance(value, Mapping):
        return {str(k): compile_template(f"{key}.{k}", v, allowed) for k, v in value.items()}
    if isinstance(value, list):
        return [compile_template(f"{key}[{i}]", v, allowed) for i, v in enumerate(value)]
    if isinstance(value, (bool, int, float)):
        return value
    raise ConfigError(
        f"{key}: {type(value).__name__} values cannot be sent; use strings, numbers, tables or lists"
    )


def refs_of(template: Any) -> list[Ref]:
    if isinstance(template, Text):
        return template.refs
    if isinstance(template, Mapping):
        return [r for v in template.values() for r in refs_of(v)]
    if isinstance(template, list):
        return [r for v in template for r in refs_of(v)]
    return []


def lookup(ref: Ref, ctx: Mapping[str, Any]) -> Any:
    """The placeholder's value, ``OMIT`` for an absent optional param."""
    if ref.name in KEYS:
        value = ctx.get(ref.name)
        if value is None:
            raise ShapeError(f"there is no {ref.name.replace('_', ' ')} to put in {{{ref.name}}}")
        return value
    value = ctx.get("params")
    where = "params"
    for token in ref.path():
        where += "." + token
        if not isinstance(value, Mapping) or token not in value:
            if ref.optional:
                return OMIT
            top = ref.path()[0]
            raise ShapeError(
                f"params need {top!r}" if where == f"params.{top}" else f"params need {where[7:]!r}"
            )
        value = value[token]
    return value


def as_text(ref: Ref, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return json.dumps(value)
    shown = (
        "an object"
        if isinstance(value, Mapping)
        else "a list"
        if isinstance(value, list)
        else "null"
    )
    raise ShapeError(
        f"{{{ref.name}}} is {shown}; only a string or a number can be written into text"
    )


def render(template: Any, ctx: Mapping[str, Any]) -> Any:
    """The value the template describes (``OMIT`` when an optional part is absent)."""
    if isinstance(template, Text):
        whole = template.whole
        if whole is not None:
            return lookup(whole, ctx)
        out = []
        for part in template.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = lookup(part, ctx)
            if value is OMIT:
                return OMIT
            out.append(as_text(part, value))
        return "".join(out)
    if isinstance(template, Mapping):
        obj = {}
        for k, v in template.items():
            value = render(v, ctx)
            if value is not OMIT:
                obj[k] = value
        return obj
    if isinstance(template, list):
        return [v for v in (render(t, ctx) for t in template) if v is not OMIT]
    return template


# -- paths (DESIGN.md rule 10) -------------------------------------------------------------------


def segment(name: str, value: Any) -> str:
    """One substituted path value, percent-encoded; refused when it could change which
    resource the path addresses: empty, ``.``, ``..`` (httpx removes dot segments
    after encoding, so ``/messages/..`` would read the collection's parent), or a
    value with a separator."""
    text = as_text(Ref(name, False), value)
    if text in ("", ".", ".."):
        raise ShapeError(f"{{{name}}} is {text!r}, which would address another resource")
    if "/" in text or "\\" in text:
        raise ShapeError(
            f"{{{name}}} contains a path separator, which would address another resource"
        )
    return quote(text, safe="")


def render_path(template: Text, ctx: Mapping[str, Any]) -> str:
    out = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
        else:
            out.append(segment(part.name, lookup(part, ctx)))
    return "".join(out)


# -- form encoding ---------------------------------------------------------------------------------

FORM_LISTS = ("indexed", "brackets", "repeat")


def form_pairs(body: Any, lists: str = "indexed") -> list[tuple[str, str]]:
    """``application/x-www-form-urlencoded`` pairs with nested keys as Stripe and
    Twilio take them: ``metadata[ref]=…``; list items as ``a[0]`` (indexed), ``a[]``
    (brackets) or a repeated ``a`` (repeat)."""
    if not isinstance(body, Mapping):
        raise ShapeError("a form-encoded body must be an object (name = value pairs)")
    out: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}[{k}]", v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if lists == "repeat" and not isinstance(v, (Mapping, list)):
                    walk(prefix, v)
                elif lists == "brackets" and not isinstance(v, (Mapping, list)):
                    walk(f"{prefix}[]", v)
                else:
                    walk(f"{prefix}[{i}]", v)
        elif value is None:
            raise ShapeError(f"{prefix} is null, which a form cannot carry; leave it out")
        else:
            out.append((prefix, as_text(Ref(prefix, False), value)))

    for k, v in body.items():
        walk(str(k), v)
    return out
