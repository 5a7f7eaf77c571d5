"""What every callback signing scheme decides, behind one protocol (rule 16;
docs/callbacks.md). Like httpx's auth classes, a scheme is one class in one module of
this package, registered by its name in ``__init__.py``; an instance holds the options
its ``[providers.NAME.callbacks]`` table gave it. A scheme says:

- which config keys are its own (``options``) and how they are checked (``parse``,
  every mistake one line through ``fail``), and whether it takes a ``secret``;
- the key material made from each secret (``key``), once, when a process that receives
  callbacks starts; several secrets are several keys, any of which may verify
  (rotation);
- the signature check over the raw body, with the query string where the URL is
  signed (``verify``): what the signature vouches for (``Signed``: the scheme's own
  event id, the signed timestamp), or ``Refused``;
- the headers without which a request is refused before its body is read
  (``required_headers``);
- where each event's id is (``own_event_id``, ``event_field``), whether a key may be
  read from the query string (``signs_url``), how a body sent without a content type
  is read (``form``) and which form field holds a JSON event (``form_payload``);
- what it signs, in words, and why ``providers audit`` calls it weaker (``signs``,
  ``weaker``);
- an answer owed once the signature holds, before any event is read (``handshake``:
  Slack's URL verification);
- the sender's side (``sign``): a valid signature for a message, made as the provider
  makes it, for the simulator and the tests.

Freshness is not the scheme's to judge: it returns the timestamp it verified, and the
caller compares it with the ledger's clock (rule 12), ``|now - t| <= tolerance``. Every
comparison of a secret-derived value is ``hmac.compare_digest``. Only the standard
library is imported here; a scheme that needs a package imports it when its key is made.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from ...errors import ConfigError

MAX_SIGNATURES = 16  # signatures one header may carry (rotation needs two or three)
MAX_DEPTH = 64  # nesting a body may have (json.loads would recurse up to the C stack)
MAX_TOKEN = 300  # characters of a value a scheme keeps from the request (an id, a token)
INSTALL = "pip install 'settled[callbacks]'"

Fail = Callable[[str, str], ConfigError]  # (key, problem) -> the one-line error to raise


class Refused(Exception):
    """A callback refused before its body was read: the HTTP status and the reason
    code (``bad_signature``, ``stale``). The sender learns nothing more."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


BAD = Refused(401, "bad_signature")
STALE = Refused(401, "stale")


@dataclass(frozen=True)
class Message:
    """A callback on the wire: the raw body, the headers and the URL's query string
    (without ``?``). Received, its header names are lower-case; signed, they are
    written as the provider writes them."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    query: str = ""

    def header(self, name: str) -> str:
        """A received header's value ("" when absent)."""
        return self.headers.get(name.lower(), "")

    def with_headers(self, **added: str) -> Message:
        return Message(self.body, {**self.headers, **added}, self.query)

    @property
    def content_type(self) -> str:
        for name, value in self.headers.items():
            if name.lower() == "content-type":
                return value.split(";", 1)[0].strip().lower()
        return ""


@dataclass(frozen=True)
class Signed:
    """What a verified signature vouches for beyond the body."""

    event_id: str | None = None  # the scheme's own (webhook-id, X-GitHub-Delivery, a token)
    timestamp: int | None = None  # s since the epoch, when the scheme signs one


class Scheme(ABC):
    """One signing scheme; subclasses are frozen dataclasses of their options."""

    name: ClassVar[str]
    options: ClassVar[tuple[str, ...]] = ()  # config keys of its own
    signs: ClassVar[str] = ""  # what the signature covers, in words
    takes_secret: ClassVar[bool] = True  # `secret` / `secrets`, from the environment
    timestamped: ClassVar[bool] = False  # it signs a timestamp: `tolerance` applies
    event_field: ClassVar[str | None] = None  # JSON pointer of each event's own id
    signs_url: ClassVar[bool] = False  # the query string is signed: a key may be ?NAME
    form: ClassVar[bool] = False  # a body without a content type is a form
    form_payload: ClassVar[str | None] = None  # a form field whose value is the JSON event
    weaker: ClassVar[str] = ""  # why `providers audit` calls it weaker ("" when it is not)

    @classmethod
    def parse(cls, table: Mapping[str, Any], fail: Fail) -> Self:
        """An instance with the options ``table`` gives (the scheme's own keys only;
        the others are the config's)."""
        return cls()

    @property
    def own_event_id(self) -> str:
        """Where the scheme's own event id is, in words; "" when it has none, so the
        config may name one (``event_id``)."""
        return ""

    def required_headers(self) -> tuple[str, ...]:
        """The (lower-case) headers without which a request is refused (401) before
        its body is read."""
        return ()

    def key(self, secret: str, where: str) -> Any:
        """The key material one secret makes; a ``ConfigError`` naming ``where`` when
        the secret cannot be one."""
        return secret.encode()

    def keys(self, secrets: Sequence[str], where: str) -> tuple[Any, ...]:
        """Every key a request may be signed with, from the secrets (several during a
        rotation) or, for a scheme that takes none, from its options."""
        return tuple(self.key(s, where) for s in secrets)

    @abstractmethod
    def verify(self, keys: Sequence[Any], message: Message) -> Signed:
        """Check ``message``'s signature with any of ``keys``; raises ``Refused``."""

    def handshake(self, message: Message) -> dict[str, Any] | None:
        """What to answer instead of reading events, once the signature holds; None for
        an ordinary callback."""
        return None

    @abstractmethod
    def sign(
        self, secret: str, message: Message, *, url: str, now: float, event_id: str
    ) -> Message:
        """``message`` as the provider sends it signed with ``secret`` at ``now`` to
        ``url`` (without its query string), its own event id ``event_id`` where the
        scheme carries one in a header or the signature."""


# -- what several schemes share -----------------------------------------------------------------


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def same(expected: str | bytes, offered: str | bytes) -> bool:
    """Constant-time equality of a secret-derived value and what was offered (text the
    sender wrote may hold anything: it is compared as UTF-8 bytes)."""
    a = expected.encode() if isinstance(expected, str) else expected
    b = offered.encode("utf-8", "replace") if isinstance(offered, str) else offered
    return hmac.compare_digest(a, b)


def whole(text: str) -> bool:
    """A timestamp as written in a header or a field: whole seconds, at most 12 digits."""
    return text.isascii() and text.isdigit() and len(text) <= 12


def listed(header: str, version: str, *, sep: str = ",") -> list[str]:
    """The signatures a header lists under ``version`` (``v1=a,v1=b``), at most
    ``MAX_SIGNATURES``; other versions are skipped."""
    out = []
    for part in header.split(sep)[: MAX_SIGNATURES * 2]:
        name, eq, value = part.strip().partition("=")
        if eq and name == version and value:
            out.append(value)
    return out[:MAX_SIGNATURES]


def token(value: Any) -> str | None:
    """A short printable string a scheme keeps from the request (a token, an id), or
    None."""
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN:
        return None
    return value if value.isprintable() else None


def too_deep(text: str) -> bool:
    """Whether brackets nest deeper than ``MAX_DEPTH`` (strings skipped), found without
    building anything."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, read safely (bounded nesting, no NaN), or None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if too_deep(text):
        return None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


__all__ = [
    "BAD",
    "INSTALL",
    "MAX_SIGNATURES",
    "STALE",
    "Fail",
    "Message",
    "Refused",
    "Scheme",
    "Signed",
    "hmac_sha256",
    "json_object",
    "listed",
    "same",
    "token",
    "too_deep",
    "whole",
]
