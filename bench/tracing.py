"""What traces cost: dispatch to the sim over HTTP, and the CLI's cold start, with the
OpenTelemetry package unavailable, with the API alone (every span a no-op), and with
the SDK recording every span into its in-memory exporter.

    python -m bench.tracing [--actions N] [--repeats R]

Each mode runs in a fresh interpreter (``opentelemetry`` made unimportable for the
first), interleaved, repeat after repeat; the medians are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

MODES = ("not installed", "API only (no-op)", "SDK, in-memory exporter")

DISPATCH = """
import json, sys, time
mode = {mode!r}
if mode == "not installed":
    sys.modules["opentelemetry"] = None
from settled import Ledger, tracing
from settled.dispatch import Dispatcher
from settled.providers import Registry
from settled.providers.sim_server import SimServer
if mode.startswith("SDK"):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    tracing.use(provider)
with SimServer() as sim, Ledger.open(":memory:") as led:
    conf = {{"type": "sim", "base_url": sim.url, "timeout": 2.0}}
    with Registry({{"sim": conf}}, source="bench") as reg:
        d = Dispatcher(led, reg)
        d.submit("sim", "book", {{}}, action_id="warm")
        start = time.perf_counter()
        for n in range({actions}):
            d.submit("sim", "book", {{}}, action_id=f"a-{{n}}")
        took = time.perf_counter() - start
print(json.dumps({{"per_action_ms": took / {actions} * 1000}}))
"""

COLD = """
import sys, time
if {blocked!r}:
    sys.modules["opentelemetry"] = None
start = time.perf_counter()
import settled.cli  # what every command pays before it runs
print((time.perf_counter() - start) * 1000)
"""


def run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--actions", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    dispatch: dict[str, list[float]] = {m: [] for m in MODES}
    cold: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for mode in MODES:
            got = run(DISPATCH.format(mode=mode, actions=args.actions))
            dispatch[mode].append(json.loads(got)["per_action_ms"])
        for blocked in (True, False):
            cold[blocked].append(float(run(COLD.format(blocked=blocked))))
    base = statistics.median(dispatch[MODES[0]])
    print(f"{args.actions} dispatches to the sim per run, {args.repeats} runs, medians")
    print(
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {sys.version.split()[0]})\n"
    )
    print("| dispatch to the sim over HTTP, :memory: ledger | ms per action | vs not installed |")
    print("|---|---|---|")
    for mode in MODES:
        med = statistics.median(dispatch[mode])
        print(f"| {mode} | {med:.3f} | {med / base:.2f}× |")
    print("\n| import settled.cli | ms |")
    print("|---|---|")
    for blocked, label in ((True, "not installed"), (False, "installed")):
        print(f"| {label} | {statistics.median(cold[blocked]):.1f} |")


if __name__ == "__main__":
    main()
