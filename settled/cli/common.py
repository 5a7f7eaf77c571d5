"""What every command shares: the global options, opening the ledger and the
registry once, and rendering records as JSON or for people."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from ..display import config_secrets as _config_secrets
from ..display import one_line
from ..model import Status
from ..session import Session
from .render import STATUS_STYLE  # noqa: F401  (re-exported for renderers elsewhere)

# The exit code that reports a record in each status (the exit codes in the README).
EXIT_BY_STATUS = {
    Status.CONFIRMED: 0,
    Status.PENDING: 3,
    Status.IN_FLIGHT: 3,
    Status.AWAITING_VERIFICATION: 3,
    Status.DENIED_UNRESOLVED: 4,
    Status.FAILED: 5,
}
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_UNRESOLVED = 4
EXIT_NOT_FOUND = 6
EXIT_CONFLICT = 7


def exit_for(exc: Exception) -> int:
    """The exit code of one of settled's own errors (the exit codes in the README)."""
    from ..errors import Conflict, NotFound, OutcomeNotRecorded

    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, OutcomeNotRecorded):  # sent; the record stays IN_FLIGHT
        return EXIT_BY_STATUS[Status.IN_FLIGHT]
    return EXIT_ERROR


def report_exit(report: Any) -> int:
    """The exit code of a dispatch/confirm/retry report (rule 8 in docs/rules.md)."""
    from ..dispatch import Outcome

    if report.outcome is Outcome.NOT_FOUND or report.record is None:
        return EXIT_NOT_FOUND
    if report.outcome is Outcome.BLOCKED:
        return EXIT_UNRESOLVED
    return EXIT_BY_STATUS[report.record.status]


def default_actor() -> str:
    """Who a person at this terminal is, for ``resolve --by``'s default."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


OPERATOR_ENV = "SETTLED_OPERATOR"


def person(by: str | None) -> str:
    """Who a person at this terminal is, for every command that changes a record:
    ``--by``, else ``SETTLED_OPERATOR``, else the OS user. A name the ledger cannot
    keep apart from a surface (`` via ``, control characters) is refused before any
    ledger is opened (exit 1), as the API and the console refuse it."""
    from ..errors import InvalidInput
    from ..model import name_problem

    if by is not None:
        name, where = by, "--by"
    elif os.environ.get(OPERATOR_ENV, "").strip():
        name, where = os.environ[OPERATOR_ENV], OPERATOR_ENV
    else:
        name, where = default_actor(), "the OS user"
    if not name.strip():
        raise InvalidInput(f"{where} must not be empty")
    problem = name_problem(name.strip())
    if problem:
        raise InvalidInput(f"{where}: {problem}")
    return name.strip()


def operator(by: str | None) -> str:
    """The actor of a person's command in the ledger's events: ``operator:NAME``."""
    return f"operator:{person(by)}"


class State(Session):
    """The session every command of one CLI process shares; ``--db`` and ``--config``
    are set by the global options before a command runs. No command migrates a ledger
    as it opens it: an older one is refused with "run `settled migrate`", or, by a
    command that only reads, read as it is when it can be."""

    def __init__(self) -> None:
        super().__init__(migrate=False)  # migrations are explicit: `settled migrate`
        self.extra: dict[str, Any] = {}

    def moved_notice(self, line: str) -> None:
        if self.extra.get("completing"):
            return
        from ..display import term

        print(f"settled: {term(line, limit=2000)}", file=sys.stderr)


STATE = State()


def emit_json(data: Any) -> None:
    """Machine output: exact, on stdout. Serialized whole before anything is written,
    so a failure leaves stdout empty."""
    try:
        out = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    except RecursionError:  # nested deeper than the indenting encoder goes
        out = json.dumps(data, ensure_ascii=False, default=str)
    sys.stdout.write(out + "\n")
    sys.stdout.flush()


def console(stderr: bool = False) -> Any:
    from .render import console as make

    return make(stderr)


class AfterSend(Exception):
    """Something failed after a request had left (or after the record was read):
    the exit code is the record's, and the message says what was sent."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def finish(report: Any, as_json: bool, render: Any) -> int:
    """Print a dispatch/confirm/retry report and return its exit code. Once the
    record exists, a failure while printing it never turns into exit 1: the code is
    the record's, and stderr says what happened to the request (the exit codes in the
    README). A closed stdout (``| head -n 0``) is one such failure."""
    code = report_exit(report)
    try:
        if as_json:
            emit_json(report.to_json())
        else:
            render(report)
    except (Exception, KeyboardInterrupt) as exc:
        rec = report.record
        if rec is None:
            raise
        from ..dispatch import Outcome
        from ..display import term

        gone = stdout_gone(exc)
        if as_json and not gone:
            try:
                emit_json(
                    {
                        "action_id": rec.action_id,
                        "status": str(rec.status),
                        "outcome": str(report.outcome),
                        "result": str(report.result) if report.result else None,
                        "error": f"the full record could not be printed: {type(exc).__name__}",
                    }
                )
            except OSError as again:
                gone = stdout_gone(again)
        what = (
            "the request was sent and recorded"
            if report.outcome is Outcome.DISPATCHED
            else "the action is recorded"
        )
        failed = (
            "stdout was closed before it could be printed"
            if gone
            else f"printing it failed ({type(exc).__name__}: {term(one_line(str(exc)), 200)})"
        )
        raise AfterSend(
            f"{what}: action {term(rec.action_id, 200)} is {rec.status} (exit {code}); "
            f"{failed}; see `settled show {term(rec.action_id, 200)} --json`",
            code,
        ) from None
    return code


