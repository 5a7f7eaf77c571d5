"""Configuration mistakes in an ``http`` provider section: one test per mistake, each
message one line naming the file, the key and the fix; from the CLI, exit 1 with the
ledger untouched."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from support import run_cli, write_config

from settled.errors import ConfigError
from settled.providers import Registry

pytestmark = pytest.mark.ledger_free

GOOD: dict[str, Any] = {
    "type": "http",
    "base_url": "https://api.example.com",
    "headers": {"Authorization": "Bearer ${MAIL_TOKEN}"},
    "operations": {
        "send": {
            "tier": "reconcilable",
            "idempotency_header": "Idempotency-Key",
            "request": {"method": "POST", "path": "/messages"},
            "reconciliation_key_field": "client_reference",
            "object_id": "/id",
            "query": {"method": "GET", "path": "/delivered/{reconciliation_key}"},
            "status": "/status",
            "applied": ["delivered"],
            "not_applied": ["bounced"],
        }
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """GOOD with one key changed (``None`` deletes it)."""
    conf = copy.deepcopy(GOOD)
    *outer, last = path.split(".")
    node = conf
    for part in outer:
        node = node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return conf


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAIL_TOKEN", "t0k3n")


def build(conf: dict[str, Any]) -> None:
    reg = Registry({"mail": conf}, source="settled.toml")
    try:
        reg.load_all()
    finally:
        reg.close()


def test_the_good_config_loads() -> None:
    build(GOOD)


MISTAKES = [
    # (change, value, key named in the message, words of the fix)
    ("operations.send.tier", "ful", "operations.send.tier", "full, reconcilable, partial, blind"),
    ("operations.send.tier", None, "operations.send.tier", 'tier = "full"'),
    ("operations.send.query", None, "operations.send.query", "needs a query"),
    ("operations.send.status", "status[", "operations.send.status", "JMESPath expression"),
    ("operations.send.object_id", "/a/~2", "operations.send.object_id", "~0 for ~"),
    ("operations.send.retries", 3, "operations.send.retries", "remove it"),
    ("tls_verify", False, "providers.mail.tls_verify", "remove it"),
    ("base_url", "ftp://x", "providers.mail.base_url", "http:// or https://"),
    ("base_url", None, "providers.mail.base_url", "add base_url"),
    ("operations.send.attempts", 0, "operations.send.attempts", ">= 1"),
    ("operations.send.consistency_window", -1, "operations.send.consistency_window", ">= 0"),
    ("operations.send.request", None, "operations.send.request", "add request ="),
    (
        "operations.send.request",
        {"method": "GET", "path": "/m"},
        "operations.send.request.method",
        "POST",
    ),
    ("operations.send.request", {"path": "m"}, "operations.send.request.path", 'start with "/"'),
    (
        "operations.send.query",
        {"method": "POST", "path": "/q"},
        "operations.send.query.method",
        "must not change",
    ),
    (
        "operations.send.query",
        {"path": "/q/{id}"},
        "operations.send.query.path",
        "{reconciliation_key}",
    ),
    (
        "operations.send.query",
        {"path": "/q/{provider_object_id}"},
        None,
        None,
    ),  # fine: object_id set
    (
        "operations.send.reconciliation_key_field",
        None,
        "operations.send.query.path",
        "reconciliation_key_field",
    ),
    ("operations.send.applied", None, "operations.send.applied", 'applied = ["delivered"]'),
    ("operations.send.applied", "delivered", "operations.send.applied", "list"),
    (
        "operations.send.not_found",
        "gone",
        "operations.send.not_found",
        '"pending" or "not_applied"',
    ),
    ("operations.send.verify", {"interval": 0}, "operations.send.verify.interval", "> 0"),
    ("operations.send.verify", {"every": 2}, "operations.send.verify.every", "interval, deadline"),
    ("operations.send.verify", {"min_checks": 0}, "operations.send.verify.min_checks", ">= 1"),
    ("operations.send.verify", {"min_checks": 2.5}, "operations.send.verify.min_checks", ">= 1"),
    (
        "operations.send.idempotency_header",
        "Idem Key",
        "operations.send.idempotency_header",
        "omit it",
    ),
    ("headers", {"Authorization": "Bearer ${NOPE_UNSET}"}, "headers.Authorization", "export it"),
    ("headers", {"Authorization": "Bearer ${bad-name}"}, "headers.Authorization", "${NAME}"),
    ("headers", {"Bad Header": "x"}, "headers.Bad Header", "header name"),
    ("operations", None, "providers.mail.operations", "operations.OP]"),
    ("timeout", 0, "providers.mail.timeout", "> 0"),
    ("base_url", "https://u:pw@api.example.com", "providers.mail.base_url", "in headers"),
]


@pytest.mark.parametrize(
    ("change", "value", "key", "fix"),
    MISTAKES,
    ids=[m[0] + "=" + repr(m[1])[:20] for m in MISTAKES],
)
def test_mistake_is_named(change: str, value: Any, key: str | None, fix: str | None) -> None:
    conf = with_change(change, value)
    if key is None:
        build(conf)
        return
    with pytest.raises(ConfigError) as err:
        build(conf)
    msg = str(err.value)
    assert msg.startswith("settled.toml: providers.mail"), msg
    assert key in msg and fix in msg, msg
    assert "\n" not in msg and "t0k3n" not in msg


@pytest.mark.parametrize(
    ("tier", "extra", "fix"),
    [
        ("partial", {}, "verified by a person"),
        ("blind", {"reconciliation_key_field": None}, "verified by a person"),
        ("blind", {"query": None}, "gets no reconciliation key"),
    ],
)
def test_tier_and_query_must_agree(tier: str, extra: dict[str, Any], fix: str) -> None:
    conf = with_change("operations.send.tier", tier)
    for k, v in extra.items():
        conf = copy.deepcopy(conf)
        if v is None:
            del conf["operations"]["send"][k]
    with pytest.raises(ConfigError, match=fix):
        build(conf)


def test_cli_surfaces_config_errors_and_leaves_the_ledger(tmp_path: Path) -> None:
    conf = with_change("operations.send.tier", "eventually")
    cfg = write_config(tmp_path / "settled.toml", {"mail": conf})
    env = {"MAIL_TOKEN": "t0k3n"}
    listed = run_cli("providers", env=env)
    assert listed.returncode == 1 and listed.stdout == ""
    line = listed.stderr.strip()
    assert line.startswith(f"settled: error: {cfg}: providers.mail.operations.send.tier")
    assert "use one of full, reconcilable, partial, blind" in line and "\n" not in line
    sent = run_cli("dispatch", "mail", "send", "--params", "{}", env=env)
    assert sent.returncode == 1 and sent.stderr.strip() == line
    db = Path(os.environ["SETTLED_DB"])
    assert not db.exists() or "mail" not in run_cli("queue", "--status", "all", "--json").stdout


def test_full_operation_may_declare_a_404_as_proof_of_absence() -> None:
    """Allowed since rule 9: a 404 counts only after the record's landing time, which
    the core enforces; the declaration is visible as ``absence_proof``."""
    conf = with_change("operations.send.tier", "full")
    conf["operations"]["send"]["not_found"] = "not_applied"
    conf["operations"]["send"]["not_found_when"] = {"http_status": [404]}
    reg = Registry({"mail": conf}, source="settled.toml")
    try:
        spec = reg.operation("mail", "send")
    finally:
        reg.close()
    assert spec.absence_proof is True and spec.window == 0.0


def test_min_checks_is_declared_and_defaults_to_three() -> None:
    def spec(conf: dict[str, Any]) -> Any:
        reg = Registry({"mail": conf}, source="settled.toml")
        try:
            return reg.operation("mail", "send")
        finally:
            reg.close()

    assert spec(GOOD).verify_min_checks == 3
    chosen = spec(with_change("operations.send.verify", {"deadline": 60, "min_checks": 5}))
    assert (chosen.verify_deadline, chosen.verify_min_checks) == (60.0, 5)
    assert chosen.to_json()["verify_min_checks"] == 5
