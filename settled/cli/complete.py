"""Shell completion of values: action ids from the ledger, provider and operation
names from the config and the ledger. Completion never creates a ledger and never
prints an error: anything that fails completes nothing."""

from __future__ import annotations

from typing import Any

from .common import STATE

LIMIT = 200


def _session(ctx: Any) -> Any:
    """The session as the command line being completed would open it: Click does
    not run the global options' callback while completing."""
    root = ctx.find_root() if ctx is not None else None
    params = root.params if root is not None else {}
    if params.get("db"):
        STATE.db = params["db"]
    if params.get("config"):
        STATE.config_path = params["config"]
    STATE.extra["completing"] = True  # completion prints nothing but values
    return STATE


def action_ids(ctx: Any, incomplete: str) -> list[str]:
    try:
        return _session(ctx).ledger(read_only=True).ids(incomplete, limit=LIMIT)  # type: ignore[no-any-return]
    except Exception:
        return []


def providers(ctx: Any, incomplete: str) -> list[str]:
    from .common import known_names

    try:
        s = _session(ctx)
        try:
            ledger = s.ledger(read_only=True)
        except Exception:
            ledger = None
        names, _ = known_names(ledger)
        return sorted(n for n in names if n.startswith(incomplete))
    except Exception:
        return []


def operations(ctx: Any, incomplete: str) -> list[str]:
    from .common import known_names

    try:
        s = _session(ctx)
        try:
            ledger = s.ledger(read_only=True)
        except Exception:
            ledger = None
        provider = ctx.params.get("provider") if ctx is not None else None
        _, pairs = known_names(ledger, operations=True)
        return sorted({o for p, o in pairs if (provider in (None, p)) and o.startswith(incomplete)})
    except Exception:
        return []


def statuses(incomplete: str) -> list[str]:
    from .common import STATUSES

    return [s for s in (*STATUSES, "all") if s.lower().startswith(incomplete.lower())]


def formats(incomplete: str) -> list[str]:
    from .render import FORMATS

    return [f for f in FORMATS if f.startswith(incomplete)]


# -- the filter options that complete with these, as queue and resolve declare them ----------


def provider_option(help: str) -> Any:
    import typer

    return typer.Option(None, "--provider", metavar="NAME", autocompletion=providers, help=help)


def operation_option(help: str) -> Any:
    import typer

    return typer.Option(None, "--operation", metavar="NAME", autocompletion=operations, help=help)


def status_option(help: str, metavar: str = "STATUS[,STATUS…]") -> Any:
    import typer

    return typer.Option(
        None, "--status", metavar=metavar, autocompletion=statuses, help=help, show_default=False
    )


def older_than_option(help: str) -> Any:
    import typer

    return typer.Option(None, "--older-than", metavar="DURATION", help=help)
