"""Secrets on the way out and on the way back (rule 13), through a real HTTP server on
loopback that echoes every credential it received in its 401 body, in one of the many
spellings servers really use.

On the way out a ``${VAR}`` value goes to the wire byte for byte (a SAS token's ``%2F``
is never sent as ``%252F``); a value a header cannot carry is refused at load, by the
variable's name. On the way back no spelling of any secret reaches the ledger (its
file or rows), the events, ``--json``, ``show``, ``queue`` or ``providers render``.
"""

from __future__ import annotations

import base64
import contextlib
import html
import io
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import count
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import pytest
import rawdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import budget, scaled
from support import write_config

from settled.cli import main
from settled.errors import ConfigError
from settled.providers import Registry

pytestmark = pytest.mark.slow(seconds=20)

# -- how a server spells what it received ------------------------------------------------------


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _json(v: str) -> str:
    return json.dumps(v)[1:-1]


# Each takes the header value as the server decoded it (Latin-1, as HTTP servers do)
# and returns the bytes the server writes for it in the 401 body.
SPELLINGS: dict[str, Callable[[str], bytes]] = {
    "raw-bytes": lambda v: v.encode("latin-1"),
    "utf-8": _b,
    "json": lambda v: _b(_json(v)),
    "json-utf8": lambda v: _b(json.dumps(v, ensure_ascii=False)[1:-1]),
    "json-in-json": lambda v: _b(_json(_json(v))),
    "json-slashes": lambda v: _b(_json(v).replace("/", "\\/")),
    "percent": lambda v: _b(quote(v, safe="")),
    "percent-latin1": lambda v: _b(quote(v, safe="", encoding="latin-1")),
    "percent-lower": lambda v: _b(
        re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), quote(v, safe=""))
    ),
    "percent-twice": lambda v: _b(quote(quote(v, safe=""), safe="")),
    "form": lambda v: _b(quote_plus(v)),
    "url-in-json": lambda v: _b(_json("https://api.test/x?sig=" + quote(v))),
    "percent-decoded": lambda v: _b(unquote(v)),
    "html": lambda v: _b(html.escape(v)),
    "xml-charrefs": lambda v: html.escape(v).encode("ascii", "xmlcharrefreplace"),
    "repr": lambda v: _b(repr(v)[1:-1]),
    "repr-bytes": lambda v: _b(repr(v.encode("latin-1"))[2:-1]),
    "repr-utf8-bytes": lambda v: _b(repr(v.encode("utf-8"))[2:-1]),
    "mojibake": lambda v: _b(v.encode("utf-8").decode("latin-1")),
    "basic-decoded": lambda v: _b(_basic(v)),
}


def _basic(value: str) -> str:
    """What a server shows of ``Basic <base64>``: the decoded ``user:password``."""
    scheme, _, token = value.partition(" ")
    if scheme != "Basic":
        return value
    return base64.b64decode(token).decode("utf-8", "replace")


def spelled(secret: str) -> set[str]:
    """Every spelling of ``secret`` the server could have written, as text."""
    out = {secret}
    for name, spell in SPELLINGS.items():
        if name != "basic-decoded":
            with contextlib.suppress(UnicodeEncodeError):
                out.add(spell(secret).decode("utf-8", "replace"))
    return {s for s in out if s}


