"""The process entry point tests use to arm a crash point:

    python -m settled.testing --crash-at after_claim dispatch sim send --params '{}'
    python -m settled.testing --pause-at after_claim dispatch sim send --params '{}'

runs the ``settled`` command line with a probe installed in every ledger, dispatcher
and reconciler it makes: ``--crash-at`` SIGKILLs the process at that point,
``--pause-at`` stops it there (SIGSTOP; the test sends SIGCONT), as Ctrl-Z or a
paused VM would. The ``settled`` command itself never arms one, whatever the
environment says.
"""

from __future__ import annotations

import sys

from .crashpoints import POINTS, kill_at, pause_at

ARMS = {"--crash-at": kill_at, "--pause-at": pause_at}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ARMS:
        print(
            "usage: python -m settled.testing (--crash-at|--pause-at) POINT SETTLED-ARGS...",
            file=sys.stderr,
        )
        sys.exit(2)
    point = args[1]
    numbered = point.rpartition(":")[0] in POINTS and point.rpartition(":")[2].isdigit()
    if point not in POINTS and not numbered and not point.startswith("before_commit:"):
        print(f"unknown crash point {point!r}; known: {', '.join(POINTS)}", file=sys.stderr)
        sys.exit(2)
    from .cli import common
    from .cli import main as cli_main

    common.STATE.probe = ARMS[args[0]](point)
    cli_main(args[2:])


if __name__ == "__main__":
    main()
