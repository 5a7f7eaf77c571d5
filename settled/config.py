"""settled.toml: loading and validation.

Every mistake is reported as one line naming the file, the key and the fix. Provider
sections are checked by their provider type when the registry builds them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from . import checks
from .address import parse_listen
from .errors import ConfigError, SettledError

if TYPE_CHECKING:
    from .callbacks.settings import CallbackConfig

TOP_KEYS = {"ledger", "postgres", "dispatch", "reconcile", "daemon", "providers", "serve"}
# Requests in flight at once to one provider, by provider type, unless the provider's
# ``max_in_flight`` or a ``--concurrency`` says otherwise. The sim answers on loopback
# in well under a millisecond: threads cost more client CPU than they save there. An
# ``http`` provider is a real API answering in tens to hundreds of ms (figures and
# reasons in docs/performance.md).
DEFAULT_IN_FLIGHT = {"sim": 1, "http": 16, "caldav": 4}
# Seconds a provider may answer 429/503 or not at all to every check before the daemon
# calls it an outage (a warning, the gauge settled_provider_outage, /healthz, an alert):
# longer than any Retry-After a healthy API sends for a burst (policy.MAX_HOLD is 300 s
# too), short enough that a provider stuck on 503 pages someone within minutes.
DEFAULT_OUTAGE_AFTER = 300.0
MAX_OUTAGE_AFTER = 86400.0
# [postgres]: the connections one ledger object holds (docs/postgres.md, "Connections")
DEFAULT_POOL_MIN = 1  # kept open: the one made when the ledger opens
DEFAULT_POOL_MAX = 2  # at most, at once
MAX_POOL = 100
# [reconcile] batch: the due rows one claim leases, a slice small enough that daemons
# sharing a ledger take turns (settled.reconcile.DEFAULT_BATCH; docs/postgres.md)
DEFAULT_SLICE = 25
MAX_CONCURRENCY = 100  # threads for one run's requests: the shared client keeps 100 connections
SECTION_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "ledger": {"path": str, "url": str, "busy_timeout": (int, float)},
    "postgres": {"pool_min": int, "pool_max": int, "pgbouncer": bool},
    "dispatch": {"lease_grace": (int, float), "backoff": (int, float), "group": int},
    "reconcile": {"batch": int, "lease": (int, float), "concurrency": int},
    "daemon": {"interval": (int, float)},
}
SERVE_KEYS = (
    "body_timeout",
    "bodies_per_client",
    "head_timeout",
    "hosts",
    "listen",
    "max_body",
    "max_connections",
    "tokens",
    "ui",
)
UI_KEYS = ("proxy_roles", "session_secret", "session_ttl", "trusted_proxies", "user_header")
DEFAULT_SESSION_TTL = 8 * 3600  # s a console login lasts: one working day
MAX_SESSION_TTL = 7 * 24 * 3600
TOKEN_KEYS = ("roles", "secret")
ROLES = ("read", "dispatch", "operate")  # dispatch and operate include read
DEFAULT_MAX_BODY = 1024 * 1024  # bytes of a request body `settled serve` reads
# The service's connection limits (docs/serve.md, settled.serve.connections): a request's
# head must arrive within 10 s and its body within 30 s (1 MiB at 35 KiB/s); 4,096
# connections at once (kept below the descriptor limit at start); 256 bodies read at once
# per client address before they are authenticated (callbacks, console logins).
DEFAULT_HEAD_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 4096
DEFAULT_BODIES_PER_CLIENT = 256
MAX_MAX_BODY = 64 * 1024 * 1024
_TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class ServeToken:
    """One API token of ``[serve.tokens.NAME]``. ``secret`` is as written (a
    ``${VAR}``); ``settled serve`` reads the variable when it starts, so that no
    other command needs it set."""

    name: str
    secret: str
    roles: tuple[str, ...]


@dataclass
class UiConfig:
    """``[serve.ui]``: the console at ``/ui/``. ``session_secret`` is as written (a
    ``${VAR}``), read by ``settled serve`` when it starts; without it the key that signs
    sessions and CSRF tokens is derived from the API tokens. ``trusted_proxies`` are the
    addresses (or networks) whose ``user_header`` names the person; each such person
    has ``proxy_roles``."""

    session_secret: str | None = None
    session_ttl: int = DEFAULT_SESSION_TTL
    trusted_proxies: tuple[str, ...] = ()
    user_header: str = "X-Forwarded-User"
    proxy_roles: tuple[str, ...] = ("read",)


@dataclass
class ServeConfig:
    """``[serve]``: where ``settled serve`` listens, the body cap, the connection
    limits, the API tokens and the extra host names it answers to (behind a reverse
    proxy)."""

    listen: str | None = None  # HOST:PORT; None: the default (settled.address)
    max_body: int = DEFAULT_MAX_BODY
    head_timeout: float = DEFAULT_HEAD_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    bodies_per_client: int = DEFAULT_BODIES_PER_CLIENT
    tokens: dict[str, ServeToken] = field(default_factory=dict)
    hosts: tuple[str, ...] = ()
    ui: UiConfig = field(default_factory=UiConfig)


@dataclass
class Config:
    source: str | None = None  # the file it came from, None for defaults
    ledger_path: str | None = None
    ledger_url: str | None = None  # a postgresql:// URL, ${VAR}s expanded
    busy_timeout: float | None = None
    pool_min: int = DEFAULT_POOL_MIN  # [postgres]
    pool_max: int = DEFAULT_POOL_MAX
    pgbouncer: bool = False
    lease_grace: float = 30.0
    backoff: float = 0.05
    dispatch_group: int | None = None  # bulk: actions per claim transaction
    reconcile_batch: int = DEFAULT_SLICE
    reconcile_lease: float = 60.0
    daemon_interval: float = 5.0
    reconcile_concurrency: int | None = None  # None: each provider type's default
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_in_flight: dict[str, int] = field(default_factory=dict)  # provider -> requests at once
    # provider -> seconds its checks may fail (429/503, unreachable) before it is an outage
    outage_after: dict[str, float] = field(default_factory=dict)
    # provider -> its [providers.NAME.callbacks] (rule 16), checked; secrets not read yet
    callbacks: dict[str, CallbackConfig] = field(default_factory=dict)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def where(self, key: str) -> str:
        return f"{self.source or 'config'}: {key}"

    def in_flight(self, provider: str) -> int:
        """How many requests may be in flight to ``provider`` when nothing says more:
        its ``max_in_flight``, else its type's default (``DEFAULT_IN_FLIGHT``)."""
        if provider in self.max_in_flight:
            return self.max_in_flight[provider]
        kind = self.providers.get(provider, {}).get("type")
        return DEFAULT_IN_FLIGHT.get(str(kind), 1)

    def concurrency(self, explicit: int | None, providers: list[str]) -> tuple[int, dict[str, int]]:
        """Threads for the requests of one run, and each provider's limit.

        ``explicit`` (``--concurrency``, ``[reconcile] concurrency``) sets the threads and
        every provider's limit, each capped by its ``max_in_flight``; without it, each
        provider gets its default and the threads are the largest of those."""
        if explicit is not None:
            limits = {p: min(explicit, self.max_in_flight.get(p, explicit)) for p in providers}
            return explicit, limits
        limits = {p: self.in_flight(p) for p in providers}
        return max(limits.values(), default=1), limits


