"""Shell completion: the values completed, and how each shell is handed them, so that
no value can become code.

Values come from the ledger and the config: action ids an agent chose, provider and
operation names, statuses, causes, formats. Completion never creates a ledger and never
prints an error: anything that fails completes nothing.

A value such as ``ord-1$(touch MARK)`` must reach
settled as that id, and never run ``touch MARK`` in the operator's shell. Each shell
inserts completions its own way, so each gets its own treatment:

- **bash** inserts a completion verbatim: each value is written here as bash would
  need it typed, escaped for the quoting in force at the cursor (none, ``'`` or ``"``)
  and cut to the part readline replaces (the text after a ``:`` or ``=``, which bash
  treats as word breaks). The script reads the values line by line (``read -r``), so
  no value is split or glob-expanded on the way in.
- **zsh** quotes a match as it inserts it (``compadd``): values go to it as they are,
  one a line, and are never evaluated (Typer's script ``eval``s them). A script
  installed from an earlier version still ``eval``s: it is handed one ``compadd``
  command whose values are single-quoted words.
- **fish** escapes what it inserts: values go to it as they are.

A value a shell cannot be handed safely line by line (a control character or a
newline, which no action id holds) is left out, never mangled.

The classes replace Typer's for ``bash``, ``zsh`` and ``fish``, both for completing
and for the scripts ``--show-completion`` and ``--install-completion`` write.
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Any

# Typer has no public API for this: it carries its own copy of Click (``typer._click``),
# so Click's public ``add_completion_class`` does not reach it, and its completion classes
# and the scripts it installs are private (``typer._completion_classes``,
# ``typer._completion_shared``). These private names are the only place settled reaches
# into Typer (a Typer without the script table keeps its own scripts: ``install``).
from typer._click.shell_completion import CompletionItem, add_completion_class, split_arg_string
from typer._completion_classes import BashComplete, FishComplete, ZshComplete

from .common import STATE

BASH = r"""
{complete_func}() {
    local IFS=$'\n' line
    COMPREPLY=()
    while IFS= read -r line; do
        [[ -n $line ]] && COMPREPLY+=("$line")
    done < <(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD="$COMP_CWORD" \
        COMP_LINE="${COMP_LINE-}" COMP_POINT="${COMP_POINT-}" \
        COMP_WORDBREAKS="${COMP_WORDBREAKS-}" \
        {autocomplete_var}=complete_bash "$1" 2>/dev/null)
    return 0
}

complete -o default -F {complete_func} {prog_name}
"""

ZSH = r"""
#compdef {prog_name}

