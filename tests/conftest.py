"""Shared fixtures. Every test gets its own ledger and config paths (autouse) and a
real sim provider on loopback when it asks for one. Plain helpers (running `settled`
as a real OS process, writing a settled.toml) live in tests/helpers/support.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pg_schemas as pg
import pytest
import support
from support import sim_conf, write_config

from settled import Ledger
from settled.providers import Registry
from settled.providers.sim_server import SimServer

# -- backends ---------------------------------------------------------------------------------
#
# Every test that touches a ledger runs twice: against a SQLite file and against a fresh
# PostgreSQL schema (``backend`` is parametrised in ``pytest_generate_tests``). Markers
# say otherwise, on a test or a whole module (``pytestmark``):
#
# - ``ledger_free``: it never opens a ledger (docs, usage text, config parsing, the
#   model); it runs once.
# - ``ledger_incidental``: the ledger is on the way to what it proves, not the subject
#   (providers against real and simulated servers, request shapes, the fault matrices
#   of provider replies, rendering, the agents' tool surfaces). The ledger operations
#   they use are the ones the ledger, flow, CLI and reliability modules run on both
#   backends; run once, on SQLite, they keep the suite within its time on two cores.
# - ``sqlite_only``: about the SQLite file itself (modes, WAL, locking, corruption).
# - ``postgres_only``: about PostgreSQL itself.
#
# A test's PostgreSQL run also carries the ``pg`` marker, so ``-m "not pg"`` leaves the
# PostgreSQL half out (the fast loop, docs/reliability.md).

ON_SQLITE = pytest.param("sqlite", id="sqlite")
ON_POSTGRES = pytest.param("postgres", id="pg", marks=pytest.mark.pg)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ledger_free: opens no ledger; runs once")
    config.addinivalue_line("markers", "sqlite_only: about the SQLite file itself; runs once")
    config.addinivalue_line("markers", "postgres_only: about the PostgreSQL ledger itself")
    config.addinivalue_line("markers", "pg: this run of the test is on PostgreSQL (set here)")
    config.addinivalue_line(
        "markers", "ledger_incidental: the ledger is not what it proves; runs once, on SQLite"
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):  # once, before the workers start
        pg.vacuum_catalogs()
        _compile_settled()


def _compile_settled() -> None:
    """Write settled's bytecode, as ``pip install`` of a wheel does. An editable install
    writes none, and with ``PYTHONDONTWRITEBYTECODE`` set (some CI images and
    containers set it) no process writes it: then every new interpreter the suite
    starts (``settled serve``, a command under libfaketime, a ``python -c`` probe)
    compiled all of settled from source first, about 0.2 s of CPU each."""
    import compileall

    import settled

    compileall.compile_dir(os.path.dirname(settled.__file__), quiet=1)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    node = metafunc.definition
    if node.get_closest_marker("postgres_only"):
        metafunc.parametrize("backend", [ON_POSTGRES], indirect=True)
    elif (
        node.get_closest_marker("sqlite_only")
        or node.get_closest_marker("ledger_incidental")
        or node.get_closest_marker("ledger_free")
    ):
        return
    else:
        metafunc.parametrize("backend", [ON_SQLITE, ON_POSTGRES], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files run first, each file's tests in their order: the workers take
    whole files in this order (``--dist loadfile``), so the long runs start at once and
    the many short files fill in around them, instead of a long file starting last
    while the other workers have nothing left to do. A file's cost is the ``seconds``
    its ``slow`` marker gives (about how long it takes on 2 cores), 10 for a ``slow``
    that gives none, 0 when nothing in it is slow."""
    cost: dict[Path, float] = {}
    for item in items:
        for mark in item.iter_markers("slow"):  # the test's own and its module's
            cost[item.path] = max(cost.get(item.path, 0), mark.kwargs.get("seconds", 10))
    items.sort(key=lambda item: -cost.get(item.path, 0))  # stable: files and tests keep order


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str = getattr(request, "param", "sqlite")
    if name == "postgres":
        reason = pg.unavailable()
        if reason is not None:
            if os.environ.get("SETTLED_REQUIRE_POSTGRES") == "1":
                pytest.fail(f"PostgreSQL is required (SETTLED_REQUIRE_POSTGRES=1): {reason}")
            pytest.skip(f"PostgreSQL half skipped: {reason}")
    return name


@pytest.fixture
def location(backend: str, tmp_path: Path) -> Iterator[Any]:
    """Where this test's ledger is: a file path (SQLite) or the URL of a fresh, empty
    schema of its own (PostgreSQL), dropped afterwards."""
    if backend == "sqlite":
        yield tmp_path / "ledger.db"
        return
    url = pg.new_schema()
    try:
        yield url
    finally:
        pg.drop(url)


@pytest.fixture
def fresh_location(backend: str, tmp_path: Path) -> Iterator[Callable[[str], Any]]:
    """Make another new, empty ledger location of this test's backend (``name`` is the
    file name for SQLite)."""
    made: list[str] = []

    def make(name: str) -> Any:
        if backend == "sqlite":
            return tmp_path / name
        made.append(pg.new_schema())
        return made[-1]

    try:
        yield make
    finally:
        for url in made:
            pg.drop(url)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: Any) -> None:
    monkeypatch.setenv("SETTLED_DB", str(location))
    monkeypatch.setenv("SETTLED_CONFIG", str(tmp_path / "settled.toml"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SETTLED_DEBUG", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    (tmp_path / "settled.toml").write_text("")


@pytest.fixture(autouse=True)
def _reaped() -> Iterator[None]:
    """No `settled` a test started outlives it (those of wider-scoped fixtures, set up
    before this, are left to their fixtures)."""
    since = len(support.STARTED)
    yield
    support.reap(since)


@pytest.fixture
def db_path(location: Any) -> Any:
    """The ledger's location: a ``Path`` for SQLite, a URL for PostgreSQL."""
    return location


@pytest.fixture
def ledger(db_path: Any) -> Iterator[Ledger]:
    with Ledger.open(db_path) as led:
        yield led


@pytest.fixture
def mem_ledger(backend: str, location: Any) -> Iterator[Ledger]:
    with Ledger.open(":memory:" if backend == "sqlite" else location) as led:
        yield led


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(hang=1.0) as server:
        yield server


@pytest.fixture
def registry(sim: SimServer) -> Iterator[Registry]:
    reg = Registry({"sim": sim_conf(sim)}, source="test")
    yield reg
    reg.close()


@pytest.fixture
def patient(sim: SimServer) -> Iterator[Registry]:
    """``registry`` for tests none of whose replies is meant to time out (support.PATIENT)."""
    reg = Registry({"sim": sim_conf(sim, timeout=support.PATIENT)}, source="test")
    yield reg
    reg.close()


@pytest.fixture
def sim_config(tmp_path: Path, sim: SimServer) -> Path:
    """settled.toml pointing the `sim` provider at the test's sim server."""
    return write_config(tmp_path / "settled.toml", {"sim": sim_conf(sim)})