def default_config_path() -> str | None:
    env = os.environ.get("SETTLED_CONFIG")
    if env:
        return env
    return "settled.toml" if Path("settled.toml").is_file() else None


def default_db_path() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    return os.path.join(base, "settled", "settled.db")


def load(path: str | None) -> Config:
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found (check --config / SETTLED_CONFIG)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    import tomllib  # only when there is a file to read

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the config as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    return from_dict(data, source=str(path), base=p.resolve().parent)


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _ledger_url(cfg: Config, ledger: dict[str, Any]) -> str:
    """``[ledger] url``: a PostgreSQL URL, whose ``${VAR}``s (a password, say) are read
    from the environment now and percent-encoded, never stored."""
    where = cfg.where("ledger.url")
    if "path" in ledger:
        raise ConfigError(
            f"{cfg.where('ledger')}: set path (a SQLite file) or url (PostgreSQL), not both"
        )
    raw = ledger["url"]
    if not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{where} must be a postgresql:// URL (a SQLite ledger is [ledger] path)")
    if "${" in _ENV.sub("", raw):
        raise ConfigError(f"{where} has a malformed ${{...}}; write ${{NAME}}")

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            raise ConfigError(
                f"{where}: environment variable {m.group(1)} is not set; export it before "
                "running settled (values are read at run time, never stored)"
            )
        return quote(value, safe="")

    return _ENV.sub(sub, raw)


