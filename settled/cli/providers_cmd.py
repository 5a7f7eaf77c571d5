"""settled providers: what each configured operation declares."""

import sys
from typing import Annotated, Any

import typer

from . import options
from .common import STATE, emit_json
from .render import Col, console, is_tty, listing, text
from .typerapp import App

PROVIDERS_HELP = """List each provider/operation: tier, window, attempts, timeout, dedupe, action key, verifier.

A table on a terminal, tab-separated lines on a pipe, an array with --json.

\b
Examples:
  settled providers
  settled --config /etc/settled/settled.toml providers --json | jq '.[].tier'
  settled providers check
  settled providers audit
"""

providers_app = App(
    help=PROVIDERS_HELP,
    invoke_without_command=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

PROVIDER_COLS = [
    Col("provider", lambda r: str(r["provider"])),
    Col("operation", lambda r: str(r["operation"])),
    Col("tier", lambda r: str(r["tier"])),
    Col("window", lambda r: f"{r['consistency_window']:g}s", give_way=4, right=True),
    Col("attempts", lambda r: str(r["attempts"]), give_way=2, right=True),
    Col("timeout", lambda r: f"{r['timeout']:g}s", give_way=1, right=True),
    Col("dedupe", lambda r: "yes" if r["dedupes_keys"] else "no", give_way=3),
    Col("action key", lambda r: str(r.get("action_key") or "-"), give_way=5),
    Col("verified by", lambda r: str(r["verifies"]) or "-", flex=True, min_width=12),
]
# What proves what (rules 19 and 20): a line each under the table, and columns of their
# own at the end of a tab-separated row.
PROOF = (
    ("proves_effect", "effect"),
    ("proves_absence", "absence"),
    ("proves_neither", "neither"),
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
    as_json: Annotated[bool, options.json_output("Rows as a JSON array.")] = False,
) -> None:
    """List configured providers and their operations' declarations."""
    if ctx.invoked_subcommand is not None:
        return
    data = rows()
    if as_json:
        emit_json(data)
        raise typer.Exit(0)
    if not data:
        console().print(
            text(
                "no providers configured: add [providers.NAME] sections to settled.toml "
                "(see README), or run `settled demo`"
            )
        )
        raise typer.Exit(0)
    if not is_tty():
        cols = [*PROVIDER_COLS, *(Col(key, _text_of(key)) for key, _ in PROOF)]
        listing(cols, data, "tsv", title="providers")
        raise typer.Exit(0)
    listing(PROVIDER_COLS, data, "table", title="providers")
    con = console()
    for row in data:
        con.print()
        con.print(text((f"{row['provider']}/{row['operation']}", "bold")))
        for key, label in PROOF:
            con.print(text(f"  {label}: ", str(row.get(key) or "-")))
    raise typer.Exit(0)


def _text_of(key: str) -> Any:
    return lambda r: str(r.get(key) or "-")


@providers_app.command("check")
def check_cmd(
    as_json: Annotated[
        bool,
        options.json_output(
            "The result as one JSON object: {ok, providers, operations, problems}."
        ),
    ] = False,
) -> None:
    """Check the whole configuration as every command's config load does, and name
    every problem, one line each on stderr (exit 1), not only the first; exit 0 when
    there is none. Builds every provider; sends nothing and opens no ledger.

    \b
    Examples:
      settled providers check
      settled --config /etc/settled/settled.toml providers check --json | jq .problems
    """
    from ..errors import ConfigError

    problems: list[str] = []
    names: list[str] = []
    operations = 0
    try:
        reg = STATE.registry()
    except ConfigError as exc:
        problems = exc.problems
    else:
        problems = reg.problems()
        names = reg.names()
        for name in names:
            try:
                operations += len(reg.provider(name).operations())
            except ConfigError:
                continue
    code = 1 if problems else 0
    if as_json:
        emit_json(
            {"ok": not problems, "providers": names, "operations": operations, "problems": problems}
        )
    from ..display import one_line, term

    for problem in problems:
        sys.stderr.write(f"settled: error: {term(one_line(problem), limit=2000)}\n")
    if not problems and not as_json:
        console().print(
            text(f"ok: {len(names)} provider(s), {operations} operation(s), no problem found")
        )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.add_typer(providers_app, name="providers")


@providers_app.command("audit")
def audit_cmd(
    as_json: Annotated[bool, options.json_output("The audit as one JSON object.")] = False,
) -> None:
    """Which operations would lie, and which declared windows the ledger contradicts.

    Answers five questions per operation, adds figures from the ledger, and suggests
    changes. Exit 4 when any operation carries completion-ownership debt; exit 1 when
    there is no ledger.

    \b
    Examples:
      settled providers audit
      settled providers audit --json | jq .debt
    """
    from ..audit import audit

    reg = STATE.registry()
    reg.load_all()
    specs = {
        (name, op): spec
        for name in reg.names()
        for op, spec in reg.provider(name).operations().items()
    }
    report = audit(STATE.ledger(read_only=True), specs, STATE.config().callbacks)
    code = 4 if report.debt else 0
    if as_json:
        emit_json(report.to_json())
        raise typer.Exit(code)
    render_audit(report)
    raise typer.Exit(code)


def _answer(i: int) -> Any:
    def cell(op: Any) -> str:
        if len(op.answers) <= i:
            return "-"
        a = op.answers[i]
        return str(a.answer) + ("!" if a.debt else "")

    return cell


def render_audit(report: object) -> None:
    from ..audit import QUESTIONS, AuditReport

    assert isinstance(report, AuditReport)
    con = console()
    if not report.operations:
        con.print(text("nothing to audit: no providers configured and no records in the ledger"))
        return
    cols = [
        Col("provider/operation", lambda op: f"{op.provider}/{op.operation}"),
        Col("tier", lambda op: str(op.spec.tier) if op.spec else "not configured"),
        *(Col(f"q{i + 1}", _answer(i)) for i in range(5)),
        Col("debt", lambda op: "DEBT" if op.debt else ""),
    ]
    listing(cols, report.operations, "table" if is_tty() else "tsv", title="providers audit")
    for q, qtext in QUESTIONS.items():
        con.print(text(f"  {q}: {qtext}"))
    for op in report.operations:
        f = op.figures
        con.print()
        con.print(text((f"{op.provider}/{op.operation}", "bold")))
        for a in op.answers:
            if a.answer != "yes":
                con.print(text(f"  {a.question} {a.answer}: ", a.why))
        if op.spec is not None:
            for key, label in PROOF:
                shown = op.spec.to_json().get(key)
                if shown:
                    con.print(text(f"  {label}: ", str(shown)))
        rate = f"{f.unresolved_rate:.0%}" if f.unresolved_rate is not None else "-"
        con.print(
            text(
                f"  records {f.total}: confirmed {f.confirmed}, failed {f.failed}, "
                f"unresolved {f.unresolved} ({rate}), pending {f.pending}"
                + (
                    f"; confirmed by callback {f.confirmed_by_callback}"
                    if f.confirmed_by_callback
                    else ""
                )
            )
        )
        if f.first_seen_n:
            window = f"{op.spec.consistency_window:g} s" if op.spec else "-"
            con.print(
                text(
                    f"  first observation: p50 {f.first_seen_p50:g} s, p95 {f.first_seen_p95:g} s "
                    f"over {f.first_seen_n} (window {window})"
                )
            )
        if op.callbacks:
            con.print(text("  callbacks: ", op.callbacks))
        for s in op.suggestions:
            con.print(text("  → ", s))
    for provider, kept in report.callbacks.items():
        con.print()
        weak = (
            f" ({kept['scheme']} scheme: weaker, the body is not signed)" if kept["weaker"] else ""
        )
        con.print(
            text(
                (f"callbacks of {provider}", "bold"),
                f": {kept['scheme'] or 'not configured here'}{weak}",
            )
        )
        oldest = f", oldest pending since {kept['oldest_pending']}" if kept["pending"] else ""
        con.print(
            text(
                f"  matched {kept['matched']}, pending {kept['pending']}{oldest}, "
                f"expired {kept['expired']} (pending: they name no record yet; expired: "
                "never matched, kept, never applied)"
            )
        )
    if report.debt:
        con.print()
        con.print(text(f"completion-ownership debt: {', '.join(report.debt)}"))


@providers_app.command("render")
def render_cmd(
    provider: str = typer.Argument(
        ..., metavar="PROVIDER", help="The provider, as named in settled.toml."
    ),
    operation: str = typer.Argument(..., metavar="OPERATION", help="The operation."),
    params: options.Params = None,
    action_id: str | None = typer.Option(
        None, "--action-id", metavar="ID", help="The action id to show (default ACTION-ID)."
    ),
    key: str | None = typer.Option(
        None, "--key", metavar="KEY", help="The reconciliation key to show (default stl-KEY)."
    ),
    object_id: str | None = typer.Option(
        None, "--object-id", metavar="ID", help="The provider object id a query by id would use."
    ),
    as_json: Annotated[
        bool, options.json_output("The request and query as one JSON object.")
    ] = False,
) -> None:
    """Print the exact request an operation would send for these params (method, URL,
    headers with secrets as ***, body) and the query that would verify it. Sends
    nothing and records nothing.

    \b
    Examples:
      settled providers render mail send --params '{"to": "a@example.com"}'
      settled providers render stripe refund --params @refund.json --json
    """
    from ..errors import InvalidInput
    from .inputs import parse_params

    values = parse_params(params)
    prov = STATE.registry().provider(provider)
    STATE.registry().operation(provider, operation)  # an unknown operation: exit 1, named
    render = getattr(prov, "render", None)
    if render is None:
        raise InvalidInput(
            f"provider {provider!r} cannot show its requests (its type has no render)"
        )
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
    from ..providers._redact import escape_controls as esc

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
