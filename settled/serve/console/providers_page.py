"""``/ui/providers``: each operation's declaration, its callbacks and the audit's debt
(``settled providers audit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...audit import audit
from .page_kit import (
    PageRoute,
    Visit,
)

if TYPE_CHECKING:
    from starlette.responses import Response

    from ...session import Session


async def providers(visit: Visit) -> Response:
    def work(s: Session) -> dict[str, Any]:
        reg = s.registry()
        reg.load_all()
        specs = {
            (n, o): spec for n in reg.names() for o, spec in reg.provider(n).operations().items()
        }
        report = audit(s.ledger(), specs, s.config().callbacks)
        return {
            "ops": report.operations,
            "kept": report.callbacks,
            "debt": report.debt,
            "callbacks": s.config().callbacks,
        }

    return visit.page("providers.html", nav="providers", **(await visit.run(work)))


ROUTES = (PageRoute("/providers", providers),)

__all__ = ["ROUTES", "providers"]
