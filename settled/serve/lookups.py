"""Reads the API and the console both make, as the CLI's commands make them: how today's
config differs from what a record was recorded with, and the check that a provider or
operation selector names a real one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput, SettledError
from ..model import Declared

if TYPE_CHECKING:
    from ..session import Session


def config_changes(s: Session, rec: Any) -> list[str] | None:
    """How today's declaration of the record's operation differs from the one it was
    recorded with (rule 11), as ``show --json`` says it; None when nothing compares."""

    if rec.declared is None:
        return None
    try:
        spec = s.registry().operation(rec.provider, rec.operation)
    except SettledError:
        return None
    changes: list[str] = rec.declared.differences(Declared.of(spec))
    return changes


def check_names(s: Session, provider: str | None, operation: str | None) -> None:
    """An unknown provider or operation selector is a 422 naming the real ones (a typo
    must not look like an empty queue to a monitor)."""

    if provider is None and operation is None:
        return
    pairs = set(s.ledger().names())
    providers = {p for p, _ in pairs} | set(s.config().providers)
    if provider is not None and provider not in providers:
        raise InvalidInput(
            f"provider: no provider {provider!r} in the config or the ledger; known: "
            f"{', '.join(sorted(providers)) or 'none'}"
        )
    if operation is not None:
        reg = s.registry()
        for name in s.config().providers:
            try:
                pairs |= {(name, o) for o in reg.provider(name).operations()}
            except SettledError:
                continue
        ops = {o for p, o in pairs if provider is None or p == provider}
        if operation not in ops:
            raise InvalidInput(
                f"operation: no operation {operation!r} in the config or the ledger; known: "
                f"{', '.join(sorted(ops)) or 'none'}"
            )
