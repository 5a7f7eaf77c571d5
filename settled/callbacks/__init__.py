"""Signed provider callbacks as evidence (rule 16; docs/callbacks.md).

- ``config``: ``[providers.NAME.callbacks]``, checked when settled.toml is loaded.
- ``schemes``: one class per signing scheme behind one protocol (the signature check,
  the event id, the timestamp, the headers it requires, the sender's signer).
- ``verify``: a provider's scheme checked over the raw body, before it is read, and
  its timestamp judged by the ledger's clock; ``required_headers(cfg)``.
- ``events``: a verified body read as events, every kept value bounded.
- ``hooks``: ``Hooks.handle``, the one function a server mounts as
  ``POST /hooks/{provider}``; it answers with an ``Answer``.

What a callback does to a record is ``settled.policy.callback``'s to say; the ledger
records each event once and applies it in one transaction (``Ledger.take_callback``).

Names are loaded on first use, so that loading settled.toml (which checks the
callbacks' keys) imports only ``config``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Answer": "hooks",
    "Hooks": "hooks",
    "MAX_BODY": "hooks",
    "CallbackConfig": "config",
    "SCHEMES": "config",
}

if TYPE_CHECKING:
    from .hooks import MAX_BODY, Answer, Hooks
    from .settings import SCHEMES, CallbackConfig


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'settled.callbacks' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = ["MAX_BODY", "SCHEMES", "Answer", "CallbackConfig", "Hooks"]
