"""The action ledger: the interface and its backends live in ``settled.storage``;
this module keeps the name ``settled.ledger.Ledger`` importable."""

from __future__ import annotations

from .storage import Ledger

__all__ = ["Ledger"]
