"""settled providers: what each configured operation declares."""

from __future__ import annotations

import typer

from .common import STATE, console, emit_json

providers_app = typer.Typer(
    help="List configured providers and their operations' declarations.",
    invoke_without_command=True,
    rich_markup_mode=None,
)


def rows() -> list[dict[str, object]]:
    reg = STATE.registry()
    reg.load_all()
    out = []
    for name in reg.names():
        for spec in reg.provider(name).operations().values():
            out.append({"provider": name, **spec.to_json()})
    return out


@providers_app.callback()
def providers(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Rows as a JSON array."),
) -> None:
    """List each provider/operation: tier, window, attempts, timeout, key dedupe, verifier."""
    if ctx.invoked_subcommand is not None:
        return
    data = rows()
    if as_json:
        emit_json(data)
        raise typer.Exit(0)
    from rich.table import Table

    con = console()
    if not data:
        con.print(
            "no providers configured: add [providers.NAME] sections to settled.toml "
            "(see README), or run `settled demo`"
        )
        raise typer.Exit(0)
    t = Table(title="providers", title_justify="left")
    for col in ("provider", "operation", "tier", "window", "attempts", "timeout", "dedupe", "verified by"):
        t.add_column(col, overflow="fold")
    for r in data:
        t.add_row(
            str(r["provider"]),
            str(r["operation"]),
            str(r["tier"]),
            f"{r['consistency_window']:g}s",
            str(r["attempts"]),
            f"{r['timeout']:g}s",
            "yes" if r["dedupes_keys"] else "no",
            str(r["verifies"]) or "-",
        )
    con.print(t)
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    app.add_typer(providers_app, name="providers")
