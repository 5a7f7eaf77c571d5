"""The docs point only at what exists: every relative link in the Markdown files
resolves (the file, and the heading an anchor names), every repository path written in
code quotes exists, no text cites a design document the repository does not hold, and
no blank line splits a table in two (the rows after it would render as plain text)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.ledger_free

PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "bench").rglob("*.md"),
        *(ROOT / "examples").rglob("*.md"),
    ]
)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"`((?:settled|tests|docs|bench|examples|\.ci)/[\w./-]*[\w/])`")
FENCE = re.compile(r"^(```|~~~)")


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link in an example is not a link)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            name, n = base, 1
            while name in found:  # repeated headings: -1, -2, …
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    found |= set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', page.read_text(encoding="utf-8")))
    return found


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in PAGES:
        for m in LINK.finditer(prose(page.read_text(encoding="utf-8"))):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{_rel(page)}: ({target}) names a file that does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{_rel(page)}: ({target}) names no heading of {_rel(dest)}")
    assert not broken, "\n".join(broken)


def test_every_repository_path_in_the_docs_exists() -> None:
    missing = [
        f"{_rel(page)}: `{m.group(1)}` does not exist"
        for page in PAGES
        for m in PATH.finditer(page.read_text(encoding="utf-8"))
        if not (ROOT / m.group(1)).exists()
    ]
    assert not missing, "\n".join(missing)


def test_no_reference_to_a_design_document_outside_the_repository() -> None:
    """Rules are cited by their number in docs/rules.md; the design document the
    project was started from is not part of it."""
    sources = [*PAGES, *sorted((ROOT / "settled").rglob("*.py"))]
    found = [
        f"{_rel(p)}:{i}: {line.strip()[:80]}"
        for p in sources
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bDESIGN\b|DESIGN\.md|design notes", line)
    ]
    assert not found, "\n".join(found)


def test_no_blank_line_splits_a_table() -> None:
    """Each run of table rows starts with its header and separator: a run without one
    is the rest of a table a blank line cut off."""
    split = []
    for page in PAGES:
        lines = prose(page.read_text(encoding="utf-8")).splitlines()
        for i, line in enumerate(lines):
            starts = line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
            if starts:
                sep = lines[i + 1] if i + 1 < len(lines) else ""
                if not re.match(r"^\|\s*:?-{3,}", sep):
                    split.append(f"{_rel(page)}:{i + 1}: table rows without a header: {line[:60]}")
    assert not split, "\n".join(split)


def test_the_checks_see_what_they_check() -> None:
    """The parsers find real links, anchors and tables, so the tests above cannot pass
    by finding nothing."""
    readme = ROOT / "README.md"
    assert any(LINK.finditer(prose(readme.read_text(encoding="utf-8"))))
    assert "exit-codes" in anchors(readme)
    assert slug("`settled providers audit`") == "settled-providers-audit"
    assert prose("a\n```\n[x](nowhere.md)\n```\nb").split() == ["a", "b"]


# Dotted names in docs/rules.md that are settled.toml keys, not code.
CONFIG_KEYS = {"verify"}


def _code_index() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every module's top-level names (by dotted path under settled and by its last
    part) and every class's members, read with ast (no optional extra imported)."""
    import ast

    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for path in sorted((ROOT / "settled").rglob("*.py")):
        parts = list(path.relative_to(ROOT / "settled").with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names: set[str] = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                members = classes.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        members.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        members.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.ImportFrom):  # a name a module re-exports
                names |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        for key in {".".join(parts), parts[-1]} if parts else set():
            modules.setdefault(key, set()).update(names)
    return modules, classes


def _traces(ref: str, modules: dict[str, set[str]], classes: dict[str, set[str]]) -> bool:
    import settled

    if ref.startswith("settled."):  # the public names, a module, or a name in one
        ref = ref.removeprefix("settled.")
        if ref in {*settled.__all__, "__version__"} or ref in modules:
            return True
    parts = ref.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:i])
        if mod in modules:
            rest = parts[i:]
            if rest[0] not in modules[mod]:
                return False
            return len(rest) == 1 or (len(rest) == 2 and rest[1] in classes.get(rest[0], set()))
    return len(parts) == 2 and parts[1] in classes.get(parts[0], set())


@pytest.mark.parametrize("page", ["rules.md", "architecture.md"])
def test_every_name_the_code_pages_cite_exists(page: str) -> None:
    """docs/rules.md names, for each rule, the function that enforces it
    (`policy.claim`, `Ledger.move`, `sqlite_schema.migrate`), and docs/architecture.md
    names what each module holds: each dotted name is still defined there."""
    modules, classes = _code_index()
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    refs = sorted(set(re.findall(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`", text)))
    refs = [r for r in refs if not r.endswith(".py") and r.split(".")[0] not in CONFIG_KEYS]
    assert len(refs) > 10, refs
    gone = [
        f"docs/{page} names `{r}`, which settled/ does not define: name what the code holds now"
        for r in refs
        if not _traces(r, modules, classes)
    ]
    assert not gone, "\n".join(gone)
