"""The public API is explicit and pinned."""

from __future__ import annotations

import settled


def test_all_is_sorted_and_importable() -> None:
    # isort-style order: CONSTANTS, then Classes, then functions, each alphabetical
    def key(n: str) -> tuple[int, str]:
        return (0 if n.isupper() else 1 if n[0].isupper() else 2, n)

    assert settled.__all__ == sorted(settled.__all__, key=key)
    for name in settled.__all__:
        assert hasattr(settled, name), name


def test_exported_members() -> None:
    assert set(settled.__all__) == {
        "TRANSITIONS",
        "Acceptance",
        "ActionRecord",
        "Clock",
        "Config",
        "ConfigError",
        "Conflict",
        "Declared",
        "Delivery",
        "DispatchSettings",
        "DispatchStrategy",
        "Dispatcher",
        "EffectVisible",
        "Event",
        "EventKind",
        "FakeClock",
        "InvalidInput",
        "Ledger",
        "LedgerBusy",
        "LedgerError",
        "NotFound",
        "Outcome",
        "OutcomeNotRecorded",
        "PassReport",
        "RecheckFailed",
        "Reconciler",
        "Report",
        "Result",
        "Session",
        "SettledError",
        "Status",
        "Tier",
        "TransitionNotAllowed",
        "UnknownProvider",
        "UsageError",
        "build_strategy",
        "check",
        "classify",
        "tool",
    }


def test_core_never_imports_the_shell() -> None:
    import subprocess
    import sys

    code = (
        "import sys, settled, settled.ledger, settled.dispatch, settled.reconcile, settled.resolve;"
        "bad = [m for m in ('typer', 'rich', 'click') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
