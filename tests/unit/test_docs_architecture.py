"""docs/architecture.md is checked against the code: every module of settled/ has its
one paragraph there (and every paragraph a module), under the heading of its layer, and
the layer diagram's edges are exactly the imports between layers that the code makes at
module level (found with ast, TYPE_CHECKING imports included; an import inside a
function is how the shells and the cold start stay light, and is not a layer edge).

When a module is added, moved or removed, or an import crosses layers in a new way, the
failure says which module and what to write, so the doc is fixed in the same change."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.ledger_free

DOC = ROOT / "docs" / "architecture.md"
PKG = ROOT / "settled"
# The package root re-exports the public names (it may import every layer, lazily);
# below it, a module may read only its version from it.
ROOT_MODULE = "__init__.py"
ROOT_NAMES_ALLOWED = {"__version__"}


@dataclass
class Layer:
    node: str
    title: str
    paths: list[str] = field(default_factory=list)


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def diagram(text: str) -> tuple[dict[str, Layer], set[tuple[str, str]]]:
    """The mermaid block's nodes (each `id["Title<br/>path · path"]`) and edges (`a --> b`)."""
    block = re.search(r"```mermaid\n(.*?)```", text, flags=re.S)
    assert block is not None, "docs/architecture.md has no ```mermaid block (the layer diagram)"
    layers: dict[str, Layer] = {}
    edges: set[tuple[str, str]] = set()
    for line in block.group(1).splitlines():
        node = re.match(r'\s*(\w+)\["(.*)"\]\s*$', line)
        edge = re.match(r"\s*(\w+)\s*-->\s*(\w+)\s*$", line)
        if node:
            title, _, rest = node.group(2).partition("<br/>")
            paths = re.findall(r"[\w/]+(?:/|\.py)", rest)
            layers[node.group(1)] = Layer(node.group(1), title.strip(), paths)
        elif edge:
            edges.add((edge.group(1), edge.group(2)))
    return layers, edges


def modules() -> list[str]:
    """Every module of the package, as a path under settled/ (`storage/ledger.py`)."""
    return sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py"))


def layer_of(path: str, layers: dict[str, Layer]) -> str | None:
    """The layer whose diagram node names the path, or its closest package."""
    best, length = None, -1
    for layer in layers.values():
        for p in layer.paths:
            hit = path == p if p.endswith(".py") else path.startswith(p)
            if hit and len(p) > length:
                best, length = layer.node, len(p)
    return best


def paragraphs(text: str) -> list[tuple[str, str]]:
    """(module path, the ## heading it sits under) for every paragraph that starts with
    a module's name in bold code: **`storage/ledger.py`**."""
    found, heading = [], ""
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        head = re.match(r"\*\*`([\w/]+\.py)`\*\*", line)
        if head:
            found.append((head.group(1), heading))
    return found


