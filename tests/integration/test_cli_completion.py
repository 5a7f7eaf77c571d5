"""Shell completion never lets data become code: in real interactive bash, zsh and
fish on a pty (tmux), with the script ``settled --show-completion`` writes, a person
types ``settled show ord-``, presses Tab, then Enter. The ledger holds an id an agent
chose to be hostile (``ord-1$(touch MARK)``, backticks, ``;``, quotes, spaces, ``!``…).

Whatever the id, MARK is never created, and the id that reaches settled (its argv,
recorded by a wrapper on PATH) is exactly the one in the ledger. The quoting rules
themselves (``settled.cli.completion``) are checked directly as well, for what a person
may have typed before pressing Tab (an open quote, a ``:`` that bash breaks words at).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import ROOT
from tmux import InteractiveShell, tmux_available

from settled import Ledger
from settled.cli.completion import (
    bash_in_double_quotes,
    bash_in_single_quotes,
    bash_word,
    split_line,
)
from settled.dispatch import Dispatcher
from settled.providers import Registry

pytestmark = [
    pytest.mark.ledger_incidental,
    pytest.mark.slow(seconds=45),
]  # the shells are the subject, not the ledger

HOSTILE = {
    "command-substitution": "ord-1$(touch MARK)",
    "backticks": "ord-2`touch MARK`",
    "separators": "ord-3;touch MARK|touch MARK>MARK&",
    "single-quotes": "ord-4'$(touch MARK)'",
    "double-quotes": 'ord-5"$(touch MARK)"',
    "spaces": "ord-6 $(touch MARK) (touch MARK) x",  # (…) is fish's substitution
    "expansions": "ord-7&&touch MARK!!{a,b}*$HOME~#",
    "backslash-colon": "ord-8\\$(touch MARK):x=y",
}


def _needs(shell: str) -> None:
    if not tmux_available():
        pytest.skip("tmux is not installed (apt-get install tmux)")
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (apt-get install {shell})")


def _ledger(path: Path, registry: Registry, ids: list[str]) -> Path:
    """A ledger holding ``ids``, recorded (never sent) as a person would confirm them."""
    with Ledger.open(path) as ledger:
        d = Dispatcher(ledger, registry, actor="test")
        for aid in ids:
            d.submit("sim", "book", {}, action_id=aid, needs_confirmation=True)
    return path


def _wrapper(bin_dir: Path, log: Path) -> None:
    """``settled`` on PATH: records its argv (when it is run, not when it completes),
    then runs the real command line."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "settled"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if '_SETTLED_COMPLETE' not in os.environ:\n"
        f"    with open({str(log)!r}, 'a') as f:\n"
        "        f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "from settled.cli import main\n"
        "main()\n"
    )
    script.chmod(0o755)


def _argv(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(x) for x in log.read_text().splitlines() if x]


def _load_completion(sh: InteractiveShell, shell: str, script: str, work: Path) -> None:
    """As the README says: the script ``settled --show-completion`` prints (the shell
    is detected), saved and loaded; or the one an earlier version installed."""
    if script == "legacy":
        from typer import _completion_shared as typer_scripts

        template = {
            "bash": typer_scripts.COMPLETION_SCRIPT_BASH,
            "zsh": typer_scripts.COMPLETION_SCRIPT_ZSH,
        }[shell]
        (work / f"comp.{shell}").write_text(
            template
            % {
                "complete_func": "_settled_completion",
                "autocomplete_var": "_SETTLED_COMPLETE",
                "prog_name": "settled",
            }
        )
    else:
        sh.type(f"settled --show-completion > comp.{shell}")
        sh.press("Enter")
        sh.ready()
    load = {
        "bash": "source comp.bash",
        "zsh": "autoload -Uz compinit && compinit -u && source comp.zsh",
        "fish": "source comp.fish",
    }[shell]
    sh.type(load)
    sh.press("Enter")
    sh.ready()


def _completed(screen: str, typed: str) -> bool:
    """The Tab inserted something after what was typed."""
    for line in screen.splitlines():
        at = line.find(typed)
        if at >= 0 and line[at + len(typed) :].strip():
            return True
    return False


LEGACY = ("command-substitution", "single-quotes", "backslash-colon")  # the worst cases


