"""The public API is explicit and pinned: `settled.__all__` is the table in
docs/library.md, each name is written once in settled/__init__.py (plus the imports a
type checker reads, held to the same names here), and every name resolves."""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

import settled
from settled import errors

pytestmark = pytest.mark.ledger_free

LIBRARY_DOC = ROOT / "docs" / "library.md"
INIT = ROOT / "settled" / "__init__.py"


def documented_names() -> list[str]:
    """The first column of the table under "## Public API" in docs/library.md."""
    text = LIBRARY_DOC.read_text()
    section = text.split("\n## Public API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Za-z_]+)` \|", section, flags=re.M)


def test_all_is_the_documented_public_api() -> None:
    documented = documented_names()
    assert len(documented) == len(set(documented)), "a name listed twice in docs/library.md"
    assert sorted(settled.__all__) == sorted(documented)


def test_all_is_sorted_and_every_name_resolves() -> None:
    # isort-style order: Classes, then functions, each alphabetical
    assert settled.__all__ == sorted(settled.__all__, key=lambda n: (n[0].islower(), n))
    for name in settled.__all__:
        assert getattr(settled, name) is not None, name
    assert set(dir(settled)) >= set(settled.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'UsageError'"):
        _ = settled.UsageError


def test_the_type_checkers_imports_match_the_lazy_table() -> None:
    """The TYPE_CHECKING block and the PEP 562 table name the same things from the
    same modules, each as an explicit re-export (`from .m import X as X`)."""
    tree = ast.parse(INIT.read_text())
    guarded = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    assert len(guarded) == 1
    imported: dict[str, str] = {}
    for node in ast.walk(guarded[0]):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module, ast.unparse(node)
            for alias in node.names:
                assert alias.asname == alias.name, f"{ast.unparse(node)}: not `X as X`"
                assert alias.name not in imported, f"{alias.name} imported twice"
                imported[alias.name] = node.module
    assert imported == settled._WHERE


def test_each_name_is_exported_from_the_module_that_defines_it() -> None:
    for name, module in settled._WHERE.items():
        value = getattr(settled, name)
        assert value.__module__.startswith(f"settled.{module}"), (name, value.__module__)


def test_every_error_of_the_tree_is_exported() -> None:
    tree = {
        value.__name__
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, errors.SettledError)
    }
    exported = {n for n in settled.__all__ if n in tree}
    assert exported == tree
    # and the tree drawn in the module's docstring names each of them
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or "")) | {"SettledError"}
    assert drawn == tree


def test_no_alias_modules_or_names() -> None:
    assert not (ROOT / "settled" / "ledger.py").exists()
    assert not hasattr(errors, "UsageError")


def test_library_doc_example_runs(
    tmp_path: Path, sim: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = re.search(r"```python\n(.*?)```", LIBRARY_DOC.read_text(), flags=re.S)
    assert block is not None
    code = block.group(1).replace("http://127.0.0.1:8080", sim.url)  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/library.md", "exec"), {})
    said = re.search(r"print\((.*?)\)\s*# ([^\n]*)", code, flags=re.S)
    assert said is not None
    assert out.getvalue().split() == said.group(2).split()
    with settled.Ledger.open(tmp_path / "settled.db", create=False) as ledger:
        (rec,) = ledger.records()
    assert (rec.provider, rec.operation) == ("sim", "send")


def test_core_never_imports_the_shell() -> None:
    code = (
        "import sys, settled, settled.storage, settled.dispatch, settled.reconcile,"
        " settled.resolve, settled.providers;"
        "bad = [m for m in ('typer', 'rich', 'click') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
