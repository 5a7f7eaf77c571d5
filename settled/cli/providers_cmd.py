"""settled providers: what each configured operation declares."""

from __future__ import annotations

import sys

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


@providers_app.command("audit")
def audit_cmd(
    as_json: bool = typer.Option(False, "--json", help="The audit as one JSON object."),
) -> None:
    """Which operations would lie, and which declared windows the ledger contradicts.

    Answers five questions per operation, adds figures from the ledger, and suggests
    changes. Exit 4 when any operation carries completion-ownership debt."""
    from ..audit import audit

    reg = STATE.registry()
    reg.load_all()
    specs = {
        (name, op): spec
        for name in reg.names()
        for op, spec in reg.provider(name).operations().items()
    }
    report = audit(STATE.ledger(), specs)
    code = 4 if report.debt else 0
    if as_json:
        emit_json(report.to_json())
        raise typer.Exit(code)
    render_audit(report)
    raise typer.Exit(code)


def render_audit(report: object) -> None:
    from rich.table import Table

    from ..audit import QUESTIONS, AuditReport

    assert isinstance(report, AuditReport)
    con = console()
    if not report.operations:
        con.print("nothing to audit: no providers configured and no records in the ledger")
        return
    t = Table(title="providers audit", title_justify="left")
    for col in ("provider/operation", "tier", "q1", "q2", "q3", "q4", "q5", "debt"):
        t.add_column(col, overflow="fold")
    for op in report.operations:
        marks = [a.answer + ("!" if a.debt else "") for a in op.answers] or ["-"] * 5
        t.add_row(
            f"{op.provider}/{op.operation}",
            str(op.spec.tier) if op.spec else "not configured",
            *marks,
            "DEBT" if op.debt else "",
        )
    con.print(t)
    for q, text in QUESTIONS.items():
        con.print(f"  {q}: {text}", markup=False)
    for op in report.operations:
        f = op.figures
        con.print(f"\n[bold]{op.provider}/{op.operation}[/]")
        for a in op.answers:
            if a.answer != "yes":
                con.print(f"  {a.question} {a.answer}: {a.why}", markup=False)
        rate = f"{f.unresolved_rate:.0%}" if f.unresolved_rate is not None else "-"
        con.print(
            f"  records {f.total}: confirmed {f.confirmed}, failed {f.failed}, "
            f"unresolved {f.unresolved} ({rate}), pending {f.pending}",
            markup=False,
        )
        if f.first_seen_n:
            window = f"{op.spec.consistency_window:g} s" if op.spec else "-"
            con.print(
                f"  first observation: p50 {f.first_seen_p50:g} s, p95 {f.first_seen_p95:g} s "
                f"over {f.first_seen_n} (window {window})",
                markup=False,
            )
        for s in op.suggestions:
            con.print(f"  → {s}", markup=False)
    if report.debt:
        con.print(f"\ncompletion-ownership debt: {', '.join(report.debt)}", markup=False)


@providers_app.command("render")
def render_cmd(
    provider: str = typer.Argument(..., help="The provider, as named in settled.toml."),
    operation: str = typer.Argument(..., help="The operation."),
    params: str = typer.Option(None, "--params", help="JSON object, @FILE, or - for stdin."),
    action_id: str = typer.Option(
        None, "--action-id", help="The action id to show (default ACTION-ID)."
    ),
    key: str = typer.Option(
        None, "--key", help="The reconciliation key to show (default stl-KEY)."
    ),
    object_id: str = typer.Option(
        None, "--object-id", help="The provider object id a query by id would use."
    ),
    as_json: bool = typer.Option(False, "--json", help="The request and query as one JSON object."),
) -> None:
    """Print the exact request an operation would send for these params (method, URL,
    headers with secrets as ***, body) and the query that would verify it. Sends
    nothing and records nothing."""
    from ..errors import UsageError
    from .actions import parse_params

    values = parse_params(params)
    prov = STATE.registry().provider(provider)
    STATE.registry().operation(provider, operation)  # an unknown operation: exit 1, named
    render = getattr(prov, "render", None)
    if render is None:
        raise UsageError(f"provider {provider!r} cannot show its requests (its type has no render)")
    check = getattr(prov, "check_params", None)
    if check is not None:
        check(operation, values)
    kwargs: dict[str, object] = {"reconciliation_key": key, "provider_object_id": object_id}
    if action_id is not None:
        kwargs["action_id"] = action_id
    shown = render(operation, values, **kwargs)
    if as_json:
        emit_json(shown)
        raise typer.Exit(0)
    sys.stdout.write(render_text(shown))
    raise typer.Exit(0)


def render_text(shown: dict[str, object]) -> str:
    """Plain text, one escaped line per value: data is never markup (rule 13)."""
    from ..providers._wire import escape_controls as esc

    lines = [f"{shown['provider']}.{shown['operation']} ({shown['tier']})"]
    for part in ("request", "query"):
        call = shown.get(part)
        if not isinstance(call, dict):
            if part == "query":
                lines.append("query: none (nothing reads the effect afterwards)")
            continue
        lines.append(f"{part}: {esc(str(call['method']))} {esc(str(call['url']))}")
        for name, value in call.get("headers", []):
            lines.append(f"  {esc(str(name))}: {esc(str(value))}")
        body = call.get("body")
        if body is not None:
            lines.append("  body: " + esc(str(body)))
        if call.get("proves"):
            lines.append("  proves: " + esc(str(call["proves"])))
        for note in call.get("notes", []) or []:
            lines.append("  " + esc(str(note)))
    notes = shown.get("notes")
    for note in notes if isinstance(notes, list) else []:
        lines.append("note: " + esc(str(note)))
    return "\n".join(lines) + "\n"