{complete_func}() {
  local -a lines plain described shown
  local line
  lines=("${(@f)$(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _SETTLED_COMPLETE_LINES=1 \
    {autocomplete_var}=complete_zsh {prog_name} 2>/dev/null)}")
  for line in "${lines[@]}"; do
    [[ -n $line ]] || continue
    if [[ $line == *$'\t'* ]]; then
      described+=("${line%%$'\t'*}")
      shown+=("${line%%$'\t'*}  -- ${line#*$'\t'}")
    else
      plain+=("$line")
    fi
  done
  if (( ${#plain} + ${#described} == 0 )); then
    _files
    return
  fi
  (( ${#plain} )) && compadd -- "${plain[@]}"
  (( ${#described} )) && compadd -l -d shown -- "${described[@]}"
  return 0
}

compdef {complete_func} {prog_name}
"""

FISH = (
    "complete --command {prog_name} --no-files --arguments "
    '"(env {autocomplete_var}=complete_fish _TYPER_COMPLETE_FISH_ACTION=get-args '
    '_TYPER_COMPLETE_ARGS=(commandline -cp) {prog_name})" --condition '
    '"env {autocomplete_var}=complete_fish _TYPER_COMPLETE_FISH_ACTION=is-args '
    '_TYPER_COMPLETE_ARGS=(commandline -cp) {prog_name}"'
)

SCRIPTS = {"bash": BASH, "zsh": ZSH, "fish": FISH}
_VARS = ("complete_func", "autocomplete_var", "prog_name")


def render(template: str, values: dict[str, Any]) -> str:
    out = template
    for key in _VARS:
        out = out.replace("{" + key + "}", str(values[key]))
    return out.strip()


def percent_template(template: str) -> str:
    """The template in the ``%(name)s`` form Typer's script writer formats."""
    out = template.replace("%", "%%")
    for key in _VARS:
        out = out.replace("{" + key + "}", f"%({key})s")
    return out


def split_line(line: str) -> tuple[list[str], str]:
    """The words before the one being completed (without the program), and that word
    as the shell will read it (quotes and escapes removed; "" after a blank)."""
    words = split_arg_string(line)
    probe = split_arg_string(line + "\0")  # extends the last word, unless a blank ended it
    if words and len(probe) == len(words) and probe[-1] == words[-1] + "\0":
        return words[1:-1], (words[-1] if len(words) > 1 else "")
    return words[1:], ""


def shown_help(item: CompletionItem) -> str:
    """A completion's help as one line without tabs (it travels after a tab)."""
    text = re.sub(r"\s+", " ", str(item.help or "")).strip()
    return "".join(ch for ch in text if ch.isprintable())


def _deliverable(value: str) -> bool:
    return value.isprintable()


# -- bash -------------------------------------------------------------------------------------

_BASH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")
_DEFAULT_BREAKS = "\"'><=;|&(:"
_OPERATORS = frozenset(" \t\n;|&<>()")


def bash_word(text: str) -> str:
    """``text`` as one bash word outside quotes: every character that means something
    to bash backslash-escaped; ``$'…'`` when it holds one a backslash cannot carry (a
    control character, a newline)."""
    if all(ch.isprintable() for ch in text):
        return "".join(ch if ch in _BASH_SAFE or _plain_letter(ch) else "\\" + ch for ch in text)
    return "$'" + "".join(_ansi_c(ch) for ch in text) + "'"


def _plain_letter(ch: str) -> bool:
    """A printable character outside ASCII: nothing to bash, kept for readability."""
    return not ch.isascii() and ch.isprintable() and not unicodedata.category(ch).startswith("Z")


def _ansi_c(ch: str) -> str:
    if ch in "\\'":
        return "\\" + ch
    if ch.isprintable() and ch.isascii():
        return ch
    code = ord(ch)
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def bash_in_single_quotes(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def bash_in_double_quotes(text: str) -> str:
    """``"…"``: ``\\``, ``"``, ``$`` and backticks escaped; ``!`` (history expansion,
    which a backslash cannot stop inside double quotes) between closed quotes."""
    inner = re.sub(r'([\\"$`])', r"\\\1", text)
    return '"' + inner.replace("!", '"\\!"') + '"'


def scan(line: str) -> tuple[int, str | None, int]:
    """For the line up to the cursor: where its last word starts, the quote left open
    at its end (``'``, ``"``, ``$'`` or None), and where that quote opened (-1)."""
    start, opened, in_word, i = len(line), -1, False, 0
    quote: str | None = None
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif quote is not None:  # '"' or "$'": a backslash escapes the next character
            if c == "\\":
                i += 1
            elif c == quote[-1]:
                quote = None
        elif c in _OPERATORS:
            in_word = False
        else:
            if not in_word:
                start, in_word = i, True
            if c == "\\":
                i += 1
            elif c in "'\"":
                ansi = c == "'" and i > start and line[i - 1] == "$"
                quote, opened = ("$'" if ansi else c), i
        i += 1
    if not in_word:
        start = len(line)
    return start, quote, opened


def readline_word_start(token: str, quote: str | None, opened: int, breaks: str) -> int:
    """Where, in ``token`` (the raw last word), the text readline replaces begins:
    after an open quote, else after the last unquoted word-break character."""
    if quote is not None:
        return opened + 1
    breaks = "".join(ch for ch in breaks if ch not in "'\"")
    start, i, inside = 0, 0, None
    while i < len(token):
        c = token[i]
        if inside is not None:
            if c == "\\" and inside == '"':
                i += 1
            elif c == inside:
                inside = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            inside = c
        elif c in breaks:
            start = i + 1
        i += 1
    return start


class SafeBash(BashComplete):
    """bash: each value written as bash must read it, for the quoting at the cursor."""

    source_template = percent_template(BASH)

    def source(self) -> str:
        self._check_version()
        return render(BASH, self.source_vars())

    def complete(self) -> str:
        line = os.environ.get("COMP_LINE", "")
        point = os.environ.get("COMP_POINT", "")
        if not line or not point.isdigit():  # an older script, or called by hand
            args, incomplete = self.get_completion_args()
            items = self.get_completions(args, incomplete)
            return "\n".join(bash_word(i.value) for i in items if _deliverable(str(i.value)))
        before = line[: int(point)]
        start, quote, opened = scan(before)
        if quote == "$'":
            return ""  # inside $'…' escapes mean something else: complete nothing
        token = before[start:]
        args, incomplete = split_line(before)
        breaks = os.environ.get("COMP_WORDBREAKS") or _DEFAULT_BREAKS
        cut = readline_word_start(token, quote, opened - start, breaks)
        # What readline replaces, as the shell reads it, and what stays before it.
        replaced = _unquoted(token[cut:], quote)
        kept = incomplete[: len(incomplete) - len(replaced)]
        if not incomplete.endswith(replaced):
            kept = ""
        out = []
        for item in self.get_completions(args, incomplete):
            value = str(item.value)
            if not _deliverable(value):
                continue
            if kept and value.startswith(incomplete):
                value = value[len(kept) :]
            if quote == "'":
                out.append(bash_in_single_quotes(value))
            elif quote == '"':
                out.append(bash_in_double_quotes(value))
            else:
                out.append(bash_word(value))
        return "\n".join(x for x in out if x)


def _unquoted(text: str, quote: str | None) -> str:
    """Text at the end of a word as the shell reads it: after an open quote (``'``
    or ``"``), or outside quotes."""
    if quote == "'":
        return text
    if quote == '"':
        return re.sub(r'\\([\\"$`\n])', r"\1", text)
    words = split_arg_string(text)
    return words[0] if words else ""


# -- zsh and fish -----------------------------------------------------------------------------


class SafeZsh(ZshComplete):
    """zsh: values one a line (a tab, then the help); ``compadd`` quotes them."""

    source_template = percent_template(ZSH)

    def source(self) -> str:
        return render(ZSH, self.source_vars())

    def get_completion_args(self) -> tuple[list[str], str]:
        return split_line(os.getenv("_TYPER_COMPLETE_ARGS", ""))

    def complete(self) -> str:
        args, incomplete = self.get_completion_args()
        items = [i for i in self.get_completions(args, incomplete) if _deliverable(str(i.value))]
        if not os.environ.get("_SETTLED_COMPLETE_LINES"):
            # A script installed before this one ``eval``s what it reads: hand it one
            # command whose every value is a single-quoted word, never code.
            if not items:
                return "_files"
            return "compadd -- " + " ".join(zsh_single_quoted(str(i.value)) for i in items)
        out = []
        for item in items:
            help_ = shown_help(item)
            out.append(f"{item.value}\t{help_}" if help_ else str(item.value))
        return "\n".join(out)


def zsh_single_quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


class SafeFish(FishComplete):
    """fish: values one a line (a tab, then the help); fish escapes what it inserts."""

    source_template = percent_template(FISH)

    def source(self) -> str:
        return render(FISH, self.source_vars())

    def get_completion_args(self) -> tuple[list[str], str]:
        return split_line(os.getenv("_TYPER_COMPLETE_ARGS", ""))

    def format_completion(self, item: CompletionItem) -> str:
        help_ = shown_help(item)
        return f"{item.value}\t{help_}" if help_ else str(item.value)

    def get_completions(self, args: list[str], incomplete: str) -> list[CompletionItem]:
        items = super().get_completions(args, incomplete)
        return [i for i in items if _deliverable(str(i.value))]


CLASSES = {"bash": SafeBash, "zsh": SafeZsh, "fish": SafeFish}


def install() -> None:
    """Use these classes, and their scripts, for bash, zsh and fish. Called after the
    command is built (Typer registers its own classes while building it)."""
    for name, cls in CLASSES.items():
        add_completion_class(cls, name)
    try:
        from typer import _completion_shared
    except ImportError:  # another Typer: completing still goes through the classes
        return
    scripts = getattr(_completion_shared, "_completion_scripts", None)
    if isinstance(scripts, dict):
        for name in CLASSES:
            scripts[name] = percent_template(SCRIPTS[name])


__all__ = [
    "CLASSES",
    "SafeBash",
    "SafeFish",
    "SafeZsh",
    "bash_in_double_quotes",
    "bash_in_single_quotes",
    "bash_word",
    "install",
    "scan",
    "split_line",
    "zsh_single_quoted",
]


# -- the values completed ------------------------------------------------------------


LIMIT = 200


def _session(ctx: Any) -> Any:
    """The session as the command line being completed would open it: Click does
    not run the global options' callback while completing."""
    root = ctx.find_root() if ctx is not None else None
    params = root.params if root is not None else {}
    if params.get("db"):
        STATE.db = params["db"]
    if params.get("config"):
        STATE.config_path = params["config"]
    STATE.extra["completing"] = True  # completion prints nothing but values
    return STATE


def action_ids(ctx: Any, incomplete: str) -> list[str]:
    try:
        return _session(ctx).ledger(read_only=True).ids(incomplete, limit=LIMIT)  # type: ignore[no-any-return]
    except Exception:
        return []


def providers(ctx: Any, incomplete: str) -> list[str]:
    from .common import known_names

    try:
        s = _session(ctx)
        try:
            ledger = s.ledger(read_only=True)
        except Exception:
            ledger = None
        names, _ = known_names(ledger)
        return sorted(n for n in names if n.startswith(incomplete))
    except Exception:
        return []


def operations(ctx: Any, incomplete: str) -> list[str]:
    from .common import known_names

    try:
        s = _session(ctx)
        try:
            ledger = s.ledger(read_only=True)
        except Exception:
            ledger = None
        provider = ctx.params.get("provider") if ctx is not None else None
        _, pairs = known_names(ledger, operations=True)
        return sorted({o for p, o in pairs if (provider in (None, p)) and o.startswith(incomplete)})
    except Exception:
        return []


def statuses(incomplete: str) -> list[str]:
    from ..selection import STATUSES

    return [s for s in (*STATUSES, "all") if s.lower().startswith(incomplete.lower())]


def causes(incomplete: str) -> list[str]:
    """The cause codes (``http_NNN`` as its commonest, ``http_503``), the last item of
    a comma list completed."""
    from ..cause import FIXED

    head, _, last = incomplete.rpartition(",")
    done = f"{head}," if head else ""
    return [done + c for c in ("http_503", *FIXED) if c.startswith(last.lower())]


def deliveries(incomplete: str) -> list[str]:
    from ..selection import DELIVERIES

    return [d for d in DELIVERIES if d.lower().startswith(incomplete.lower())]


def formats(incomplete: str) -> list[str]:
    from .render import FORMATS

    return [f for f in FORMATS if f.startswith(incomplete)]
