"""python -m bench [--quick] [--write] [--only SUITE] [--repeats N]: settled against the
floor, on this machine, now. (``python -m bench agents``: the agent transcript of
``bench/agents.py``.)

Every row times settled and a baseline in the same run, interleaved, and prints the
ratio. Figures are for reading, never for failing a build: shared machines are noisy.
Full mode writes bench/RESULTS.md; quick mode (under a minute) prints only, unless
--write is given. With --only and --write, only those suites' section of RESULTS.md
is replaced (``--only postgres --write``: the PostgreSQL rows).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from .common import Row, durability_line, fmt, machine_line, median, tempdir

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

# Sizes: operations per repeat for the ledger and dispatch rows, HTTP actions, actions per
# process, ledger sizes for the sweep, repeats, and cold starts per command.
QUICK = {
    "ops": 200,
    "http": 200,
    "procs": 150,
    "sizes": [10_000, 100_000],
    "repeats": 3,
    "startup": 9,
    "bulk": 400,
    "latencies": [0.01],
    "bulk_repeats": 1,
    "lines": (1_000, 5_000),
    "seconds_in_turn": 1.0,
    "quick": True,
}
FULL = {
    "ops": 1000,
    "http": 500,
    "procs": 500,
    "sizes": [10_000, 100_000, 1_000_000],
    "repeats": 5,
    "startup": 21,
    "bulk": 2000,
    "latencies": [0.01, 0.05],
    "bulk_repeats": 3,
    "lines": (10_000, 100_000),
    "seconds_in_turn": 2.0,
    "quick": False,
}
SUITES = (
    "ledger",
    "dispatch",
    "http",
    "concurrency",
    "sweep",
    "startup",
    "bulk",
    "postgres",
    "serve",
)


def _bulk(tmp: str, cfg: dict) -> list:
    from . import bulk

    rows = []
    for latency in cfg["latencies"]:
        # about 1-2 s one at a time (a rate is a rate)
        seq = max(40, min(200, round(cfg["seconds_in_turn"] / latency)))
        n = cfg["bulk"]
        rows += bulk.dispatch_rows(tmp, n, seq, cfg["bulk_repeats"], [latency])
        rows += bulk.reconcile_rows(tmp, n, seq, cfg["bulk_repeats"], [latency])
        rows += bulk.reconcile_process_rows(tmp, n, cfg["bulk_repeats"], latency)
    return rows + bulk.rss_rows(tmp, cfg["lines"])


def run(cfg: dict, only: set[str], batch: int) -> tuple[list[Row], str]:
    from . import http_e2e, ledger_ops, postgres, procs, serve, startup, sweep

    rows: list[Row] = []
    with tempdir() as tmp:
        durability = durability_line(f"{tmp}/probe.db")
        steps = [
            ("ledger", lambda: ledger_ops.claim_event(tmp, cfg["ops"], cfg["repeats"])),
            ("dispatch", lambda: ledger_ops.pipeline(tmp, cfg["ops"], cfg["repeats"])),
            ("http", lambda: http_e2e.dispatch_http(tmp, cfg["http"], cfg["repeats"])),
            ("concurrency", lambda: procs.multi_process(tmp, cfg["procs"], cfg["repeats"])),
            (
                "sweep",
                lambda: sweep.sweeps(
                    tmp, cfg["sizes"], max(1, cfg["repeats"] // 2), batch, cfg["quick"]
                ),
            ),
            ("startup", lambda: startup.cold_start(tmp, cfg["startup"])),
            ("bulk", lambda: _bulk(tmp, cfg)),
            ("postgres", lambda: postgres.run(tmp, cfg, batch)),
            (
                "serve",
                lambda: (
                    serve.api_dispatch(tmp, cfg["http"], cfg["repeats"])
                    + serve.callbacks(tmp, cfg["http"], cfg["repeats"])
                ),
            ),
        ]
        for name, step in steps:
            if only and name not in only:
                continue
            t = time.perf_counter()
            print(f"… {name}", file=sys.stderr, flush=True)
            rows += step()
            print(f"  {name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return rows, machine_line(durability)


def _cells(row: Row) -> list[str]:
    rs = sorted(row.ratios)
    spread = " / ".join(row.ratio_text(v) for v in (rs[0], median(rs), rs[-1])) if rs else "-"
    met = {True: "yes", False: "NO", None: ""}[row.met]
    return [
        row.what,
        fmt(row.settled_figure, row.unit),
        fmt(row.baseline_figure, row.unit),
        row.baseline_name,
        row.ratio_text(),
        spread,
        row.target_text(),
        met,
        row.note,
    ]


HEAD = [
    "what",
    "settled",
    "baseline",
    "baseline is",
    "ratio",
    "min / med / max",
    "target",
    "met",
    "note",
]


def text_table(rows: list[Row]) -> str:
    cells = [HEAD] + [_cells(r) for r in rows]
    keep = [0, 1, 2, 4, 5, 6, 7]  # the terminal table leaves the long columns to the file
    widths = [max(len(c[i]) for c in cells) for i in keep]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(c[i].ljust(w) for i, w in zip(keep, widths, strict=True)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: list[Row], machine: str, mode: str, seconds: float) -> str:
    out = [
        "# Benchmarks: what honesty costs",
        "",
        (
            f"Generated by `python -m bench{' --quick --write' if mode == 'quick' else ''}` "
            f"on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC ({mode} mode, {seconds:.0f} s)."
        ),
        "",
        f"Machine: {machine}.",
        "",
        (
            "Each row times settled and its baseline in the same run, interleaved in small "
            "chunks, and gives settled ÷ baseline (for memory, the difference). Ratios are "
            "medians over the repeats; min / med / max are the per-repeat ratios. The "
            "machine is shared, so "
            "absolute figures drift between runs. Targets are what to approach, not "
            "assertions. The analysis of each target is in "
            "[docs/performance.md](../docs/performance.md)."
        ),
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
    ]
    out += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agents"]:  # a different question: not speed, but what a model is told
        from . import agents

        return agents.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="under a minute, smaller sizes")
    parser.add_argument("--write", action="store_true", help="write bench/RESULTS.md (quick)")
    parser.add_argument(
        "--only",
        action="append",
        choices=SUITES,
        default=[],
        help="run only this suite (repeatable)",
    )
    parser.add_argument("--batch", type=int, default=200, help="reconciliation batch size")
    parser.add_argument(
        "--repeats", type=int, default=None, help="repeats of every row (bulk rows included)"
    )
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.repeats:
        cfg.update(repeats=args.repeats, bulk_repeats=args.repeats)
    mode = "quick" if args.quick else "full"
    t = time.perf_counter()
    rows, machine = run(cfg, set(args.only), args.batch)
    seconds = time.perf_counter() - t
    print(f"settled benchmarks, {mode} mode ({seconds:.0f} s)")
    print(f"machine: {machine}")
    print(text_table(rows))
    notes = [f"  {r.what}: {r.note}" for r in rows if r.note]
    if notes:
        print("notes:")
        print("\n".join(notes))
    if (not args.quick or args.write) and not args.only:
        RESULTS.write_text(markdown(rows, machine, mode, seconds), encoding="utf-8")
        print(f"wrote {RESULTS.name}")
    elif args.write and args.only:
        write_section(sorted(set(args.only)), rows, machine, mode, seconds)
        print(f"wrote the {', '.join(sorted(set(args.only)))} section of {RESULTS.name}")
    return 0


def write_section(
    suites: list[str], rows: list[Row], machine: str, mode: str, seconds: float
) -> None:
    """Replace (or add) the section of RESULTS.md that ``--only SUITES`` owns."""
    name = "+".join(suites)
    begin, end = f"<!-- section {name} -->", f"<!-- end section {name} -->"
    body = [
        begin,
        f"## Only {', '.join(suites)}",
        "",
        (
            f"Generated by `python -m bench --only {' --only '.join(suites)} --write"
            f"{' --quick' if mode == 'quick' else ''}` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M}"
            f" UTC ({mode} mode, {seconds:.0f} s). Machine: {machine}."
        ),
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in rows),
        end,
    ]
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else ""
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + "\n".join(body) + tail
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(body) + "\n"
    RESULTS.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
