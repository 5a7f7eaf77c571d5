"""The suite's layout stays honest: ``tests/unit`` holds only pure, ledger-free files
(no real ledger file, no PostgreSQL, no process, no server, no browser; an in-memory
SQLite ledger and ``httpx.MockTransport`` are fine), so ``pytest tests/unit`` is a fast
loop that needs nothing running; everything else is in ``tests/integration``, the modules
both import are in ``tests/helpers`` and the fixtures in ``tests/conftest.py``.

A unit file is read, not run, against these rules:

- its module is marked ``ledger_free`` or ``ledger_incidental`` (``pytestmark``), so
  ``conftest`` never runs it on PostgreSQL;
- it imports nothing that starts a process or a server or reaches a database
  (``subprocess``, ``multiprocessing``, ``socket``, ``psycopg``, ``sqlite3``, Playwright,
  the sim server, ``settled.serve``'s process, the benchmarks), no helper but the pure ones (``records``,
  the constants of ``support``, the budget of ``invariants``) and no integration file;
- no test or fixture in it asks for a fixture that is a ledger, a database or a server
  (``db_path``, ``ledger``, ``location``, ``sim``, ...); ``mem_ledger`` is in memory here;
- it opens no ``Ledger`` but ``":memory:"`` and forks nothing (``os.fork``, ``os.system``).

The rules are checked on hand-written sources too, so a file like the integration ones
put in ``tests/unit`` fails here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

pytestmark = pytest.mark.ledger_free

TESTS = Path(__file__).resolve().parents[1]
UNIT = TESTS / "unit"
INTEGRATION = TESTS / "integration"
HELPERS = TESTS / "helpers"

# Modules a unit file may not import (a prefix matches its submodules too).
FORBIDDEN_MODULES = (
    "subprocess",
    "multiprocessing",
    "concurrent.futures.process",
    "socket",
    "socketserver",
    "http.server",
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "playwright",
    "uvicorn",
    "settled.providers.sim_server",
    "settled.serve.run",
    "settled.testing",
    "bench",  # the benchmarks run real servers, ledgers and processes
)
# The helper modules a unit file may import, and the names it may take from them (None:
# any name).
PURE_HELPERS: dict[str, frozenset[str] | None] = {
    "records": None,
    "support": frozenset({"ROOT", "COMMANDS", "HELPERS", "toml_key", "toml_value", "write_config"}),
    "invariants": frozenset({"budget", "scaled"}),
}
# Fixtures (tests/conftest.py and the helpers') that are a ledger on disk or in
# PostgreSQL, or a server.
FORBIDDEN_FIXTURES = frozenset(
    {
        "backend",
        "location",
        "fresh_location",
        "db_path",
        "ledger",
        "sim",
        "registry",
        "patient",
        "sim_config",
    }
)
RUN_ONCE = frozenset({"ledger_free", "ledger_incidental"})
FORKS = frozenset(
    {"fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp"}
    | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
    | {f"spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}
)


@functools.cache
def _modules(folder: Path) -> frozenset[str]:
    return frozenset(p.stem for p in folder.glob("*.py"))


def _marks(node: ast.expr) -> set[str]:
    """The marker names in a ``pytestmark`` value (one mark or a list of them)."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute):
            if sub.value.attr == "mark":
                found.add(sub.attr)
    return found


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr == "fixture":
            return True
    return False


def _import_problems(node: ast.Import | ast.ImportFrom, tests: frozenset[str]) -> list[str]:
    helpers, integration = _modules(HELPERS), _modules(INTEGRATION)
    if isinstance(node, ast.ImportFrom):
        pairs = [(node.module or "", [a.name for a in node.names])]
    else:
        pairs = [(a.name, None) for a in node.names]
    problems = []
    for module, names in pairs:
        top = module.split(".")[0]
        if any(module == m or module.startswith(m + ".") for m in FORBIDDEN_MODULES) or (
            names and any(f"{module}.{n}" in FORBIDDEN_MODULES for n in names)
        ):
            problems.append(f"imports {module}")
        elif top in integration or (top.startswith("test_") and top not in tests):
            problems.append(f"imports the integration file {top}")
        elif top in helpers:
            allowed = PURE_HELPERS.get(top, frozenset())
            if names is None and top in PURE_HELPERS and allowed is not None:
                problems.append(f"imports {top} whole (take its pure names: from {top} import ...)")
            elif names is None and top not in PURE_HELPERS:
                problems.append(f"imports the helper {top}")
            elif names is not None and allowed is not None:
                problems.extend(f"imports {n} from {top}" for n in names if n not in allowed)
    return problems


def problems_of(source: str, tests: frozenset[str] | None = None) -> list[str]:
    """Why this source may not be a file of tests/unit (nothing: it may). ``tests`` are
    the unit files it may import (the others in tests/unit, by default)."""
    tests = _modules(UNIT) if tests is None else tests
    tree = ast.parse(source)
    problems: list[str] = []
    marks: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
                marks |= _marks(stmt.value) if stmt.value is not None else set()
    if not marks & RUN_ONCE:
        problems.append("its pytestmark is neither ledger_free nor ledger_incidental")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            problems.extend(_import_problems(node, tests))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("test") or _is_fixture(node):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                problems.extend(
                    f"{node.name} asks for the fixture {a.arg}"
                    for a in args
                    if a.arg in FORBIDDEN_FIXTURES
                )
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, what = node.func.value, node.func.attr
            if isinstance(owner, ast.Name) and owner.id == "os" and what in FORKS:
                problems.append(f"calls os.{what}")
            named = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if what == "usefixtures":
                problems.extend(
                    f"uses the fixture {a.value}"
                    for a in node.args
                    if isinstance(a, ast.Constant) and a.value in FORBIDDEN_FIXTURES
                )
            if named == "Ledger" and what == "open":
                first = node.args[0] if node.args else None
                if not (isinstance(first, ast.Constant) and first.value == ":memory:"):
                    problems.append("opens a Ledger that is not in memory")
    return problems


