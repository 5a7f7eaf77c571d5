"""The docs are checked: every command has help and a README entry, the README's
setup commands are the ones CI runs, and its library example runs."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from support import COMMANDS, ROOT, run_cli

from settled import Ledger

pytestmark = pytest.mark.ledger_free

README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help_and_a_readme_entry(cmd: str) -> None:
    p = run_cli(*cmd.split(), "--help")
    assert p.returncode == 0 and "Usage" in p.stdout
    assert f"settled {cmd}" in README


def test_ci_runs_the_readme_test_command() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", README, flags=re.S)
    test_cmd = next(b.strip() for b in blocks if "pytest" in b)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci
    demo_cmd = next(b.strip() for b in blocks if "settled demo" in b)
    assert demo_cmd.startswith("python3 -m venv .venv") and demo_cmd.endswith("settled demo")


def test_every_exit_code_is_documented() -> None:
    for code in range(8):
        assert re.search(rf"^\| {code} \|", README, flags=re.M), code


def test_readme_library_example_runs(
    tmp_path: Path, sim: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = re.search(r"```python\n(.*?)```", README, flags=re.S)
    assert block is not None
    code = block.group(1).replace("http://127.0.0.1:8080", sim.url)  # type: ignore[attr-defined]
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    # The example prints what its comment says, and the ledger holds the one action.
    said = re.search(r"print\((.*?)\)\s*# ([^\n]*)", code, flags=re.S)
    assert said is not None
    assert out.getvalue().split() == said.group(2).split()
    with Ledger.open(tmp_path / "settled.db", create=False) as ledger:
        (rec,) = ledger.records()
    assert (rec.provider, rec.operation, str(rec.status)) == (
        "sim",
        "send",
        said.group(2).split()[-1],
    )


def test_readme_config_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    block = re.search(r"```toml\n(.*?)```", README, flags=re.S)
    assert block is not None
    (tmp_path / "settled.toml").write_text(block.group(1))
    monkeypatch.setenv("MAIL_TOKEN", "t0ken-for-the-test")
    p = run_cli("--config", str(tmp_path / "settled.toml"), "providers", "--json")
    assert p.returncode == 0, p.stderr
    assert "t0ken-for-the-test" not in p.stdout
    assert '"tier": "reconcilable"' in p.stdout
