"""One command runs every check: the lint and the type checks run as tests, with the
configuration in pyproject.toml (mypy strict on the whole package)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.ledger_free


def test_ruff_is_clean() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "settled", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_ruff_format_is_applied() -> None:
    """pyproject says the formatter wraps at 100; this holds every file to it."""
    p = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_is_clean() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stdout + p.stderr


SQL = re.compile(
    r"\b(SELECT\b[^;]{0,200}?\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|CREATE\s+(TABLE|INDEX|TRIGGER|SCHEMA)|DROP\s+(TABLE|SCHEMA)|PRAGMA\s+\w+|BEGIN\s+IMMEDIATE)\b"
)
DRIVERS = ("sqlite3", "sqlite_utils", "psycopg", "psycopg_pool")


def test_no_sql_and_no_database_driver_outside_the_storage_package() -> None:
    """The ledger owns every statement (settled/storage): no SQL text and no driver
    import anywhere else in the package, so every storage error is mapped in one place."""
    found = []
    for path in sorted((ROOT / "settled").rglob("*.py")):
        if "storage" in path.relative_to(ROOT / "settled").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if SQL.search(node.value):
                    found.append(f"{where}: SQL text {node.value[:60]!r}")
            elif isinstance(node, ast.Import):
                found += [
                    f"{where}: imports {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in DRIVERS
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DRIVERS:
                found.append(f"{where}: imports from {node.module}")
    assert found == []


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    where = ROOT.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def settled_imports(path: Path, *, at_load: bool = False) -> set[str]:
    """The settled modules ``path`` imports: everywhere in it (inside functions and
    ``if TYPE_CHECKING`` too), or with ``at_load`` only its top-level statements."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = _module(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body if at_load else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "settled"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "settled":
                continue
            subs = {f"{source}.{a.name}" for a in node.names if _is_module(f"{source}.{a.name}")}
            found |= subs
            if node.module or not subs:  # `from . import x` loads x, not its package again
                found.add(source)
    return found - {me}


def import_graph(*, at_load: bool = False) -> dict[str, set[str]]:
    paths = {_module(p): p for p in sorted((ROOT / "settled").rglob("*.py"))}
    return {m: settled_imports(p, at_load=at_load) & set(paths) for m, p in paths.items()}


def test_the_pure_policy_imports_the_model_only() -> None:
    """The policy decides from the domain's words alone: the record, the ``Move`` it
    returns and the wire's data types are all ``settled.model``'s; the model itself
    leans only on the clock's pure text helpers and the errors."""
    allowed = {
        "settled.policy": {"settled.model", "settled.clock"},
        "settled.model": {"settled.clock", "settled.errors"},
        "settled.clock": set(),
        "settled.errors": set(),
    }
    for module, may in allowed.items():
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        assert settled_imports(path) <= may, (module, sorted(settled_imports(path) - may))


def test_settled_sleeps_through_clock_nap_never_time_sleep() -> None:
    """``time.sleep`` sleeps to a deadline that libfaketime's step back (the suite's
    clock steps, rule 12) turns invalid: every sleep of a stepped process failed with
    EINVAL, and a daemon's passes with it. ``clock.nap`` sleeps the same time on the
    steady clock."""
    import ast

    found = []
    for path in sorted((ROOT / "settled").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "sleep"
                and isinstance(node.value, ast.Name)
                and node.value.id == "time"
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_bulk_reaches_the_dispatcher_only_through_its_seam() -> None:
    """Bulk and dispatch are one component without a circle: ``settled.dispatch``
    starts a bulk run, and nothing ``settled.bulk`` imports, even for types or inside
    a function, leads back to it; the words both share are ``settled.sending``'s."""
    graph = import_graph()
    seen: set[str] = set()
    todo = ["settled.bulk"]
    while todo:
        for nxt in graph[todo.pop()] - seen - {"settled"}:  # the package's lazy names
            seen.add(nxt)
            todo.append(nxt)
    assert "settled.dispatch" not in seen
    assert not graph["settled.sending"] & {"settled.bulk", "settled.dispatch"}


def test_no_module_imports_itself_back_while_it_loads() -> None:
    """Top-level imports form no circle: a module never depends on one that is still
    half loaded (imports inside functions stay lazy for the cold start)."""
    graph = import_graph(at_load=True)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for nxt in sorted(graph[module]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [module, nxt]
            if nxt not in state and (circle := visit(nxt, [*path, nxt])):
                return circle
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state:
            assert visit(module, [module]) == []


# Typer options are typed as they are: a parameter whose default is None is declared
# `X | None`, so mypy sees the None a command receives when the option is not given.
CLI = ROOT / "settled" / "cli"


def typer_parameters(tree: ast.AST) -> list[tuple[ast.arg, ast.Call]]:
    """Every function parameter whose default is a `typer.Option(...)` or
    `typer.Argument(...)` call."""
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        positional = fn.args.posonlyargs + fn.args.args
        pairs = list(
            zip(
                positional[len(positional) - len(fn.args.defaults) :], fn.args.defaults, strict=True
            )
        )
        pairs += [
            (a, d)
            for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
            if d is not None
        ]
        for arg, default in pairs:
            if (
                isinstance(default, ast.Call)
                and isinstance(default.func, ast.Attribute)
                and isinstance(default.func.value, ast.Name)
                and default.func.value.id == "typer"
                and default.func.attr in ("Option", "Argument")
            ):
                found.append((arg, default))
    return found


def defaults_to_none(call: ast.Call) -> bool:
    first = call.args[0] if call.args else None
    for kw in call.keywords:
        if kw.arg == "default":
            first = kw.value
    return isinstance(first, ast.Constant) and first.value is None


def accepts_none(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    nones = [n for n in ast.walk(annotation) if isinstance(n, ast.Constant) and n.value is None]
    return bool(nones) or "Optional" in names or "Any" in names


def test_every_option_with_a_none_default_is_declared_optional() -> None:
    wrong = []
    seen = 0
    for path in sorted(CLI.glob("*.py")):
        for arg, call in typer_parameters(ast.parse(path.read_text())):
            seen += 1
            if defaults_to_none(call) and not accepts_none(arg.annotation):
                declared = ast.unparse(arg.annotation) if arg.annotation else "undeclared"
                wrong.append(f"{path.name}:{arg.lineno} {arg.arg}: {declared}")
    assert seen > 50  # the scan found the CLI's options
    assert wrong == []


def test_the_check_sees_a_wrong_declaration() -> None:
    bad = "import typer\ndef cmd(db: str = typer.Option(None, '--db')) -> None: ...\n"
    good = "import typer\ndef cmd(db: str | None = typer.Option(None, '--db')) -> None: ...\n"
    ((arg, call),) = typer_parameters(ast.parse(bad))
    assert defaults_to_none(call) and not accepts_none(arg.annotation)
    ((arg, call),) = typer_parameters(ast.parse(good))
    assert accepts_none(arg.annotation)
