"""``settled dispatch null do --from FILE --json`` in this process, with the null
provider registered, for the memory row (``python -m bench._bulk_rss DB FILE``). The
command line is the real one; only the provider costs nothing. Prints one JSON line:
peak RSS (VmHWM) and the time taken."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time

from .common import rss_mb_self
from .fixtures import NullProvider


class _LastLine(io.TextIOBase):
    """A stdout that keeps only the last line written (the summary)."""

    def __init__(self) -> None:
        self.last = ""
        self._tail = ""

    def write(self, text: str) -> int:
        lines = (self._tail + text).split("\n")
        self._tail = lines[-1]
        done = [x for x in lines[:-1] if x]
        if done:
            self.last = done[-1]
        return len(text)


def main() -> int:
    db, src = sys.argv[1], sys.argv[2]
    from settled.cli import common
    from settled.cli import main as cli_main

    built = common.STATE.registry  # the command line closes its session first: add the
    # null provider to whatever registry it builds next

    def registry() -> object:
        reg = built()
        if "null" not in reg.names():
            reg.add(NullProvider())
        return reg

    common.STATE.registry = registry  # type: ignore[method-assign]
    t = time.perf_counter()
    out = _LastLine()
    code = 0
    with contextlib.redirect_stdout(out):  # type: ignore[type-var]
        try:
            cli_main(["--db", db, "dispatch", "null", "do", "--from", src, "--json"])
        except SystemExit as exc:
            code = int(exc.code or 0)
    last = out.last
    seconds = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"dispatch --from exited {code}: {last[:300]}")
    print(json.dumps({"rss_peak": rss_mb_self(), "seconds": seconds, "summary": json.loads(last)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