@pytest.mark.parametrize(
    ("shell", "script"),
    [
        ("bash", "current"),
        ("zsh", "current"),
        ("fish", "current"),
        ("bash", "legacy"),
        ("zsh", "legacy"),
    ],
)
def test_tab_then_enter_runs_no_part_of_a_hostile_id(
    shell: str, script: str, tmp_path: Path, registry: Registry
) -> None:
    """``legacy``: the script an earlier version installed (Typer's, which zsh
    ``eval``s): the values it is handed are still never code."""
    _needs(shell)
    log = tmp_path / "argv.log"
    _wrapper(tmp_path / "bin", log)
    work = tmp_path / "work"  # the shell's folder: where a `touch MARK` would land
    work.mkdir()
    ledgers = {
        name: _ledger(tmp_path / f"{name}.db", registry, [aid]) for name, aid in HOSTILE.items()
    }
    every = _ledger(tmp_path / "all.db", registry, list(HOSTILE.values()))
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "TERM": "xterm-256color",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", None)
    with InteractiveShell(shell, work, env) as sh:
        sh.ready()
        _load_completion(sh, shell, script, work)
        cases = {n: a for n, a in HOSTILE.items() if script == "current" or n in LEGACY}
        for name, aid in cases.items():
            runs = len(_argv(log))
            typed = f"settled --db {shlex.quote(str(ledgers[name]))} show ord-"
            sh.type(typed)
            sh.press("Tab")
            sh.wait_for(lambda s, t=typed: _completed(s, t), f"the completion of {name}")
            sh.press("Enter")
            sh.wait_for(lambda s, n=runs: len(_argv(log)) > n, f"settled to run for {name}")
            sh.ready()
            assert not (work / "MARK").exists(), f"{shell} ran part of the id {aid!r}"
            assert _argv(log)[-1][-2:] == ["show", aid], (name, _argv(log)[-1], sh.screen())
        # Tab twice lists every candidate: listing runs nothing either.
        sh.press("C-l")
        sh.ready()
        typed = f"settled --db {shlex.quote(str(every))} show ord-"
        before = sh.screen().count("ord-8")
        sh.type(typed)
        sh.press("Tab")
        sh.press("Tab")
        sh.wait_for(lambda s: s.count("ord-8") > before, "the list of candidates")
        if shell == "bash":
            # bash prints the list, then the prompt and the line again: once it has, the
            # line editor waits for a key, and C-u empties the line (a C-c that lands
            # while the completion still runs aborts only the completion, and the line,
            # kept, would run with the marker appended on a loaded machine).
            sh.wait_for(lambda s: s.rstrip().endswith("show ord-"), "the line drawn again")
            sh.press("C-u")
        else:
            sh.press("C-c")
        sh.ready()
    assert not (work / "MARK").exists()


# -- the quoting, for what a person may have typed before Tab ------------------------------


def _bash_reads(word: str, cwd: Path) -> list[str]:
    """The words a real bash reads in ``word``, run in ``cwd`` (where a wrongly quoted
    ``touch MARK`` would leave its mark)."""
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", f"printf '%s\\0' {word}"],
        capture_output=True,
        check=True,
        cwd=cwd,
    )
    return out.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("value", [*HOSTILE.values(), "é-ok", "a b\tc", "new\nline", "~x", "-x"])
def test_bash_reads_each_quoted_form_back_as_the_value(value: str, tmp_path: Path) -> None:
    for quoted in (bash_word(value), bash_in_single_quotes(value), bash_in_double_quotes(value)):
        if "!" in value and quoted.startswith('"'):
            assert '"\\!"' in quoted  # history expansion is closed out of the quotes
        assert _bash_reads(quoted, tmp_path) == [value], quoted
    assert not (tmp_path / "MARK").exists()


def test_bash_completion_in_process_writes_each_value_as_typed(
    tmp_path: Path, registry: Registry
) -> None:
    db = _ledger(tmp_path / "l.db", registry, list(HOSTILE.values()))

    def complete(before: str, breaks: str = "\"'><=;|&(:") -> list[str]:
        env: dict[str, Any] = {
            **os.environ,
            "_SETTLED_COMPLETE": "complete_bash",
            "COMP_LINE": before,
            "COMP_POINT": str(len(before)),
            "COMP_WORDBREAKS": breaks,
            "SETTLED_DB": str(db),
        }
        out = subprocess.run(
            [sys.executable, "-m", "settled"], env=env, capture_output=True, text=True, cwd=ROOT
        )
        return [x for x in out.stdout.split("\n") if x]  # the script drops blank lines

    # Plain: the whole word, escaped.
    assert complete("settled show ord-1$") == ["ord-1\\$\\(touch\\ MARK\\)"]
    assert complete("settled show ord-1\\$") == ["ord-1\\$\\(touch\\ MARK\\)"]
    # After a ':' bash replaces only what follows it.
    assert complete("settled show ord-8\\\\\\$\\(touch\\ MARK\\):") == ["x=y"]
    # In an open quote: the word in that quote, which readline closes.
    assert complete("settled show 'ord-4") == ["'ord-4'\\''$(touch MARK)'\\'''"]
    assert complete('settled show "ord-7') == [bash_in_double_quotes(HOSTILE["expansions"])]
    assert "\\!" in complete('settled show "ord-7')[0]
    # Inside $'…' escapes mean something else: nothing is offered; nor for no match.
    assert complete("settled show $'ord") == []
    assert complete("settled show zzz") == []


@pytest.mark.parametrize(
    ("line", "args", "incomplete"),
    [
        ("settled show ", ["show"], ""),
        ("settled show ord", ["show"], "ord"),
        ("settled show 'a b ", ["show"], "a b "),
        ("settled show a\\ ", ["show"], "a "),
        ("settled --db x show a", ["--db", "x", "show"], "a"),
    ],
)
def test_the_word_being_completed_is_read_as_the_shell_reads_it(
    line: str, args: list[str], incomplete: str
) -> None:
    assert split_line(line) == (args, incomplete)
