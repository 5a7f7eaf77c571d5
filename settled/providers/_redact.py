"""The redactor: every spelling of a secret, masked before anything is stored or cut.

A secret (an expanded ``${VAR}``, a password, a basic-auth token) leaves settled in a
header, byte for byte; it comes back, when it does, inside text someone else wrote:
an error body that echoes the request, an exception that quotes a header. That text
may spell it in many ways, and in several of them at once:

- as is; percent-encoded once, twice or three times (``%2F``, ``%252F``), in upper
  or lower case hex, with ``+`` for a space (forms);
- backslash-escaped as JSON, Python's ``repr`` (of the text or of its UTF-8 bytes)
  or ``escape_controls`` write it (``\\u00e9``, ``\\xe9``, ``\\xc3\\xa9``,
  ``\\"``, ``\\/``), at any depth of nesting (JSON inside JSON doubles the
  backslashes);
- as an HTML or XML entity (``&quot;``, ``&#47;``, ``&#x2f;``);
- as Latin-1 bytes read as UTF-8 (each non-ASCII character becomes U+FFFD) or UTF-8
  bytes read as Latin-1 or cp1252 (``Ã©``: mojibake);
- decoded: a server that percent-decodes what it got echoes ``%2F`` as ``/``;
- base64 (basic auth) with or without its ``=`` padding.

Rather than list the combinations, each character of a secret is matched by any of
its spellings, so every mixture of them is masked too (a JSON body that echoes a
percent-encoded header, a nested JSON error, a form-encoded value in an HTML page).
ASCII letters and digits have no other spelling, so a secret that starts with one is
found by a literal search, as fast as ``str.replace``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import unquote, unquote_plus

MASK = "***"

_BS = r"\\(?:\\){0,7}"  # one backslash or more: nested escaping doubles them
_PCT = "%(?:25){0,2}"  # percent-encoded once, twice or three times
_HTML = {
    "&": ("&amp;",),
    "<": ("&lt;",),
    ">": ("&gt;",),
    '"': ("&quot;",),
    "'": ("&apos;",),
    "\xa0": ("&nbsp;",),
}
_NAMED = {"\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f", "\0": "0"}
_UNRESERVED = "-._~"  # left alone by most encoders, encoded by some


def _hex(n: int, width: int) -> str:
    """``n`` in hex, ``width`` digits, matched in either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{n:0{width}x}")


def _spellings(ch: str) -> list[str]:
    """Regular expressions for each way ``ch`` can be written in echoed text."""
    code = ord(ch)
    out = [re.escape(ch)]
    if ch.isascii() and ch.isalnum():
        return out  # no encoder writes a letter or a digit any other way
    utf8 = ch.encode("utf-8", "surrogatepass")
    out.append("".join(_PCT + _hex(b, 2) for b in utf8))
    if 0x80 <= code <= 0xFF:
        out.append(_PCT + _hex(code, 2))  # Latin-1, as a header carries it
    if ch in _UNRESERVED:
        return out
    if ch == " ":
        out += [r"\+", _PCT + "2[bB]"]  # a form's space, then encoded again
    # Backslash escapes: JSON, repr, the bytes' repr, escape_controls.
    if code <= 0xFFFF:
        out.append(_BS + "u" + _hex(code, 4))
    else:
        high = 0xD800 + ((code - 0x10000) >> 10)
        low = 0xDC00 + ((code - 0x10000) & 0x3FF)
        out.append(_BS + "u" + _hex(high, 4) + _BS + "u" + _hex(low, 4))
        out.append(_BS + "U" + _hex(code, 8))
    if code <= 0xFF:
        out.append(_BS + "x" + _hex(code, 2))
    if code > 0x7F:
        out.append("".join(_BS + "x" + _hex(b, 2) for b in utf8))
    if ch in "\"'\\/":
        out.append(_BS + re.escape(ch))
    if ch in _NAMED:
        out.append(_BS + _NAMED[ch])
    # HTML and XML entities.
    out += [re.escape(e) for e in _HTML.get(ch, ())]
    out += [f"&#0*{code};", f"&#[xX]0*{_hex(code, len(f'{code:x}'))};"]
    if code > 0x7F:
        # Bytes read in the wrong encoding: Latin-1 read as UTF-8 gives U+FFFD; UTF-8
        # read as Latin-1 or cp1252 gives mojibake.
        out += ["\ufffd", _BS + "u[fF][fF][fF][dD]"]
        for wrong in ("latin-1", "cp1252"):
            try:
                out.append(re.escape(utf8.decode(wrong)))
            except UnicodeDecodeError:
                pass
    if unicodedata.category(ch) == "Zs":
        out.append(r"\s")  # a non-breaking space shown as a space
    return list(dict.fromkeys(out))


@lru_cache(maxsize=512)  # a provider is built once per process; tests build many
def _pattern(secret: str) -> re.Pattern[str]:
    parts = []
    for ch in secret:
        alts = _spellings(ch)
        parts.append(alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")")
    return re.compile("".join(parts))


def variants(secret: str) -> set[str]:
    """The texts a secret can stand for once a receiver has decoded it: itself;
    percent-decoded (``%2F`` → ``/``, ``+`` → space; as UTF-8 or Latin-1); its
    Latin-1 bytes (a header's) read as UTF-8; base64 without its padding."""
    out = {secret}
    for decode in (unquote, unquote_plus):
        out.add(decode(secret))
        out.add(decode(secret, encoding="latin-1"))
    try:
        out.add(secret.encode("latin-1").decode("utf-8", "replace"))
    except UnicodeEncodeError:
        pass
    stripped = secret.rstrip("=")
    if stripped != secret and len(stripped) >= 8:
        out.add(stripped)
    return {v for v in out if v}


def escape_controls(text: str) -> str:
    """Control, format and other unprintable characters as ``\\n``, ``\\x1b`` or
    ``\\u202e``: a reason or detail is one line and moves no cursor."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        elif ord(ch) <= 0xFF:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return "".join(out)


class Redactor:
    """Replaces every known secret with ``***`` in a string, in every spelling it can
    take in text a server or a library wrote (this module's docstring lists them), so
    no detail, reason or evidence a provider returns can carry one."""

    MASK = MASK

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        texts: set[str] = set()
        for secret in secrets:
            if secret:
                texts |= variants(secret)
        # Longest first, so a secret that contains another is masked whole.
        self._patterns = [_pattern(t) for t in sorted(texts, key=lambda t: (-len(t), t))]

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def __call__(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub(MASK, text)
        return text

    def clean(self, text: str) -> str:
        """Redacted, then made one printable line."""
        return escape_controls(self(text))

    def value(self, obj: Any) -> Any:
        """The same for every string inside a JSON-like value."""
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, Mapping):
            return {self(str(k)): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


__all__ = ["MASK", "Redactor", "escape_controls", "variants"]