def from_dict(
    data: dict[str, Any], *, source: str | None = None, base: Path | None = None
) -> Config:
    cfg = Config(source=source)
    unknown = set(data) - TOP_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(
            f"{cfg.where(key)}: unknown section; expected one of {', '.join(sorted(TOP_KEYS))}"
        )
    _check_sections(cfg, data)
    ledger = data.get("ledger", {})
    if "path" in ledger:
        lp = Path(os.path.expanduser(ledger["path"]))
        cfg.ledger_path = str(lp if lp.is_absolute() or base is None else base / lp)
    if "url" in ledger:
        cfg.ledger_url = _ledger_url(cfg, ledger)
    if "busy_timeout" in ledger:
        cfg.busy_timeout = float(ledger["busy_timeout"])
    _postgres(cfg, data.get("postgres", {}))
    disp = data.get("dispatch", {})
    cfg.lease_grace = float(disp.get("lease_grace", cfg.lease_grace))
    cfg.backoff = float(disp.get("backoff", cfg.backoff))
    if "group" in disp:
        cfg.dispatch_group = int(disp["group"])
    rec = data.get("reconcile", {})
    cfg.reconcile_batch = int(rec.get("batch", cfg.reconcile_batch))
    cfg.reconcile_lease = float(rec.get("lease", cfg.reconcile_lease))
    if "concurrency" in rec:
        cfg.reconcile_concurrency = int(rec["concurrency"])
        if cfg.reconcile_concurrency > MAX_CONCURRENCY:
            raise ConfigError(
                f"{cfg.where('reconcile.concurrency')} must be at most {MAX_CONCURRENCY} "
                "(one HTTP connection per thread)"
            )
    cfg.daemon_interval = float(data.get("daemon", {}).get("interval", cfg.daemon_interval))
    if cfg.daemon_interval <= 0:
        raise ConfigError(f"{cfg.where('daemon.interval')} must be > 0")
    _providers(cfg, data.get("providers", {}))
    _serve(cfg, data.get("serve", {}))
    return cfg


def _check_sections(cfg: Config, data: dict[str, Any]) -> None:
    """Every [section] key is known and of its declared kind."""
    for section, keys in SECTION_KEYS.items():
        sect = data.get(section, {})
        if not isinstance(sect, dict):
            raise ConfigError(f"{cfg.where(section)} must be a table ([{section}])")
        for key, value in sect.items():
            if key not in keys:
                raise ConfigError(
                    f"{cfg.where(section + '.' + key)}: unknown key; expected one of "
                    f"{', '.join(sorted(keys))}"
                )
            dotted = f"{section}.{key}"
            if keys[key] is str:
                if not isinstance(value, str) or not value:
                    raise ConfigError(f"{cfg.where(dotted)} must be a non-empty string")
            elif keys[key] is bool:
                if not isinstance(value, bool):
                    raise ConfigError(f"{cfg.where(dotted)} must be true or false")
            elif keys[key] is int:
                checks.whole_number(cfg.where(dotted), value)
            else:
                checks.number(cfg.where(dotted), value)


def _postgres(cfg: Config, pg: dict[str, Any]) -> None:
    """``[postgres]``: checked for kind by ``_check_sections``, here for range."""
    cfg.pool_min = int(pg.get("pool_min", cfg.pool_min))
    cfg.pool_max = int(pg.get("pool_max", max(cfg.pool_max, cfg.pool_min)))
    cfg.pgbouncer = bool(pg.get("pgbouncer", cfg.pgbouncer))
    if cfg.pool_max > MAX_POOL:
        raise ConfigError(f"{cfg.where('postgres.pool_max')} must be at most {MAX_POOL}")
    if cfg.pool_max < cfg.pool_min:
        raise ConfigError(
            f"{cfg.where('postgres.pool_max')} must be at least pool_min ({cfg.pool_min})"
        )


