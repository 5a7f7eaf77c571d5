"""``[providers.NAME.callbacks]`` is checked when settled.toml loads, whatever the
provider's type: each mistake is one line naming the file, the key and the fix; the
secret must be a ``${VAR}``, read only when a process that receives callbacks starts;
the provider type never sees the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import run_cli, write_config

from settled import config
from settled.errors import ConfigError
from settled.providers import Registry

pytestmark = pytest.mark.ledger_free

GOOD: dict[str, Any] = {
    "scheme": "twilio",
    "secret": "${TWILIO_AUTH_TOKEN}",
    "url": "https://h.example/hooks/sms",
    "names": "provider_object_id",
    "key": "MessageSid",
    "status": "MessageStatus",
    "applied": ["delivered"],
    "not_applied": ["undelivered", "failed"],
    "delivered": ["sent"],
}
TYPES = {
    "sim": {"type": "sim", "base_url": "http://127.0.0.1:9"},
    "http": {
        "type": "http",
        "base_url": "https://api.example.com",
        "operations": {"send": {"tier": "partial", "request": {"method": "POST", "path": "/m"}}},
    },
    "caldav": {
        "type": "caldav",
        "url": "http://127.0.0.1:9/cal/",
        "username": "u",
        "password": "p",
    },
}


def load(table: Any, kind: str = "sim") -> config.Config:
    return config.from_dict(
        {"providers": {"sms": {**TYPES[kind], "callbacks": table}}}, source="settled.toml"
    )


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_every_provider_type_takes_callbacks_and_never_sees_them(kind: str) -> None:
    cfg = load(GOOD, kind)
    cb = cfg.callbacks["sms"]
    assert (cb.scheme, cb.names, cb.key.text, cb.status.text) == (
        "twilio",
        "provider_object_id",
        "MessageSid",
        "MessageStatus",
    )
    assert "callbacks" not in cfg.providers["sms"]
    with Registry(cfg.providers, source="settled.toml") as reg:
        reg.load_all()  # the type's own checks would refuse an unknown key


def test_the_secret_is_read_at_run_time_not_at_load() -> None:
    from settled.callbacks.settings import resolve_secret

    cb = load(GOOD).callbacks["sms"]  # no TWILIO_AUTH_TOKEN needed to load
    with pytest.raises(ConfigError, match="TWILIO_AUTH_TOKEN is not set"):
        resolve_secret(cb, {})
    assert resolve_secret(cb, {"TWILIO_AUTH_TOKEN": "t0k"}) == "t0k"
    with pytest.raises(ConfigError, match="is empty"):
        resolve_secret(cb, {"TWILIO_AUTH_TOKEN": ""})


BAD = [
    ({"colour": "red"}, "callbacks.colour: unknown key; remove it or use one of"),
    ({"scheme": "rot13"}, "callbacks.scheme: 'rot13' is not a scheme; use one of"),
    ({"scheme": None}, "callbacks.scheme: missing"),
    (
        {"secret": "abc123"},
        'callbacks.secret: must name an environment variable, e.g. secret = "${HOOK_SECRET}"',
    ),
    ({"secret": "${BROKEN"}, "callbacks.secret: must name an environment variable"),
    ({"secret": "${A}${"}, "callbacks.secret: has a malformed"),
    ({"tolerance": 30}, "callbacks.tolerance: the twilio scheme signs no timestamp; remove it"),
    (
        {"event_id": "/id"},
        "callbacks.event_id: the twilio event id is the message id and status together; remove it",
    ),
    ({"names": "order_id"}, "callbacks.names: 'order_id' is not a record field"),
    ({"key": None}, "callbacks.key: missing"),
    ({"key": "/bad~2pointer"}, "callbacks.key: '/bad~2pointer' is not a JSON pointer"),
    ({"key": "?a b"}, "callbacks.key: '?a b': write ?NAME"),
    ({"status": None}, "callbacks.status: missing"),
    (
        {"status": "?s"},
        "callbacks.status: a query-string parameter is read only where the URL is signed",
    ),
    ({"applied": None, "not_applied": None, "delivered": None}, "callbacks.applied: missing"),
    ({"applied": []}, "callbacks.applied: must be a non-empty list of strings, numbers or"),
    ({"applied": "delivered"}, "callbacks.applied: must be a list of values"),
    (
        {"not_applied": {"path": "/event", "is": "failed", "severity": "permanent"}},
        "callbacks.not_applied.severity: unknown key in a condition; use path with is, in or "
        "exists (or all / any around several)",
    ),
    (
        {"not_applied": {"all": [{"path": "/e", "is": "failed"}, {"path": "/s"}]}},
        "callbacks.not_applied.all[1]: a path is tested by exactly one of is, in or exists",
    ),
    (
        {"not_applied": {"all": [{"path": "/e", "is": "failed"}, {"http_status": [500]}]}},
        "callbacks.not_applied.all[1].http_status: an event has no HTTP status to test",
    ),
    (
        {"applied": {"path": "items[?", "exists": True}},
        "callbacks.applied.path: 'items[?' is neither a JSON pointer",
    ),
    ({"applied": {"any": []}}, "callbacks.applied.any: must be a non-empty list of predicates"),
    (
        {"applied": ["sent"]},
        "callbacks.delivered: 'sent' is in both applied and delivered; keep it in one",
    ),
    ({"url": None}, "callbacks.url: missing: Twilio signs the URL it calls"),
    ({"url": "https://h.example/hooks?x=1"}, "callbacks.url: must not hold a query string"),
    ({"header": "X-Sig"}, "callbacks.header: applies to scheme = 'hmac-sha256' only; remove it"),
    ({"list": "events"}, "callbacks.list: must be a JSON pointer to the array of events"),
    ({"pending_expiry": 0}, "callbacks.pending_expiry: must be > 0"),
    ({"username": "u"}, "callbacks.username: applies to scheme = 'token' only"),
]


@pytest.mark.parametrize(
    ("change", "message"), BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)]
)
def test_each_mistake_names_the_file_the_key_and_the_fix(
    change: dict[str, Any], message: str
) -> None:
    table = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        load(table)
    text = str(err.value)
    assert text.startswith("settled.toml: providers.sms.callbacks"), text
    assert message in text, text
    assert "\n" not in text


def test_scheme_specific_keys() -> None:
    hmac_table = {
        "scheme": "hmac-sha256",
        "secret": "${S}",
        "names": "action_id",
        "key": "/ref",
        "status": "/state",
        "applied": ["ok"],
    }
    with pytest.raises(ConfigError, match=r"callbacks\.header: missing or not a header name"):
        load(hmac_table)
    with pytest.raises(ConfigError, match=r"callbacks\.encoding: 'hexadecimal'"):
        load({**hmac_table, "header": "X-Sig", "encoding": "hexadecimal"})
    cb = load({**hmac_table, "header": "X-Sig", "encoding": "base64", "prefix": "v1="}).callbacks[
        "sms"
    ]
    signing = cb.signing  # the scheme's own options live on its class
    assert (signing.header, signing.encoding, signing.prefix, cb.event_id) == (
        "X-Sig",
        "base64",
        "v1=",
        None,
    )
    std = {**hmac_table, "scheme": "standard-webhooks", "tolerance": 60}
    assert load(std).callbacks["sms"].tolerance == 60
    with pytest.raises(
        ConfigError, match="the standard-webhooks event id is the webhook-id header"
    ):
        load({**std, "event_id": "/id"})
    with pytest.raises(ConfigError, match=r"callbacks: must be a table"):
        load("twilio")
    token = {**hmac_table, "scheme": "token", "username": "postmark"}
    assert load(token).callbacks["sms"].weaker


def test_a_bad_callbacks_table_stops_a_command_with_one_line(tmp_path: Path) -> None:
    write_config(
        tmp_path / "settled.toml", {"sms": {**TYPES["sim"], "callbacks": {**GOOD, "scheme": "md5"}}}
    )
    p = run_cli("providers", env={"SETTLED_CONFIG": str(tmp_path / "settled.toml")})
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "providers.sms.callbacks.scheme" in p.stderr
    assert "Traceback" not in p.stderr


def test_every_worked_config_in_the_docs_loads() -> None:
    """docs/callbacks.md and the cookbook's callbacks tables load as written, and
    docs/callbacks.md shows a working table for every scheme."""
    import re
    import tomllib

    from support import ROOT

    from settled.callbacks.settings import SCHEMES

    pages = [ROOT / "docs" / "callbacks.md", *sorted((ROOT / "docs" / "cookbook").glob("*.md"))]
    shown: dict[str, list[str]] = {}
    for page in pages:
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S):
            data = tomllib.loads(block)
            for conf in data.get("providers", {}).values():
                conf.setdefault("type", "sim")
                conf.setdefault("base_url", "http://127.0.0.1:9")
            cfg = config.from_dict(data, source=page.name)
            for cb in cfg.callbacks.values():
                shown.setdefault(page.name, []).append(cb.scheme)
    assert sorted(set(shown["callbacks.md"])) == sorted(SCHEMES)
    assert sum(map(len, shown.values())) >= len(SCHEMES) + 3  # and the cookbook's three