def stdout_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says stdout's reader went away (EPIPE). If so, stdout is pointed
    at the null device, so that nothing later (the interpreter's last flush) fails
    on it again or turns the exit code into another."""
    import errno

    if not (isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET)):
        return False
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (embedded, tests)
        pass
    return True


def config_secrets(cfg: Any = None) -> list[str]:
    """The values of the ``${VAR}``s the config (``cfg``, else the CLI's) refers to (to
    keep them out of human views); never loads a provider."""
    try:
        return _config_secrets(cfg if cfg is not None else STATE.config())
    except Exception:
        return []


def known_names(ledger: Any, *, operations: bool = False) -> tuple[set[str], set[tuple[str, str]]]:
    """Provider names, and (provider, operation) pairs, from the ledger and the config
    (the config's operations only with ``operations``: that builds the providers)."""
    pairs = set(ledger.names()) if ledger is not None else set()
    providers = {p for p, _o in pairs}
    try:
        cfg = STATE.config()
    except Exception:
        return providers, pairs
    providers |= set(cfg.providers)
    if not operations:
        return providers, pairs
    try:
        reg = STATE.registry()
        for name in cfg.providers:
            pairs |= {(name, op) for op in reg.provider(name).operations()}
    except Exception:  # noqa: S110 - a provider that cannot be built names no operations
        pass
    return providers, pairs


def check_filters(ledger: Any, provider: str | None, operation: str | None) -> None:
    """An unknown --provider or --operation is an error listing the real names (a
    typo must not look like an empty queue to a monitor)."""
    from ..display import term
    from ..errors import InvalidInput

    if provider is None and operation is None:
        return
    providers, pairs = known_names(ledger)
    if provider is not None and provider not in providers:
        raise InvalidInput(
            f"--provider {term(provider, 100)!s}: no such provider in the config or the ledger; "
            f"known: {term(', '.join(sorted(providers)) or 'none', 500)}"
        )
    if operation is not None:
        ops = {o for p, o in pairs if provider is None or p == provider}
        if operation not in ops:
            _, pairs = known_names(ledger, operations=True)
            ops = {o for p, o in pairs if provider is None or p == provider}
        if operation not in ops:
            where = f" of {term(provider, 100)}" if provider else ""
            raise InvalidInput(
                f"--operation {term(operation, 100)}: no such operation{where} in the config or "
                f"the ledger; known: {term(', '.join(sorted(ops)) or 'none', 500)}"
            )
