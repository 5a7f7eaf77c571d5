"""The columns a listing of records shows (``queue``, ``demo``): a table for people,
TSV for scripts."""

from __future__ import annotations

from typing import Any

from .. import cause
from ..advice import next_step
from ..display import ago, iso, one_line
from .render import Col


def queue_columns(now: Any, statuses: list[str]) -> list[Col]:
    cols = [Col("action", lambda r: r.action_id)]
    if len(statuses) > 1:
        cols.append(Col("status", lambda r: str(r.status), style=lambda r: status_style(r.status)))
    cols += [
        Col(
            "age",
            lambda r: ago(r.created_at, now),
            lambda r: iso(r.created_at),
            give_way=4,
            right=True,
        ),
        Col("operation", lambda r: f"{r.provider}/{r.operation}", give_way=3),
        Col("tier", lambda r: str(r.tier), give_way=2),
        Col("att", lambda r: str(r.attempt), give_way=1, right=True),
        Col("next", lambda r: next_step(r, now), next_step, give_way=5),
        Col("cause", lambda r: cause.shown(r) or "", give_way=6),
        Col("created", lambda r: iso(r.created_at), wide=True),
        Col("next check", lambda r: iso(r.next_check_at), wide=True),
        Col("why", why, flex=True),
    ]
    return cols


def tsv_columns() -> list[Col]:
    return [
        Col("action", lambda r: r.action_id),
        Col("status", lambda r: str(r.status)),
        Col("created", lambda r: iso(r.created_at)),
        Col("provider", lambda r: r.provider),
        Col("operation", lambda r: r.operation),
        Col("tier", lambda r: str(r.tier)),
        Col("attempt", lambda r: str(r.attempt)),
        Col("next_check", lambda r: iso(r.next_check_at)),
        Col("next", next_step),
        Col("why", why),
    ]


def why(rec: Any) -> str:
    """The why cell: a contradiction of a terminal status first (rule 9), then the reason."""
    reason = one_line(rec.reason or "")
    if getattr(rec, "contradiction", None):
        return f"CONTRADICTED: {one_line(rec.contradiction)}" + (f"; {reason}" if reason else "")
    return reason


def status_style(status: object) -> str:
    from .render import STATUS_STYLE

    return STATUS_STYLE.get(str(status), "")