class EchoServer:
    """A loopback API that records the raw bytes of every credential header it got
    and answers 401 with a body echoing them in ``self.spelling``. A POST to
    ``/accept`` is taken (202); every query (GET) is refused with the echo too."""

    HEADERS = ("authorization", "x-sas")

    def __init__(self) -> None:
        self.spelling = "utf-8"
        self.received: list[dict[str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                return None

            def _echo(self) -> None:
                got = {
                    k.lower(): v.encode("latin-1")
                    for k, v in self.headers.items()
                    if k.lower() in EchoServer.HEADERS
                }
                outer.received.append(got)
                if self.command == "POST" and self.path.startswith("/accept"):
                    body = b'{"id": "m-1", "status": "queued"}'
                    code = 202
                else:
                    spell = SPELLINGS[outer.spelling]
                    echoed = [spell(v.decode("latin-1")) for _, v in sorted(got.items())]
                    body = b'{"error": "bad credentials", "got": "' + b'", "'.join(echoed) + b'"}'
                    code = 401
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._echo()

            def do_GET(self) -> None:
                self._echo()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> EchoServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


def providers_conf(url: str) -> dict[str, dict[str, Any]]:
    mail_ops = {
        # refused with the echo: the reason of a FAILED record quotes the body
        "send": {
            "tier": "full",
            "attempts": 1,
            "request": {"method": "POST", "path": "/send", "headers": {"X-Sas": "${SAS}"}},
            "object_id": "/id",
        },
        # taken, then its query is refused with the echo: the check's detail quotes it
        "queue": {
            "tier": "reconcilable",
            "consistency_window": 0,
            "attempts": 1,
            "request": {"method": "POST", "path": "/accept"},
            "reconciliation_key_field": "ref",
            "query": {
                "method": "GET",
                "path": "/q/{reconciliation_key}",
                "headers": {"X-Sas": "sas=${SAS}"},
            },
            "status": "/status",
            "applied": ["delivered"],
            "verify": {"interval": 0.01, "deadline": 60},
        },
    }
    return {
        "mail": {
            "type": "http",
            "base_url": url,
            "timeout": 5.0,
            "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
            "operations": mail_ops,
        },
        "vault": {
            "type": "http",
            "base_url": url,
            "timeout": 5.0,
            "auth": {"type": "basic", "username": "acct", "password": "${VAULT_PASSWORD}"},
            "operations": {
                "send": {
                    "tier": "full",
                    "attempts": 1,
                    "request": {"method": "POST", "path": "/send"},
                    "object_id": "/id",
                }
            },
        },
    }


def cli(*argv: str) -> tuple[int, str, str]:
    """``settled ARGV`` in process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        else:
            code = 0
    return code, out.getvalue(), err.getvalue()


# -- the secrets -------------------------------------------------------------------------------

HOSTILE = [*"%+/=\"'\\&<>;:,.~!#$@^*()[]{}|?`", "%2F", "%3D", "%25", "%2B", "%20", " "]
LATIN1 = [*"éñüÿßÀ¿×\xa0", "Ã©", "Â"]
WIDE = [*"€🚀日本Ωж", "\u200b"]


def _secret(alphabet: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pieces = st.one_of(
        alphabet, st.sampled_from(list("abcdefghijkmnopqrstuvwxyzABCDEFGH0123456789"))
    )
    return (
        st.lists(pieces, min_size=6, max_size=20)
        .map("".join)
        .filter(lambda s: len(set(s)) >= 4 and s == s.strip() and len(s) >= 8)
    )


HEADER_SECRETS = _secret(st.sampled_from(HOSTILE + LATIN1))  # what a header can carry
PASSWORDS = _secret(st.sampled_from(HOSTILE + LATIN1 + WIDE))  # basic auth: base64 of UTF-8


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


@pytest.fixture
def setup(
    echo: EchoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: Any
) -> dict[str, Any]:
    config = write_config(tmp_path / "settled.toml", providers_conf(echo.url))
    monkeypatch.setenv("SETTLED_CONFIG", str(config))
    monkeypatch.setenv("SETTLED_DB", str(location))
    monkeypatch.chdir(tmp_path)
    return {"config": config, "db": location, "echo": echo, "ids": count(1)}


def _ledger_text(db: Any) -> list[str]:
    """Everything the ledger holds, as text: every row (PostgreSQL), or the database
    file and its WAL read as bytes (SQLite)."""
    if rawdb.is_pg(db):
        return [str(rawdb.dump(db))]
    out = []
    for suffix in ("", "-wal"):
        f = Path(f"{db}{suffix}")
        if f.exists():
            out.append(f.read_bytes().decode("utf-8", "replace"))
    return out


class Runs:
    """settled run in process, every output kept; no run may show a traceback."""

    def __init__(self) -> None:
        self.outputs: list[str] = []

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        code, out, err = cli(*argv)
        assert "Traceback" not in err and "internal error" not in err, (argv, err)
        self.outputs.extend([out, err])
        return code, out, err


def send(s: dict[str, Any], run: Runs, spelling: str) -> list[str]:
    """Send through every path that meets the echo in ``spelling``; the action ids."""
    echo: EchoServer = s["echo"]
    echo.spelling = spelling
    n = next(s["ids"])
    ids = {"send": f"send-{n}", "queue": f"queue-{n}", "vault": f"vault-{n}"}
    code, out, _ = run("dispatch", "mail", "send", "--action-id", ids["send"], "--json")
    assert code == 5 and json.loads(out)["status"] == "FAILED"  # 401: provably refused
    code, _, _ = run("dispatch", "vault", "send", "--action-id", ids["vault"])
    assert code == 5
    code, _, _ = run("dispatch", "mail", "queue", "--action-id", ids["queue"], "--json")
    assert code == 3
    run("reconcile", "--due", "--json", "--log", "json")  # the query meets the echo
    return list(ids.values())


def views(s: dict[str, Any], run: Runs, shown: list[str]) -> list[str]:
    """Every view of the ledger and the config a person or a script reads (``show``
    for the ``shown`` actions), and the ledger itself."""
    for aid in shown:
        assert run("show", aid, "--json")[0] == 0
        assert run("show", aid)[0] == 0
    run("queue", "--status", "all", "--json")
    run("queue", "--status", "all", "-o", "wide")
    run("queue", "--status", "all", "-o", "tsv")
    for provider, op in (("mail", "send"), ("mail", "queue"), ("vault", "send")):
        run("providers", "render", provider, op, "--json")
    run("providers", "render", "mail", "queue")
    return run.outputs + _ledger_text(s["db"])


def reached(echo: EchoServer, sas: str, token: str, password: str) -> None:
    """The secrets reached the API byte for byte, or the test proves nothing."""
    basic = base64.b64encode(f"acct:{password}".encode()).decode()
    sent = {(k, v) for got in echo.received for k, v in got.items()}
    assert ("x-sas", sas.encode("latin-1")) in sent, sent
    assert ("x-sas", b"sas=" + sas.encode("latin-1")) in sent, sent
    assert ("authorization", b"Bearer " + token.encode("latin-1")) in sent, sent
    assert ("authorization", b"Basic " + basic.encode()) in sent, sent


def assert_no_secret(texts: list[str], *secrets: str) -> None:
    for secret in secrets:
        forms = spelled(secret)
        for text in texts:
            for form in forms:
                assert form not in text, (secret, form, text[:2000])


SECRETS_SETTINGS = settings(
    max_examples=scaled(6),
    deadline=None,
    derandomize=budget() <= 1,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)


@SECRETS_SETTINGS
@given(
    sas=HEADER_SECRETS,
    token=HEADER_SECRETS,
    password=PASSWORDS,
    spelling=st.sampled_from(sorted(SPELLINGS)),
)
def test_no_spelling_of_a_secret_the_server_echoes_is_kept_or_shown(
    setup: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    sas: str,
    token: str,
    password: str,
    spelling: str,
) -> None:
    monkeypatch.setenv("SAS", sas)
    monkeypatch.setenv("MAIL_TOKEN", token)
    monkeypatch.setenv("VAULT_PASSWORD", password)
    setup["echo"].received.clear()
    run = Runs()
    ids = send(setup, run, spelling)
    reached(setup["echo"], sas, token, password)
    basic = base64.b64encode(f"acct:{password}".encode()).decode()
    assert_no_secret(views(setup, run, ids), sas, token, password, basic)


# A SAS token as Azure hands it out (already percent-encoded), a token full of JSON and
# HTML specials, and a password no header could carry.
FIXED = {
    "sas": "sv=2024-05-04&ss=b&sig=ab%2Fcd%2Bef%3D",
    "token": "t0k\"en'</x>&amp;é\\x",
    "password": "pässwörd-€-🚀:x",
}


def test_every_spelling_is_redacted_for_a_sas_token(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in (
        ("SAS", FIXED["sas"]),
        ("MAIL_TOKEN", FIXED["token"]),
        ("VAULT_PASSWORD", FIXED["password"]),
    ):
        monkeypatch.setenv(var, value)
    run = Runs()
    ids = []
    for spelling in sorted(SPELLINGS):
        ids += send(setup, run, spelling)
    reached(setup["echo"], FIXED["sas"], FIXED["token"], FIXED["password"])
    texts = views(setup, run, ids[:3])  # queue and the ledger hold every record
    basic = base64.b64encode(f"acct:{FIXED['password']}".encode()).decode()
    assert_no_secret(texts, *FIXED.values(), basic)
    # Each echo really held the secrets: every refused record says they were masked.
    code, out, _ = cli("queue", "--status", "FAILED", "--json")
    refused = json.loads(out)
    assert code == 0 and len(refused) == 2 * len(SPELLINGS)
    assert all("***" in r["reason"] for r in refused), out
    # Nor does the search index hold them: it is made of the record's own fields only.
    for secret in (*FIXED.values(), basic):
        code, out, _ = cli("queue", "--status", "all", "--search", secret, "-o", "name")
        assert (code, out) == (0, ""), secret
    code, out, _ = cli("queue", "--search", "***", "--status", "FAILED", "-o", "name")
    assert code == 0 and len(out.split()) == len(refused)  # it does hold what is kept


def test_a_sas_token_goes_byte_for_byte_and_its_echo_is_masked(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The case as it was found: an ASCII SAS token with ``%2F``, in an operation's
    header, echoed back as the server received it."""
    sas, token, password = "sv=2024&sig=ab%2Fcd%3D", "tok%2Fen-1234", "pw%2F-1234"
    for var, value in (("SAS", sas), ("MAIL_TOKEN", token), ("VAULT_PASSWORD", password)):
        monkeypatch.setenv(var, value)
    run = Runs()
    ids = send(setup, run, "utf-8") + send(setup, run, "percent-twice")
    reached(setup["echo"], sas, token, password)
    basic = base64.b64encode(f"acct:{password}".encode()).decode()
    assert_no_secret(views(setup, run, ids), sas, token, password, basic)


@pytest.mark.ledger_incidental
@pytest.mark.parametrize(
    ("var", "value", "problem"),
    [
        ("SAS", "tok€n-123", "outside Latin-1"),
        ("MAIL_TOKEN", "tok🚀n-123", "outside Latin-1"),
        ("SAS", " token-123", "space at the start"),
        ("SAS", "token-123\xa0", "space at the end"),
        ("MAIL_TOKEN", "token-123 ", "space at the end"),
    ],
)
def test_a_header_value_a_header_cannot_carry_is_refused_at_load_by_name(
    var: str, value: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = providers_conf("http://127.0.0.1:9")
    for name in ("SAS", "MAIL_TOKEN", "VAULT_PASSWORD"):
        monkeypatch.setenv(name, value if name == var else "ok-value")
    reg = Registry({"mail": conf["mail"]}, source="settled.toml")
    try:
        with pytest.raises(ConfigError) as err:
            reg.provider("mail")
    finally:
        reg.close()
    msg = str(err.value)
    assert var in msg and problem in msg, msg
    assert value.strip() not in msg and "\n" not in msg


def test_a_password_outside_latin1_goes_as_the_base64_of_its_utf8(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAS", "s-1")
    monkeypatch.setenv("MAIL_TOKEN", "t-1")
    monkeypatch.setenv("VAULT_PASSWORD", "日本-€-🚀")
    code, _, err = cli("dispatch", "vault", "send", "--action-id", "v-1")
    assert code == 5, err
    want = base64.b64encode("acct:日本-€-🚀".encode()).decode()
    assert {"authorization": b"Basic " + want.encode()} in setup["echo"].received


def test_params_in_a_path_or_query_are_encoded_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, location: Any
) -> None:
    """A placeholder's value in a path segment or the query string is percent-encoded
    once: ``%2F`` arrives as ``%252F`` and the server decodes it back to ``%2F``."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            return None

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            self.send_response(201)
            self.send_header("Content-Length", "11")
            self.end_headers()
            self.wfile.write(b'{"id":"p1"}')

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        conf = {
            "type": "http",
            "base_url": f"http://127.0.0.1:{httpd.server_address[1]}",
            "operations": {
                "put": {
                    "tier": "full",
                    "attempts": 1,
                    "object_id": "/id",
                    "request": {
                        "method": "POST",
                        "path": "/folders/{params.folder}",
                        "query": {"sig": "{params.sig}"},
                        "body": {"x": 1},
                    },
                }
            },
        }
        config = write_config(tmp_path / "settled.toml", {"api": conf})
        monkeypatch.setenv("SETTLED_CONFIG", str(config))
        params = json.dumps({"folder": "a%2Fb é", "sig": "ab%2Fc+d=é&x"})
        code, _, err = cli("dispatch", "api", "put", "--params", params, "--action-id", "p-1")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert code == 0, err
    path, _, query = seen[0].partition("?")
    assert path == "/folders/a%252Fb%20%C3%A9"
    assert unquote(path.rsplit("/", 1)[1]) == "a%2Fb é"
    from urllib.parse import parse_qs

    assert parse_qs(query) == {"sig": ["ab%2Fc+d=é&x"]}
