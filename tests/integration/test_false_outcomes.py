"""The five false outcomes real providers' documented replies produced, each through
the CLI against a stand-in that replies as the provider documents (``standins``).
Each fails on the code before rules 19 and 20: there, the first and the last
recorded CONFIRMED for an effect that did not happen, and the three others FAILED an
effect that did, or may have (and ``retry`` sent it again).

1. Slack's 200 with ``ok: false`` was taken as the effect.
2. Slack's ``internal_error``, which may come after the post, was FAILED and re-sent.
3. Mailgun's temporary failure was taken as final.
4. A 404 from the wrong host (PagerDuty's events host) was taken as absence.
5. A match on the recipient alone (SendGrid) confirmed another mail's delivery.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import standins
from standins import StandIn
from support import run_cli, write_config

pytestmark = pytest.mark.ledger_incidental

SLACK_ENV = {"SLACK_BOT_TOKEN": "xoxb-test-token"}
POST = json.dumps({"channel": "C1", "text": "deploy 1.4.2 is live"})


def slack_conf(url: str, **op: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "base_url": f"{url}/api",
        "timeout": 5.0,
        "auth": {"type": "bearer", "token": "${SLACK_BOT_TOKEN}"},
        "operations": {
            "post": {
                "tier": "full",
                "attempts": 1,
                "request": {"method": "POST", "path": "/chat.postMessage"},
                **op,
            }
        },
    }


def dispatch(cfg: Path, env: dict[str, str], *args: str) -> Any:
    out = run_cli("--config", str(cfg), "dispatch", *args, "--json", env=env)
    record = json.loads(out.stdout) if out.stdout.strip() else None
    return out, record


@pytest.fixture
def slack() -> Any:
    fake = standins.Slack()
    host = StandIn(fake.handle)
    yield fake, host
    host.close()


def test_1_a_200_with_ok_false_is_never_the_effect(tmp_path: Path, slack: Any) -> None:
    fake, host = slack
    # As the engineer wrote it: full, no status. Refused at load, nothing sent.
    bare = write_config(tmp_path / "bare.toml", {"slack": slack_conf(host.url)})
    fake.plan = ["channel_not_found"]
    out, _ = dispatch(bare, SLACK_ENV, "slack", "post", "--params", POST, "--action-id", "p1")
    assert out.returncode == 1 and "a 2xx by itself proves nothing (rule 19)" in out.stderr
    assert host.requests == []
    # With the object id declared, a 200 that carries none proves nothing either.
    with_id = write_config(tmp_path / "id.toml", {"slack": slack_conf(host.url, object_id="/ts")})
    out, rec = dispatch(with_id, SLACK_ENV, "slack", "post", "--params", POST, "--action-id", "p2")
    assert out.returncode == 4, out.stderr
    assert rec["status"] == "DENIED_UNRESOLVED" and rec["confirmed_by"] is None
    assert fake.messages == []


def test_2_an_error_that_may_follow_the_post_is_unknown_and_never_re_sent(
    tmp_path: Path, slack: Any
) -> None:
    fake, host = slack
    conf = slack_conf(
        host.url,
        object_id="/ts",
        status="/ok",
        applied=[True],
        not_applied=[False],
        maybe_applied={"path": "/error", "in": ["internal_error", "fatal_error"]},
    )
    cfg = write_config(tmp_path / "settled.toml", {"slack": conf})
    fake.plan = ["+internal_error"]  # Slack posted it, then answered internal_error
    out, rec = dispatch(cfg, SLACK_ENV, "slack", "post", "--params", POST, "--action-id", "p1")
    assert out.returncode == 4, out.stderr
    assert rec["status"] == "DENIED_UNRESOLVED" and "maybe_applied" in rec["reason"]
    retry = run_cli("--config", str(cfg), "retry", "p1", env=SLACK_ENV)
    assert retry.returncode == 7 and "DENIED_UNRESOLVED" in retry.stderr
    assert len(fake.messages) == 1 and len(host.sent()) == 1
    # A final error is FAILED, and may be retried.
    fake.plan = ["channel_not_found"]
    out, rec = dispatch(cfg, SLACK_ENV, "slack", "post", "--params", POST, "--action-id", "p2")
    assert out.returncode == 5 and rec["status"] == "FAILED"


MAILGUN_ENV = {"MAILGUN_API_KEY": "key-standin"}
MAIL = json.dumps(
    {"from": "s@mg.example.com", "to": "ada@example.com", "subject": "s", "text": "t"}
)


def test_3_a_temporary_failure_is_not_final(tmp_path: Path) -> None:
    fake = standins.Mailgun()
    fake.lag = 0
    host = StandIn(fake.handle)
    try:
        cfg = write_config(
            tmp_path / "settled.toml",
            {
                "mailgun": {
                    "type": "http",
                    "base_url": f"{host.url}/v3/mg.example.com",
                    "auth": {"type": "basic", "username": "api", "password": "${MAILGUN_API_KEY}"},
                    "operations": {
                        "send": {
                            "tier": "reconcilable",
                            "consistency_window": 0,
                            "attempts": 1,
                            "request": {
                                "path": "/messages",
                                "encoding": "form",
                                "body": {
                                    "to": "{params.to}",
                                    "from": "{params.from}",
                                    "v:settled_key": "{reconciliation_key}",
                                },
                            },
                            "query": {
                                "path": "/events",
                                "list": "/items",
                                "match": {'"user-variables".settled_key': "{reconciliation_key}"},
                                "where": {
                                    "any": [
                                        {"path": "/event", "is": "delivered"},
                                        {"path": "/event", "is": "failed"},
                                    ]
                                },
                            },
                            "applied": {"path": "/event", "is": "delivered"},
                            "not_applied": {
                                "all": [
                                    {"path": "/event", "is": "failed"},
                                    {"path": "/severity", "is": "permanent"},
                                ]
                            },
                            "verify": {"interval": 0.05, "deadline": 0.5, "min_checks": 3},
                        }
                    },
                }
            },
        )
        fake.plan = [["failed:temporary"]]
        out, rec = dispatch(
            cfg,
            MAILGUN_ENV,
            "mailgun",
            "send",
            "--params",
            MAIL,
            "--action-id",
            "m1",
            "--wait",
            "--wait-timeout",
            "30",
        )
        assert out.returncode == 4, out.stderr
        assert rec["status"] == "DENIED_UNRESOLVED", rec["reason"]
        assert "/event = 'failed'" in rec["reason"] and "not terminal" in rec["reason"]
    finally:
        host.close()


PD_ENV: dict[str, str] = {}
# As the engineer had to: the routing key a param (a body may now read ${VAR}).
PAGE = json.dumps(
    {
        "routing_key": "R0UTINGKEY0000000000000000000000",
        "summary": "disk full",
        "source": "db-1",
        "severity": "critical",
    }
)


def pd_conf(events: str, **op: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "base_url": events,
        "timeout": 1.0,
        "operations": {
            "trigger": {
                "tier": "reconcilable",
                "consistency_window": 0,
                "attempts": 1,
                "reconciliation_key_field": "dedup_key",
                "request": {
                    "path": "/v2/enqueue",
                    "body": {
                        "routing_key": "{params.routing_key}",
                        "event_action": "trigger",
                        "payload": {
                            "summary": "{params.summary}",
                            "source": "{params.source}",
                            "severity": "{params.severity}",
                        },
                    },
                },
                # The query: the incident asked of the events host itself.
                "query": {"path": "/incidents/{reconciliation_key}"},
                "status": "/incident/status",
                "applied": ["triggered", "acknowledged", "resolved"],
                "not_found": "not_applied",
                "verify": {"interval": 0.2, "deadline": 3.0, "min_checks": 3},
                **op,
            }
        },
    }


def test_4_a_404_from_the_wrong_host_is_never_absence(tmp_path: Path) -> None:
    fake = standins.PagerDuty()
    events = StandIn(fake.events)
    try:
        # A short landing time, so that the old code's false absence came quickly.
        fast = {"lease_grace": 0}
        bare = write_config(tmp_path / "bare.toml", {"pd": pd_conf(events.url)}, dispatch=fast)
        out, _ = dispatch(
            bare, PD_ENV, "pd", "trigger", "--params", PAGE, "--action-id", "i0", "--wait"
        )
        # Before rule 20 this became FAILED (exit 5) although the incident was triggered.
        assert out.returncode == 1 and "not_found_when: missing" in out.stderr
        assert events.requests == []
        # PagerDuty's own not-found reply declared: the events host's 404 is not it.
        shape = {"http_status": [404], "path": "/error/code", "is": 2100}
        cfg = write_config(
            tmp_path / "settled.toml", {"pd": pd_conf(events.url, not_found_when=shape)}
        )
        out, rec = dispatch(
            cfg,
            PD_ENV,
            "pd",
            "trigger",
            "--params",
            PAGE,
            "--action-id",
            "i1",
            "--wait",
            "--wait-timeout",
            "30",
        )
        assert out.returncode == 4, out.stderr
        assert rec["status"] == "DENIED_UNRESOLVED" and len(fake.incidents) == 1
        assert (
            "could not be checked" in rec["reason"]
            and "not the declared not-found reply" in rec["reason"]
        )
    finally:
        events.close()


SG_ENV = {"SENDGRID_API_KEY": "SG.test-key"}


def test_5_a_match_that_names_no_action_cannot_confirm(tmp_path: Path) -> None:
    fake = standins.SendGrid()
    host = StandIn(fake.handle)
    try:
        conf = {
            "type": "http",
            "base_url": host.url,
            "auth": {"type": "bearer", "token": "${SENDGRID_API_KEY}"},
            "operations": {
                "send": {
                    "tier": "reconcilable",
                    "consistency_window": 0,
                    "attempts": 1,
                    "request": {
                        "path": "/v3/mail/send",
                        "body": {
                            "personalizations": [{"to": [{"email": "{params.to}"}]}],
                            "from": {"email": "s@example.com"},
                            "subject": "s",
                            "content": [{"type": "text/plain", "value": "t"}],
                        },
                    },
                    "query": {
                        "path": "/v3/messages",
                        "query": {"query": 'to_email="{params.to}"'},
                        "list": "/messages",
                        "match": {"/to_email": "{params.to}"},
                    },
                    "status": "/status",
                    "applied": ["delivered"],
                    "not_applied": ["not_delivered"],
                    "verify": {"interval": 0.05, "deadline": 0.5},
                }
            },
        }
        cfg = write_config(tmp_path / "settled.toml", {"sg": conf})
        fake.messages.append(
            {
                "msg_id": "earlier",
                "to_email": "ada@example.com",
                "status": "delivered",
                "custom_args": {},
            }
        )
        fake.plan = ["lagging"]  # this one is dropped, and not listed yet
        params = json.dumps({"to": "ada@example.com"})
        out, _ = dispatch(
            cfg,
            SG_ENV,
            "sg",
            "send",
            "--params",
            params,
            "--action-id",
            "e1",
            "--wait",
            "--wait-timeout",
            "30",
        )
        assert (
            out.returncode == 1
            and "names neither the reconciliation key nor the object id" in out.stderr
        )
        assert host.sent() == []
        check = run_cli("--config", str(cfg), "providers", "check", env=SG_ENV)
        assert check.returncode == 1 and "rule 19" in check.stderr
    finally:
        host.close()
