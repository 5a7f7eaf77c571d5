"""The process entry point tests use to arm a crash point:

    python -m settled.testing --crash-at after_claim dispatch sim send --params '{}'

runs the ``settled`` command line with ``crashpoints.kill_at(POINT)`` installed in
every ledger, dispatcher and reconciler it makes. The ``settled`` command itself never
arms one, whatever the environment says.
"""

from __future__ import annotations

import sys

from .crashpoints import POINTS, kill_at


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--crash-at":
        print("usage: python -m settled.testing --crash-at POINT SETTLED-ARGS...", file=sys.stderr)
        sys.exit(2)
    point = args[1]
    if point not in POINTS and not point.startswith("before_commit:"):
        print(f"unknown crash point {point!r}; known: {', '.join(POINTS)}", file=sys.stderr)
        sys.exit(2)
    from .cli import common
    from .cli import main as cli_main

    common.STATE.probe = kill_at(point)
    cli_main(args[2:])


if __name__ == "__main__":
    main()
