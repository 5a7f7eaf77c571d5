"""The import graph, every import read: module level, TYPE_CHECKING blocks and inside
functions alike (an ast walk of the whole module). It holds three nevers and one rule:

- no shell (`cli/`, `agents/`, `serve/`, `integrations/`) imports another;
  a CLI command may start another shell's entry point, and those few are named below
  with the reason;
- nothing below the shells imports them;
- only the shells (and the two process entry points) import the package root;
- an import inside a function is an arrow hidden from every reader, so outside the
  CLI's command bodies (where the cold start needs it) each one is listed here with
  its reason; and the graph has no circle.

The test fails on anything outside these lists, and on an entry of a list that the
code no longer needs, so the lists only shrink."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.ledger_free

PKG = ROOT / "settled"
ROOT_MODULE = "__init__.py"
SHELLS = ("cli/", "agents/", "serve/", "integrations/")
# The processes' entry points: each runs one shell, and may import it (and no other).
ENTRY_POINTS = {
    "__main__.py": ("cli/", "`python -m settled` runs the CLI"),
    "testing.py": ("cli/", "`python -m settled.testing` runs the CLI, a crash point armed"),
}

# A CLI command that starts another shell: (importing module, imported module) → why.
STARTS = {
    ("cli/mcp_cmd.py", "agents/mcp_server.py"): "`settled mcp` starts the MCP server",
    ("cli/serve_cmd.py", "serve/asgi.py"): "`settled serve` builds the application",
    ("cli/serve_cmd.py", "agents/mcp_server.py"): "`settled serve` mounts it at /mcp",
    ("cli/serve_cmd.py", "serve/run.py"): "`settled serve` binds and runs the service",
}

# Imports inside a function outside the CLI: (importing module, imported module) → why.
LAZY = {
    ("session.py", "callbacks/hooks.py"): "the callback core only when a hook arrives",
    ("session.py", "config.py"): "settled.toml read on first use, not to open a ledger",
    ("session.py", "dispatch.py"): "a read-only command never builds a dispatcher",
    ("session.py", "providers/__init__.py"): "providers (httpx) only for a command that sends",
    ("session.py", "reconcile.py"): "a read-only command never builds a reconciler",
    ("session.py", "storage/__init__.py"): "the backend's driver loads with the ledger",
    ("session.py", "storage/ledger.py"): "the ledger's interface loads with the ledger",
    ("storage/__init__.py", "storage/postgres.py"): "psycopg is an extra, loaded for pg only",
    ("storage/__init__.py", "storage/sqlite.py"): "a pg ledger never loads sqlite's backend",
    ("providers/__init__.py", "providers/_wire.py"): "httpx only when a provider is built",
    ("config.py", "callbacks/settings.py"): "the callback config only when callbacks are set",
    ("dispatch.py", "bulk.py"): "a single dispatch never loads the bulk path",
    ("dispatch.py", "reconcile.py"): "a dispatch that sends never loads the reconciler",
    ("bulk.py", "reconcile.py"): "the check before a bulk retry only when asked for",
    ("bulk.py", "resolve.py"): "verdicts only for a bulk retry that checks first",
    ("resolve.py", "reconcile.py"): "the check before a verdict only when asked for",
    ("toolbox.py", "dispatch.py"): "`import settled.agents` stays light for @tool",
    ("toolbox.py", "wait.py"): "`import settled.agents` stays light for @tool",
    ("agents/mcp_server.py", "agents/mcp_stdio.py"): "the stdio transport only for stdio",
    ("log.py", "clock.py"): "the log's writer loads nothing of the core",
    ("advice.py", "dispatch.py"): "a table's next step never loads the dispatcher",
    ("advice.py", "policy.py"): "a table's next step never loads the policy",
    ("advice.py", "reconcile.py"): "a table's next step never loads the reconciler",
    ("display.py", "providers/_redact.py"): "the providers load only for a redacted view",
    ("selection.py", "storage/query.py"): "the ledger's interface loads with a sort or search",
    (
        "serve/callback_routes.py",
        "callbacks/hooks.py",
    ): "the callback core loads with the first hook",
    ("serve/run.py", "errors.py"): "imported where the rare error is raised",
    ("serve/run.py", "serve/connections.py"): "the connection cap only when serving",
    ("serve/run.py", "session.py"): "the session only when the service opens",
    ("serve/run.py", "toolbox.py"): "the MCP toolbox only when the service opens",
    ("serve/run.py", "sweep.py"): "the sweeper only when the service opens",
    ("serve/run.py", "metrics.py"): "metrics only when the service opens",
    ("serve/run.py", "notify.py"): "systemd's notifier only when the service opens",
    ("serve/run.py", "outage.py"): "the outage timer only when the service sweeps",
    ("serve/run.py", "config.py"): "the outage default only when the service sweeps",
}


@dataclass(frozen=True)
class Import:
    source: str  # module path under settled/, as `serve/api.py`
    line: int
    target: str  # the module file imported (or the one the name lies in)
    in_function: bool


def modules() -> list[str]:
    return sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))


def _module_name(path: str) -> str:
    parts = ["settled", *Path(path).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KNOWN = {_module_name(p): p for p in modules()}


def _path_of(name: str) -> str | None:
    while name:
        if name in KNOWN:
            return KNOWN[name]
        name = name.rpartition(".")[0]
    return None


def imports_of(path: str) -> Iterator[Import]:
    """Every import of settled the module makes, wherever it stands in the module."""
    tree = ast.parse((PKG / path).read_text(encoding="utf-8"))
    me = _module_name(path)
    package = me if path.endswith("__init__.py") else me.rpartition(".")[0]

    def walk(node: ast.AST, in_function: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for a in child.names:
                    if (target := _path_of(a.name)) is not None:
                        yield Import(path, child.lineno, target, in_function)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, *([child.module] if child.module else [])])
                if not base.startswith("settled"):
                    continue
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    target = KNOWN[sub] if sub in KNOWN else _path_of(base)
                    if target is not None:
                        yield Import(path, child.lineno, target, in_function)
            yield from walk(child, inner)

    yield from walk(tree, False)


def all_imports() -> list[Import]:
    # The package root loads every public name lazily (PEP 562): it stands outside the
    # graph, as docs/architecture.md says.
    return [i for p in modules() if p != ROOT_MODULE for i in imports_of(p) if i.source != i.target]


def shell_of(path: str) -> str | None:
    return next((s for s in SHELLS if path.startswith(s)), None)


def _report(found: dict[tuple[str, str], Import], what: str) -> list[str]:
    return [
        f"settled/{i.source}:{i.line} imports settled/{i.target}: {what}"
        for _, i in sorted(found.items())
    ]


def _pairs(keep: object) -> dict[tuple[str, str], Import]:
    out: dict[tuple[str, str], Import] = {}
    for i in all_imports():
        if keep(i):  # type: ignore[operator]
            out.setdefault((i.source, i.target), i)
    return out


def _crosses_shells(i: Import) -> bool:
    src, dst = shell_of(i.source), shell_of(i.target)
    return src is not None and dst is not None and src != dst


def test_no_shell_imports_another() -> None:
    found = _pairs(_crosses_shells)
    bad = {k: i for k, i in found.items() if k not in STARTS}
    assert not bad, "\n".join(
        _report(
            bad,
            "one shell imports another; move the rule both need below the shells (a CLI "
            "command that starts a shell names it in STARTS with the reason)",
        )
    )


def test_an_entry_point_imports_only_the_shell_it_runs() -> None:
    def strays(i: Import) -> bool:
        runs = ENTRY_POINTS.get(i.source, (None, ""))[0]
        return runs is not None and shell_of(i.target) not in (None, runs)

    bad = _pairs(strays)
    assert not bad, "\n".join(_report(bad, "an entry point imports a shell it does not run"))


def test_nothing_below_the_shells_imports_them() -> None:
    def below(i: Import) -> bool:
        return (
            shell_of(i.source) is None
            and i.source not in ENTRY_POINTS
            and shell_of(i.target) is not None
        )

    bad = _pairs(below)
    assert not bad, "\n".join(
        _report(bad, "a module below the shells imports one; the shell imports it instead")
    )


def test_only_the_shells_import_the_package_root() -> None:
    def reaches_root(i: Import) -> bool:
        return (
            i.target == ROOT_MODULE and shell_of(i.source) is None and i.source not in ENTRY_POINTS
        )

    bad = _pairs(reaches_root)
    assert not bad, "\n".join(
        _report(bad, "import it from the module that defines it, not the package root")
    )


def test_an_import_inside_a_function_is_listed_with_its_reason() -> None:
    def hidden(i: Import) -> bool:
        # The CLI's command bodies load the core only for the command that runs.
        return i.in_function and shell_of(i.source) != "cli/" and i.source not in ENTRY_POINTS

    bad = {k: i for k, i in _pairs(hidden).items() if k not in LAZY}
    assert not bad, "\n".join(
        _report(
            bad,
            "an import inside a function hides an arrow; import it at the top of the "
            "module, or list it in LAZY with the reason the cold start needs it",
        )
    )
    for reason in LAZY.values():
        assert reason and len(reason) <= 80


def _circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_has_no_circle() -> None:
    edges = {(i.source, i.target) for i in all_imports()}
    circles = _circles(edges)
    assert not circles, "\n".join(
        "these modules import each other (every import read): " + " ↔ ".join(c) for c in circles
    )


def test_every_listed_exception_is_still_made() -> None:
    """An entry the code no longer needs is removed, so the lists only shrink."""
    made = {(i.source, i.target) for i in all_imports()}
    hidden = {(i.source, i.target) for i in all_imports() if i.in_function}
    stale = [
        *(
            f"STARTS lists {a} → {b}, which no longer imports it"
            for a, b in STARTS
            if (a, b) not in made
        ),
        *(
            f"LAZY lists {a} → {b}, which is no longer imported inside a function"
            for a, b in LAZY
            if (a, b) not in hidden
        ),
    ]
    assert not stale, "\n".join(stale)
    for a, _ in STARTS:
        assert a.startswith("cli/"), "only a CLI command may start another shell"


def test_the_reader_sees_every_kind_of_import() -> None:
    """So that a reader that finds nothing cannot pass: a module-level import, one
    inside TYPE_CHECKING, one inside a function and a relative one two levels up are
    all seen, and a test module's own circle is found."""
    seen = {(i.target, i.in_function) for i in imports_of("session.py")}
    assert ("dispatch.py", True) in seen  # inside a method
    assert ("clock.py", False) in {(i.target, i.in_function) for i in imports_of("dispatch.py")}
    assert "model.py" in {i.target for i in imports_of("policy.py")}
    assert ROOT_MODULE in {i.target for i in imports_of("cli/commands.py")}  # `from .. import`
    assert len(modules()) > 90 and len(all_imports()) > 1000
    assert _circles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


def test_every_module_file_name_is_used_once() -> None:
    """Two files of one name (`app.py` in two shells, say) send a newcomer to the wrong
    one; every module's file name is its own, `__init__.py` aside."""
    seen: dict[str, list[str]] = {}
    for path in modules():
        seen.setdefault(Path(path).name, []).append(path)
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    twice.pop("__init__.py", None)
    assert not twice, f"file names used more than once: {twice}"