def _providers(cfg: Config, providers: Any) -> None:
    """[providers.NAME] tables; settled's own keys are taken out before the provider
    type sees its table."""
    if not isinstance(providers, dict):
        raise ConfigError(f"{cfg.where('providers')} must be a table ([providers.NAME])")
    for name, conf in providers.items():
        if not isinstance(conf, dict):
            raise ConfigError(f"{cfg.where('providers.' + name)} must be a table")
        if "type" not in conf:
            raise ConfigError(
                f'{cfg.where("providers." + name + ".type")}: missing; set type = "http", '
                '"caldav", "sim" or an installed plug-in\'s name'
            )
        own = dict(conf)
        if "max_in_flight" in own:  # settled's own key: the provider type never sees it
            limit = own.pop("max_in_flight")
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ConfigError(
                    f"{cfg.where('providers.' + name + '.max_in_flight')} must be a whole "
                    f"number >= 1 (requests in flight at once), got {limit!r}"
                )
            cfg.max_in_flight[name] = limit
        if "outage_after" in own:  # settled's own too: how long before a provider is down
            after = own.pop("outage_after")
            if (
                isinstance(after, bool)
                or not isinstance(after, (int, float))
                or not (0 < after <= MAX_OUTAGE_AFTER)
            ):
                raise ConfigError(
                    f"{cfg.where('providers.' + name + '.outage_after')} must be a number of "
                    f"seconds > 0 and <= {MAX_OUTAGE_AFTER:g} (a day), got {after!r}"
                )
            cfg.outage_after[name] = float(after)
        if "callbacks" in own:  # settled's own too: checked here, whatever the provider's type
            from .callbacks.settings import parse

            cfg.callbacks[name] = parse(name, own.pop("callbacks"), source=cfg.source or "config")
        cfg.providers[name] = own


def _serve(cfg: Config, serve: Any) -> None:
    """[serve] and its [serve.tokens.NAME] tables: checked here, for every command, so
    a typo is found before anything runs; token secrets are read from the environment
    only by ``settled serve`` itself."""
    if not isinstance(serve, dict):
        raise ConfigError(f"{cfg.where('serve')} must be a table ([serve])")
    for key in serve:
        if key not in SERVE_KEYS:
            raise ConfigError(
                f"{cfg.where('serve.' + key)}: unknown key; expected one of {', '.join(SERVE_KEYS)}"
            )
    out = cfg.serve
    if "listen" in serve:
        where = cfg.where("serve.listen")
        if not isinstance(serve["listen"], str):
            raise ConfigError(f'{where} must be a string, e.g. "127.0.0.1:8780"')
        try:
            parse_listen(serve["listen"], where)
        except SettledError as exc:
            raise ConfigError(str(exc)) from None
        out.listen = serve["listen"]
    if "max_body" in serve:
        where = cfg.where("serve.max_body")
        value = checks.whole_number(where, serve["max_body"])
        if value > MAX_MAX_BODY:
            raise ConfigError(f"{where} must be at most {MAX_MAX_BODY} bytes (64 MiB), got {value}")
        out.max_body = value
    for key in ("head_timeout", "body_timeout"):
        if key in serve:
            setattr(out, key, checks.number(cfg.where(f"serve.{key}"), serve[key], positive=True))
    for key in ("max_connections", "bodies_per_client"):
        if key in serve:
            setattr(out, key, checks.whole_number(cfg.where(f"serve.{key}"), serve[key]))
    if "hosts" in serve:
        hosts = serve["hosts"]
        where = cfg.where("serve.hosts")
        if not isinstance(hosts, list) or not all(
            isinstance(h, str) and h and h.isascii() and h.isprintable() and " " not in h
            for h in hosts
        ):
            raise ConfigError(
                f'{where} must be a list of host names clients use, e.g. ["settled.example.com"]'
            )
        out.hosts = tuple(h.lower() for h in hosts)
    tokens = serve.get("tokens", {})
    if not isinstance(tokens, dict):
        raise ConfigError(f"{cfg.where('serve.tokens')} must be a table ([serve.tokens.NAME])")
    for name, table in tokens.items():
        out.tokens[name] = _token(cfg, name, table)
    if "ui" in serve:
        _ui(cfg, serve["ui"])


