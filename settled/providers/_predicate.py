"""Predicates over a provider's replies, for the ``http`` provider: what proves the
effect, what proves it absent, which errors may come after the effect, and what the
provider's own "not found" looks like (rules 19 and 20 in docs/rules.md).

One grammar, everywhere a predicate is declared (docs/providers.md, "Predicates")::

    predicate := [value, ...]                 the value at the operation's `status` is one of these
               | condition
               | { all = [predicate, ...] }   every one holds
               | { any = [predicate, ...] }   at least one holds
    condition := { path = PATH, is = value }
               | { path = PATH, in = [value, ...] }
               | { path = PATH, exists = true | false }
               | { http_status = [code, ...] }      (beside a path test: both must hold)
    PATH      := a JSON pointer ("/event", "/items/0/id", "" for the whole reply)
               | a JMESPath expression ("event", "items[?name=='X'].value | [0]")
    value     := a string, a number or a boolean (true is never 1)

A predicate that cannot be read (its path finds nothing, the reply is not JSON) does
not hold: it never proves anything by accident. JMESPath reads a JSON ``null`` as
absent.

Nothing here reads the network; ``Reading`` is what one reply gave (its HTTP status
and its parsed body) and every predicate is a pure function of it. A signed callback's
event is read through the same grammar (``settled.callbacks.settings``), without
``http_status``: an event has no reply status (``parse(..., http=False)``).

``jmespath`` is imported when the first expression is compiled, not with this module:
settled.toml's callbacks tables are read by every command, and a JSON pointer, the
common case, needs none (cold start).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ConfigError
from ._shape import Pointer

Scalar = str | int | float | bool
_MISSING = object()


# -- paths: a JSON pointer or a JMESPath expression --------------------------------------


@dataclass(frozen=True)
class Path:
    """Where a value is read in a reply: a JSON pointer (``/a/0/b``, RFC 6901), or a
    JMESPath expression (``a[0].b``, ``items[?name=='x'] | [0].value``)."""

    text: str
    pointer: Pointer | None
    expression: Any = None  # a compiled jmespath ParsedResult

    @classmethod
    def parse(cls, key: str, value: Any) -> Path:
        if not isinstance(value, str):
            raise ConfigError(
                f'{key}: must be a JSON pointer ("/status") or a JMESPath expression ("status")'
            )
        if value == "" or value.startswith("/"):
            ptr = Pointer.parse(value)
            if ptr is None:
                raise ConfigError(
                    f'{key}: {value!r} is not a JSON pointer; write it as "/field" or '
                    '"/outer/inner" (RFC 6901: ~0 for ~ and ~1 for /), or as a JMESPath '
                    'expression such as "outer.inner"'
                )
            return cls(value, ptr)
        import jmespath  # here, not at the top: see the module's docstring
        from jmespath.exceptions import JMESPathError

        try:
            compiled = jmespath.compile(value)
        except JMESPathError as exc:
            why = getattr(exc, "message", None) or getattr(exc, "msg", "") or "invalid"
            if "Invalid jmespath expression" in why:
                why = "incomplete expression"
            at = getattr(exc, "lex_position", None)
            where = f" at character {at}" if isinstance(at, int) else ""
            raise ConfigError(
                f'{key}: {value!r} is neither a JSON pointer ("/outer/inner", RFC 6901) nor a '
                f'JMESPath expression ("outer.inner"): {why}{where}'
            ) from None
        return cls(value, None, compiled)

    def find(self, doc: Any) -> tuple[bool, Any]:
        """``(found, value)``."""
        if self.pointer is not None:
            return self.pointer.find(doc)
        from jmespath.exceptions import JMESPathError  # loaded by parse, which compiled it

        try:
            value = self.expression.search(doc)
        except JMESPathError:  # a function applied to the wrong type: nothing found
            return False, None
        return value is not None, value


# -- what one reply gave -------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """One reply as the predicates see it: its HTTP status and its parsed JSON body
    (``body`` is ``_MISSING`` when there was none or it was not JSON)."""

    status_code: int | None
    body: Any = _MISSING

    @property
    def parsed(self) -> bool:
        return self.body is not _MISSING

    def at(self, path: Path) -> tuple[bool, Any]:
        if not self.parsed:
            return False, None
        return path.find(self.body)


def reading(status_code: int | None, body: Any = _MISSING) -> Reading:
    return Reading(status_code, body)


NO_BODY = _MISSING


# -- predicates ------------------------------------------------------------------------------


class Predicate(Protocol):
    def holds(self, r: Reading) -> bool: ...

    def describe(self) -> str: ...

    def paths(self) -> list[Path]: ...


def same(value: Any, want: Any) -> bool:
    """The equality predicates use: JSON true is never the number 1; numbers compare
    as numbers (``1`` equals ``1.0``)."""
    if isinstance(value, bool) or isinstance(want, bool):
        return type(value) is type(want) and value == want
    if isinstance(value, (int, float)) and isinstance(want, (int, float)):
        return bool(value == want)
    return type(value) is type(want) and value == want


def member(value: Any, options: tuple[Any, ...]) -> bool:
    return any(same(value, o) for o in options)


@dataclass(frozen=True)
class Condition:
    """One test: a value at ``path`` (``is``/``in``/``exists``), the reply's HTTP
    status (``http_status``), or both."""

    path: Path | None = None
    values: tuple[Scalar, ...] = ()  # is / in
    exists: bool | None = None
    http_status: tuple[int, ...] = ()
    single: bool = False  # written as `is = value`, not as a list

    def holds(self, r: Reading) -> bool:
        if self.http_status and r.status_code not in self.http_status:
            return False
        if self.path is None:
            return True
        found, value = r.at(self.path)
        if self.exists is not None:
            return found is self.exists
        return found and member(value, self.values)

    def describe(self) -> str:
        parts = []
        if self.http_status:
            parts.append("HTTP " + "/".join(str(c) for c in self.http_status))
        if self.path is not None:
            where = self.path.text or "the reply"
            if self.exists is not None:
                parts.append(f"{where} {'exists' if self.exists else 'is absent'}")
            elif self.single:
                parts.append(f"{where} = {_shown(self.values[0])}")
            else:
                parts.append(f"{where} in [{', '.join(_shown(v) for v in self.values)}]")
        return " with ".join(parts)

    def paths(self) -> list[Path]:
        return [self.path] if self.path is not None else []


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Predicate, ...]

    def holds(self, r: Reading) -> bool:
        return all(p.holds(r) for p in self.parts)

    def describe(self) -> str:
        return " and ".join(_grouped(p) for p in self.parts)

    def paths(self) -> list[Path]:
        return [x for p in self.parts for x in p.paths()]


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Predicate, ...]

    def holds(self, r: Reading) -> bool:
        return any(p.holds(r) for p in self.parts)

    def describe(self) -> str:
        return " or ".join(_grouped(p) for p in self.parts)

    def paths(self) -> list[Path]:
        return [x for p in self.parts for x in p.paths()]


def _grouped(p: Predicate) -> str:
    text = p.describe()
    return f"({text})" if isinstance(p, (AllOf, AnyOf)) and len(p.parts) > 1 else text


def _shown(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v)


# -- reading the TOML ------------------------------------------------------------------------

CONDITION_KEYS = ("path", "is", "in", "exists", "http_status")
EXAMPLE = '{ all = [{ path = "/event", is = "failed" }, { path = "/severity", is = "permanent" }] }'


def parse(
    key: str, value: Any, status: Path | None, *, http: bool = True, depth: int = 0
) -> Predicate:
    """A predicate from its TOML value (the grammar in this module's docstring), or a
    one-line ``ConfigError`` naming ``key`` and what to write. ``status`` is the path a
    bare list of values reads (the operation's ``status``); ``http=False`` where what is
    read has no HTTP status (a callback's event), so ``http_status`` is refused."""
    if depth > 8:
        raise ConfigError(f"{key}: nested more than 8 levels deep; write it flatter")
    if isinstance(value, list):
        values = _values(key, value)
        if status is None:
            raise ConfigError(
                f'{key}: a list of values is read at `status`, which is not set; add status = "/status", '
                f'or write a condition, e.g. {key.rsplit(".", 1)[-1]} = {{ path = "/status", in = {_toml(values)} }}'
            )
        return Condition(status, values)
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            f'{key}: must be a list of values (["delivered"]), a condition ({{ path = "/ok", is = true }}) '
            f"or {{ all = [...] }} / {{ any = [...] }}, e.g. {EXAMPLE}"
        )
    if set(value) & {"all", "any"}:
        if len(value) != 1:
            raise ConfigError(
                f"{key}: `all` or `any` stands alone in its table; nest the other tests inside it"
            )
        ((kind, parts),) = value.items()
        if not isinstance(parts, list) or not parts:
            raise ConfigError(
                f"{key}.{kind}: must be a non-empty list of predicates, e.g. {EXAMPLE}"
            )
        each = tuple(
            parse(f"{key}.{kind}[{i}]", p, status, http=http, depth=depth + 1)
            for i, p in enumerate(parts)
        )
        return AllOf(each) if kind == "all" else AnyOf(each)
    if not http and "http_status" in value:
        raise ConfigError(
            f"{key}.http_status: an event has no HTTP status to test; test its fields "
            '(path with is, in or exists), e.g. { path = "/event", is = "delivered" }'
        )
    unknown = sorted(set(value) - set(CONDITION_KEYS))
    if unknown:
        also = ", and/or http_status" if http else ""
        raise ConfigError(
            f"{key}.{unknown[0]}: unknown key in a condition; use path with is, in or "
            f"exists{also} (or all / any around several)"
        )
    codes: tuple[int, ...] = ()
    if "http_status" in value:
        codes = _codes(f"{key}.http_status", value["http_status"])
    tests = [k for k in ("is", "in", "exists") if k in value]
    if "path" not in value:
        if tests:
            raise ConfigError(
                f'{key}.path: missing: `{tests[0]}` needs the path it reads, e.g. path = "/status"'
            )
        if not codes:
            raise ConfigError(
                f"{key}: a condition needs path (with is, in or exists)"
                + (" or http_status" if http else "")
            )
        return Condition(http_status=codes)
    path = Path.parse(f"{key}.path", value["path"])
    if len(tests) != 1:
        raise ConfigError(
            f"{key}: a path is tested by exactly one of is, in or exists, e.g. "
            f'{{ path = {_toml(path.text)}, is = "delivered" }}'
        )
    test = tests[0]
    if test == "exists":
        if not isinstance(value["exists"], bool):
            raise ConfigError(f"{key}.exists: must be true or false")
        return Condition(path, exists=value["exists"], http_status=codes)
    if test == "is":
        return Condition(path, _values(f"{key}.is", [value["is"]]), http_status=codes, single=True)
    if not isinstance(value["in"], list):
        raise ConfigError(f'{key}.in: must be a list of values, e.g. in = ["delivered", "opened"]')
    return Condition(path, _values(f"{key}.in", value["in"]), http_status=codes)


def _values(key: str, raw: list[Any]) -> tuple[Scalar, ...]:
    if not raw or not all(isinstance(v, (str, int, float, bool)) for v in raw):
        raise ConfigError(
            f"{key}: must be a non-empty list of strings, numbers or booleans, e.g. "
            f'{key.rsplit(".", 1)[-1]} = ["delivered"]'
        )
    return tuple(raw)


def _codes(key: str, raw: Any) -> tuple[int, ...]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = [raw]
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(c, int) and not isinstance(c, bool) and 100 <= c <= 599 for c in raw)
    ):
        raise ConfigError(
            f"{key}: must be a list of HTTP statuses 100-599, e.g. http_status = [404]"
        )
    return tuple(raw)