@pytest.mark.parametrize("name", sorted(_modules(UNIT)))
def test_a_unit_file_is_pure_and_ledger_free(name: str) -> None:
    source = (UNIT / f"{name}.py").read_text(encoding="utf-8")
    problems = problems_of(source)
    assert not problems, f"tests/unit/{name}.py belongs in tests/integration: " + "; ".join(
        problems
    )


def test_the_folders_hold_what_they_say() -> None:
    """Test files are in tests/unit or tests/integration, nothing else is; the helper
    modules are in tests/helpers; no name is in two folders (pytest imports a test
    file by its name, and so do the files that import one another)."""
    top = {p.name for p in TESTS.glob("*.py")}
    assert top == {"conftest.py"}, f"move these into tests/helpers, unit or integration: {top}"
    assert all(p.name.startswith("test_") for p in [*UNIT.glob("*.py"), *INTEGRATION.glob("*.py")])
    assert not any(p.name.startswith("test_") for p in HELPERS.glob("*.py"))
    assert not any((TESTS / d / "__init__.py").exists() for d in ("unit", "integration", "helpers"))
    unit, integration, helpers = _modules(UNIT), _modules(INTEGRATION), _modules(HELPERS)
    assert not (unit & integration) and not (unit & helpers) and not (integration & helpers)
    assert len(integration) > len(unit) > 5  # the split happened, both ways


def test_no_unit_run_is_on_postgresql(request: pytest.FixtureRequest) -> None:
    """What collection made of the unit files (all of them when the suite or the folder
    runs): no test of tests/unit has a PostgreSQL run."""
    on_pg = [
        item.nodeid
        for item in request.session.items
        if item.path.is_relative_to(UNIT) and item.get_closest_marker("pg") is not None
    ]
    assert not on_pg


INTEGRATION_STYLE = {
    "a process": (
        "import subprocess\nimport pytest\npytestmark = pytest.mark.ledger_free\n"
        "def test_x():\n    subprocess.run(['true'])\n"
    ),
    "a sim server": (
        "import pytest\nfrom settled.providers.sim_server import SimServer\n"
        "pytestmark = pytest.mark.ledger_free\n"
    ),
    "the CLI as a process": (
        "import pytest\nfrom support import ROOT, run_cli\npytestmark = pytest.mark.ledger_free\n"
    ),
    "the serve helpers": "import pytest\nimport serving\npytestmark = pytest.mark.ledger_free\n",
    "a ledger on both backends": "def test_x(ledger):\n    ledger.records()\n",
    "a ledger file": (
        "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.ledger_incidental]\n"
        "def test_x(db_path):\n    pass\n"
    ),
    "a ledger opened by path": (
        "import pytest\nfrom settled import Ledger\npytestmark = pytest.mark.ledger_free\n"
        "def test_x(tmp_path):\n    Ledger.open(tmp_path / 'l.db')\n"
    ),
    "a server fixture": (
        "import pytest\npytestmark = pytest.mark.ledger_free\n"
        "@pytest.fixture\ndef client(sim):\n    return sim\n"
    ),
    "a browser": (
        "import pytest\nfrom playwright.sync_api import Page\npytestmark = pytest.mark.ledger_free\n"
    ),
    "a ledger through usefixtures": (
        "import pytest\npytestmark = [pytest.mark.ledger_free, pytest.mark.usefixtures('sim')]\n"
    ),
    "a ledger opened through the package": (
        "import pytest\nimport settled\npytestmark = pytest.mark.ledger_free\n"
        "def test_x(tmp_path):\n    settled.Ledger.open(tmp_path / 'l.db')\n"
    ),
    "a fork": "import os\nimport pytest\npytestmark = pytest.mark.ledger_free\nos.fork()\n",
    "an integration file's names": (
        "import pytest\nfrom test_cookbook_standins import toml_of\n"
        "pytestmark = pytest.mark.ledger_free\n"
    ),
}


@pytest.mark.parametrize("kind", sorted(INTEGRATION_STYLE))
def test_an_integration_style_file_is_refused(kind: str) -> None:
    assert problems_of(INTEGRATION_STYLE[kind])


def test_a_pure_file_is_accepted() -> None:
    source = (
        "import pytest\nimport httpx\nfrom records import new_record\nfrom support import ROOT\n"
        "from settled.storage import Ledger\npytestmark = pytest.mark.ledger_free\n"
        "def test_x(mem_ledger, tmp_path):\n    Ledger.open(':memory:')\n"
    )
    assert problems_of(source) == []


def test_the_integration_files_would_be_refused_here() -> None:
    """Each integration file breaks a rule, so none is in tests/integration that could be
    a unit file (the split is honest both ways)."""
    passing = [
        name
        for name in sorted(_modules(INTEGRATION))
        if not problems_of((INTEGRATION / f"{name}.py").read_text(encoding="utf-8"), frozenset())
    ]
    assert not passing, f"pure and ledger-free, so they belong in tests/unit: {passing}"
