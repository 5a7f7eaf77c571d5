"""Configuration checks settled.toml and the built-in providers share: numbers and
``${VAR}`` values.

Every failure is a one-line ``ConfigError`` that starts with the key (the registry
puts the file and ``providers.NAME`` in front of it) and says how to fix it. An
expanded value is a secret: no message ever quotes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def number(
    key: str,
    value: Any,
    *,
    positive: bool = False,
    whole: bool = False,
    what: str = "a number of seconds",
) -> float:
    """A finite number (a whole one >= 1 when ``whole``): > 0 when ``positive``,
    else >= 0. ``bool`` is refused although Python counts it as an int."""
    if whole:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}: must be a whole number >= 1, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}: must be {what}, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{key}: must be > 0, got {value!r}")
    if value < 0:
        raise ConfigError(f"{key}: must be >= 0, got {value!r}")
    return float(value)


def whole_number(key: str, value: Any) -> int:
    number(key, value, whole=True)
    return int(value)


def has_control(text: str) -> bool:
    """C0, DEL and C1 control characters (TAB, CR and LF included)."""
    return any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in text)


def expand_env(
    key: str, raw: Any, env: Mapping[str, str], *, whole: bool = True
) -> tuple[str, list[str]]:
    """``(value, secrets)``: ``raw`` with each ``${VAR}`` replaced by the environment's
    value. ``secrets`` holds every substituted value (and, with ``whole``, the whole
    value when it changed), for the redactor. A variable that is unset, or whose value
    holds a control character (a trailing TAB or newline that a header would carry), is
    an error that names the variable, never the value."""
    if not isinstance(raw, str):
        raise ConfigError(f'{key}: must be a string, e.g. "Bearer ${{TOKEN}}"')
    if "${" in ENV_REF.sub("", raw):
        raise ConfigError(
            f"{key}: has a malformed ${{...}}; write ${{NAME}} with letters, digits and _"
        )
    secrets: list[str] = []

    def sub(m: re.Match[str]) -> str:
        var = m.group(1)
        if var not in env:
            raise ConfigError(
                f"{key}: environment variable {var} is not set; export it before running "
                "settled (values are read at run time, never stored)"
            )
        value = env[var]
        if has_control(value):
            raise ConfigError(
                f"{key}: environment variable {var} contains a control character (a TAB, "
                "newline or similar, often a trailing one); remove it from the value"
            )
        secrets.append(value)
        return value

    value = ENV_REF.sub(sub, raw)
    if whole and value != raw:
        secrets.append(value)
    return value, secrets


def expand_url(key: str, raw: Any, env: Mapping[str, str]) -> tuple[Any, list[str]]:
    """A configured URL (``base_url``, a calendar's ``url``) with its ``${VAR}``s read
    from the environment now, at run time: ``(url, secrets)``. Only the substituted
    values are secrets (an account id in a path, a host), so the rest of the URL stays
    readable where it is shown; the config keeps the reference, and the ledger never
    sees the value. Anything that is not a string is returned for the caller to refuse."""
    if not isinstance(raw, str) or "${" not in raw:
        return raw, []
    return expand_env(key, raw, env, whole=False)