def _toml(v: Any) -> str:
    if isinstance(v, tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def overlap(a: Predicate, b: Predicate) -> str | None:
    """A value both a bare-list ``a`` and ``b`` accept at the same path (the one
    mistake that can be seen without a reply), or None."""
    if isinstance(a, Condition) and isinstance(b, Condition) and a.path and b.path:
        if a.path.text == b.path.text and a.exists is None and b.exists is None:
            both = [v for v in a.values if member(v, b.values)]
            if both and not a.http_status and not b.http_status:
                return _shown(both[0])
    return None


# -- where a value comes from: the object id ----------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where the provider's object id is in a reply: at a path of the body, or in a
    header (``Location``); with ``pattern``, the first group of that regular
    expression in what is found there (Mailgun's ``<id>`` without its brackets)."""

    path: Path | None = None
    header: str | None = None
    pattern: re.Pattern[str] | None = None

    @property
    def text(self) -> str:
        if self.header is not None:
            return f"header {self.header}" + (f" ~ {self.pattern.pattern}" if self.pattern else "")
        assert self.path is not None
        return self.path.text

    def find(self, body: Any, headers: Mapping[str, str]) -> str | None:
        raw: str | None = None
        if self.header is not None:
            raw = next((v for k, v in headers.items() if k.lower() == self.header.lower()), None)
        elif self.path is not None and body is not _MISSING:
            found, value = self.path.find(body)
            if found and isinstance(value, (str, int)) and not isinstance(value, bool):
                raw = str(value)
        if raw is not None and self.pattern is not None:
            m = self.pattern.search(raw)
            raw = m.group(1) if m else None
        raw = raw.strip() if raw is not None else None
        return raw or None


__all__ = [
    "NO_BODY",
    "AllOf",
    "AnyOf",
    "Condition",
    "Path",
    "Predicate",
    "Reading",
    "Source",
    "member",
    "overlap",
    "parse",
    "reading",
    "same",
]