def _ui(cfg: Config, ui: Any) -> None:
    """[serve.ui]: the console's sessions and its trusted proxies (docs/console.md)."""
    import ipaddress

    if not isinstance(ui, dict):
        raise ConfigError(f"{cfg.where('serve.ui')} must be a table ([serve.ui])")
    for key in ui:
        if key not in UI_KEYS:
            raise ConfigError(
                f"{cfg.where('serve.ui.' + key)}: unknown key; expected one of {', '.join(UI_KEYS)}"
            )
    out = cfg.serve.ui
    if "session_secret" in ui:
        secret = ui["session_secret"]
        if not isinstance(secret, str) or not _ENV.fullmatch(secret):
            raise ConfigError(
                f"{cfg.where('serve.ui.session_secret')}: must name an environment variable, "
                'e.g. session_secret = "${SETTLED_UI_SECRET}" (secrets are read at run time, '
                "never written in the config)"
            )
        out.session_secret = secret
    if "session_ttl" in ui:
        where = cfg.where("serve.ui.session_ttl")
        ttl = checks.whole_number(where, ui["session_ttl"])
        if not 60 <= ttl <= MAX_SESSION_TTL:
            raise ConfigError(f"{where} must be from 60 to {MAX_SESSION_TTL} seconds, got {ttl}")
        out.session_ttl = ttl
    if "trusted_proxies" in ui:
        where = cfg.where("serve.ui.trusted_proxies")
        proxies = ui["trusted_proxies"]
        if not isinstance(proxies, list) or not all(isinstance(p, str) for p in proxies):
            raise ConfigError(f'{where} must be a list of addresses, e.g. ["127.0.0.1"]')
        for p in proxies:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise ConfigError(
                    f"{where}: {p!r} is not an IP address or network (names are not trusted: "
                    "they can be made to point anywhere)"
                ) from None
        out.trusted_proxies = tuple(proxies)
    if "user_header" in ui:
        where = cfg.where("serve.ui.user_header")
        header = ui["user_header"]
        if not isinstance(header, str) or not re.fullmatch(r"[A-Za-z0-9-]{1,64}", header):
            raise ConfigError(f'{where} must be a header name, e.g. "X-Forwarded-User"')
        if header.lower() in ("host", "origin", "cookie", "authorization", "content-length"):
            raise ConfigError(f"{where}: {header} cannot name a person")
        out.user_header = header
    if "proxy_roles" in ui:
        roles = ui["proxy_roles"]
        if (
            not isinstance(roles, list)
            or not roles
            or not all(isinstance(r, str) and r in ROLES for r in roles)
        ):
            raise ConfigError(
                f"{cfg.where('serve.ui.proxy_roles')}: must be a non-empty list of "
                f'{", ".join(ROLES)}, e.g. proxy_roles = ["read"]'
            )
        out.proxy_roles = tuple(roles)


def _token(cfg: Config, name: str, table: Any) -> ServeToken:
    key = f"serve.tokens.{name}"
    if not _TOKEN_NAME.fullmatch(name):
        raise ConfigError(
            f"{cfg.where(key)}: a token name is 1-64 letters, digits, '_', '.' or '-' "
            "(it names the actor api:NAME in the ledger)"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{cfg.where(key)} must be a table with secret and roles")
    for k in table:
        if k not in TOKEN_KEYS:
            raise ConfigError(
                f"{cfg.where(key + '.' + k)}: unknown key; expected one of {', '.join(TOKEN_KEYS)}"
            )
    secret = table.get("secret")
    if not isinstance(secret, str) or not _ENV.fullmatch(secret):
        raise ConfigError(
            f"{cfg.where(key + '.secret')}: must name an environment variable, e.g. secret = "
            f'"${{SETTLED_TOKEN_{name.upper().replace("-", "_").replace(".", "_")}}}" '
            "(secrets are read at run time, never written in the config)"
        )
    roles = table.get("roles")
    if (
        not isinstance(roles, list)
        or not roles
        or not all(isinstance(r, str) and r in ROLES for r in roles)
    ):
        raise ConfigError(
            f"{cfg.where(key + '.roles')}: must be a non-empty list of {', '.join(ROLES)}, "
            'e.g. roles = ["read"]'
        )
    return ServeToken(name, secret, tuple(dict.fromkeys(roles)))