def _module_name(path: str) -> str:
    parts = ["settled", *Path(path).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path_of(name: str, known: dict[str, str]) -> str | None:
    """The module file an imported dotted name is (or lies in)."""
    while name:
        if name in known:
            return known[name]
        name = name.rpartition(".")[0]
    return None


def module_imports(path: str, known: dict[str, str]) -> list[tuple[str, int, str, str]]:
    """(imported module path, line, dotted name as written, imported name) for every
    import of settled made at module level, TYPE_CHECKING blocks included."""
    tree = ast.parse((PKG / path).read_text(encoding="utf-8"))
    me = _module_name(path)
    package = me if path.endswith("__init__.py") else me.rpartition(".")[0]
    out: list[tuple[str, int, str, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                for a in node.names:
                    target = _path_of(a.name, known)
                    if target is not None:
                        out.append((target, node.lineno, a.name, ""))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                if not base.startswith("settled"):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in known:  # `from . import policy`: the submodule itself
                        out.append((known[sub], node.lineno, sub, ""))
                    elif (target := _path_of(base, known)) is not None:
                        out.append((target, node.lineno, base, a.name))
            elif isinstance(node, ast.If | ast.Try):
                # module-level conditionals (TYPE_CHECKING, optional imports) count
                visit(node.body)
                visit(node.orelse)
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return out


def test_every_module_has_one_paragraph_and_every_paragraph_a_module() -> None:
    mods = set(modules())
    written = paragraphs(_text())
    names = [m for m, _ in written]
    missing = sorted(mods - set(names))
    extra = sorted(set(names) - mods)
    twice = sorted({m for m in names if names.count(m) > 1})
    problems = [
        *(
            f"settled/{m} has no paragraph in docs/architecture.md: add one starting "
            f"**`{m}`** under its layer's heading"
            for m in missing
        ),
        *(
            f"docs/architecture.md describes settled/{m}, which does not exist: "
            f"remove or rename its paragraph"
            for m in extra
        ),
        *(f"docs/architecture.md describes settled/{m} more than once" for m in twice),
    ]
    assert not problems, "\n".join(problems)


def test_every_module_sits_in_one_layer_of_the_diagram_and_under_its_heading() -> None:
    text = _text()
    layers, _ = diagram(text)
    problems = []
    for layer in layers.values():
        for p in layer.paths:
            if not (PKG / p).exists():
                problems.append(
                    f"the diagram's node {layer.node!r} names settled/{p}, which does not exist"
                )
    for path in modules():
        if path != ROOT_MODULE and layer_of(path, layers) is None:
            problems.append(
                f"settled/{path} is in no layer of the diagram in docs/architecture.md: name "
                f"it (or its package) in one node's label"
            )
    for path, heading in paragraphs(text):
        node = layer_of(path, layers)
        if path == ROOT_MODULE or node is None:
            continue
        if heading != layers[node].title:
            problems.append(
                f"settled/{path}'s paragraph is under '## {heading}', but the diagram puts it "
                f"in {node!r}: move it under '## {layers[node].title}'"
            )
    assert not problems, "\n".join(problems)


def test_the_diagram_edges_are_exactly_the_imports_between_layers() -> None:
    layers, edges = diagram(_text())
    known = {_module_name(p): p for p in modules()}
    used: set[tuple[str, str]] = set()
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()  # one line per importing module and imported one
    for path in modules():
        if path == ROOT_MODULE:
            continue
        src = layer_of(path, layers)
        if src is None:
            continue  # reported by the test above
        for target, line, name, what in module_imports(path, known):
            where = f"settled/{path}:{line}"
            if target == ROOT_MODULE:
                if what not in ROOT_NAMES_ALLOWED and (path, target) not in seen:
                    seen.add((path, target))
                    problems.append(
                        f"{where} imports {what or 'the package'} from the package root: "
                        f"import it from the module that defines it"
                    )
                continue
            dst = layer_of(target, layers)
            if dst is None or dst == src:
                continue
            used.add((src, dst))
            if (src, dst) not in edges and (path, target) not in seen:
                seen.add((path, target))
                problems.append(
                    f"{where} imports {name} ({src} → {dst}), an edge the diagram in "
                    f"docs/architecture.md does not have: remove the import (or import it "
                    f"inside the function that needs it), or draw `{src} --> {dst}` and "
                    f"say why"
                )
    for src, dst in sorted(edges - used):
        problems.append(
            f"the diagram's edge `{src} --> {dst}` is made by no module-level import: "
            f"remove it from docs/architecture.md"
        )
    for src, dst in sorted(edges):
        for node in (src, dst):
            if node not in layers:
                problems.append(f"the diagram's edge `{src} --> {dst}` names no node {node!r}")
    assert not problems, "\n".join(problems)


def test_the_checks_find_what_they_look_for() -> None:
    """The parsers above are themselves checked on the real files, so that a test that
    silently finds nothing cannot pass: the diagram has layers and edges, every module
    is found, and known imports are seen (policy imports the model; a TYPE_CHECKING
    import counts; an import inside a function does not)."""
    layers, edges = diagram(_text())
    assert len(layers) >= 5 and len(edges) >= 5
    assert {"policy.py", "storage/ledger.py", "cli/commands.py", ROOT_MODULE} <= set(modules())
    known = {_module_name(p): p for p in modules()}
    seen = {t for t, *_ in module_imports("policy.py", known)}
    assert "model.py" in seen
    assert "dispatch.py" in {t for t, *_ in module_imports("session.py", known)}  # TYPE_CHECKING
    assert "cli/commands.py" not in {t for t, *_ in module_imports("cli/__init__.py", known)}
    assert layer_of("callbacks/settings.py", layers) != layer_of("callbacks/hooks.py", layers)


def test_the_glossary_defines_each_word() -> None:
    text = _text()
    glossary = text.partition("\n## Glossary\n")[2].partition("\n## ")[0]
    assert glossary, "docs/architecture.md has no '## Glossary' section"
    words = (
        "check",
        "verify",
        "reconcile",
        "query",
        "attempt",
        "try",
        "accepted",
        "applied",
        "delivered",
        "acceptance",
        "delivery",
        "confirmed_by",
    )
    missing = [w for w in words if not re.search(rf"^\*\*{w}\*\*", glossary, flags=re.M)]
    assert not missing, f"the glossary in docs/architecture.md lacks: {', '.join(missing)}"
