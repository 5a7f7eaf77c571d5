"""docs/providers.md is checked: its worked examples load, and the configuration
errors it quotes are the ones settled prints."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from support import run_cli

from settled import config
from settled.errors import ConfigError
from settled.providers import Registry

pytestmark = pytest.mark.ledger_free

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), re.S)


def test_worked_examples_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAIL_TOKEN", "x")
    monkeypatch.setenv("CAL_PASSWORD", "y")
    monkeypatch.setenv("SHOP_TOKEN", "z")
    toml = [b for b in blocks("toml") if "[providers.mail]" in b or "[providers.cal]" in b]
    assert len(toml) == 2
    for i, text in enumerate(toml):
        path = tmp_path / f"example{i}.toml"
        path.write_text(text)
        cfg = config.load(str(path))
        with Registry(cfg.providers, source=cfg.source) as reg:
            reg.load_all()
            ops = {(n, o) for n in reg.names() for o in reg.provider(n).operations()}
        assert ops in (
            {("mail", o) for o in ("send", "book", "sms", "ping")},
            {("cal", o) for o in ("book", "move", "cancel")},
        )


def test_quoted_errors_are_real(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = blocks("toml")[0]
    quoted = [ln for ln in DOC.read_text().splitlines() if ln.startswith("settled: error:")]
    assert len(quoted) == 10
    # The refusals of rules 19 and 20, quoted where they are explained.
    rule19, checked = quoted[0], quoted[8:]
    quoted = quoted[1:8]
    monkeypatch.setenv("SENDGRID_API_KEY", "SG.x")
    sendgrid = (DOC.parent / "cookbook" / "sendgrid-mail.md").read_text()
    refused = re.findall(r"```toml\n(.*?)```", sendgrid, re.S)[0].replace(
        'tier = "partial"',
        'tier = "reconcilable"\nquery = { path = "/v3/messages", list = "/messages", '
        'match = { "/to_email" = "{params.to}" } }\nstatus = "/status"\napplied = ["delivered"]',
    )
    cfg = config.from_dict(tomllib.loads(refused), source="settled.toml")
    with pytest.raises(ConfigError) as err, Registry(cfg.providers, source="settled.toml") as r:
        r.load_all()
    assert f"settled: error: {err.value}" == rule19
    shown = next(b for b in blocks("toml") if "[providers.pd.operations.trigger]" in b)
    cfg = config.from_dict(tomllib.loads(shown), source="settled.toml")
    with Registry(cfg.providers, source="settled.toml") as r:
        assert [f"settled: error: {p}" for p in r.problems()] == checked
    variants = [  # (config, MAIL_TOKEN or None for unset), in the order the page quotes them
        (example, "tok€n"),
        (example, "token "),
        (example.replace('tier = "reconcilable"', 'tier = "eventually"'), "x"),
        (
            example.replace(
                'query = { method = "GET", path = "/delivered/{reconciliation_key}" }\n', ""
            ),
            "x",
        ),
        (example.replace('status = "/status"', 'status = "status["'), "x"),
        (example.replace("timeout = 5.0\n", "timeout = 5.0\ntls_verify = false\n"), "x"),
        (example, None),  # MAIL_TOKEN not set
    ]
    for line, (text, token) in zip(quoted, variants, strict=True):
        if token is None:
            monkeypatch.delenv("MAIL_TOKEN", raising=False)
        else:
            monkeypatch.setenv("MAIL_TOKEN", token)
        path = tmp_path / "settled.toml"
        path.write_text(text)
        cfg = config.load(str(path))
        with (
            pytest.raises(ConfigError) as err,
            Registry(cfg.providers, source="settled.toml") as reg,
        ):
            reg.load_all()
        assert f"settled: error: {err.value}" == line


def test_cli_help_mentions_audit() -> None:
    out = run_cli("providers", "audit", "--help")
    assert out.returncode == 0 and "exit 4" in out.stdout.lower().replace("\n", " ")


def test_the_request_shape_example_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib

    monkeypatch.setenv("SHOP_TOKEN", "z")
    [text] = [b for b in blocks("toml") if "[providers.shop]" in b]
    cfg = config.from_dict(tomllib.loads(text), source="providers.md")
    with Registry(cfg.providers, source="providers.md") as reg:
        spec = reg.operation("shop", "order")
    assert (spec.key_param, spec.conflict_statuses, spec.predicate) == (
        "order_number",
        (409,),
        True,
    )
