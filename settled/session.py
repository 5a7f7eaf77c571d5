"""One place that turns the environment into working parts: the config file, the
ledger, the provider registry, and a dispatcher and reconciler configured from them.

The CLI, the MCP server and the Python tool wrapper all start here, so that a
command, an agent's tool call and a script see the same ledger and the same
declarations::

    with Session() as s:                       # SETTLED_DB / SETTLED_CONFIG, like the CLI
        report = s.dispatcher("script").submit("mail", "send", {"to": "a@example.com"})

Everything is opened lazily, on first use, and closed once by ``close``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Self

from .crashpoints import Probe, no_probe
from .errors import LedgerMoved

if TYPE_CHECKING:
    from .callbacks.hooks import Hooks
    from .config import Config
    from .dispatch import Dispatcher
    from .providers import Registry
    from .reconcile import Reconciler
    from .storage import Ledger, PostgresSettings


class Session:
    """The config, ledger and registry one process works with.

    ``db`` and ``config_path`` override ``SETTLED_DB`` and ``SETTLED_CONFIG``; without
    either, the ledger is ``[ledger] url`` (PostgreSQL) or ``[ledger] path`` from the
    config, else the per-user default (``$XDG_DATA_HOME/settled/settled.db``).

    ``migrate`` (the library's default) lets opening apply the schema steps an older
    ledger lacks; ``migrate=False`` (the CLI, the service, the MCP server) refuses an
    older ledger with "run `settled migrate`" (rule 18: migrations are explicit)."""

    def __init__(
        self, *, db: str | None = None, config_path: str | None = None, migrate: bool = True
    ) -> None:
        self.db = db if db is not None else (os.environ.get("SETTLED_DB") or None)
        self.migrate = migrate
        self.config_path = config_path
        self._config: Config | None = None
        self._ledger: Ledger | None = None
        self._registry: Registry | None = None
        self._hooks: Hooks | None = None
        self._lent = False  # the ledger is another session's, shared: not closed here
        self.probe: Probe = no_probe  # crash points: armed only by ``settled.testing``

    def config(self) -> Config:
        if self._config is None:
            from . import config

            self._config = config.load(self.config_path or config.default_config_path())
        return self._config

    def ledger_location(self) -> str:
        """Where the ledger is, whether or not it exists yet."""
        from .config import default_db_path

        cfg = self.config()
        return self.db or cfg.ledger_url or cfg.ledger_path or default_db_path()

    def ledger(self, *, create: bool = True, read_only: bool = False) -> Ledger:
        """The ledger, opened once. ``create=False``: a missing ledger is an error
        naming its path, never a new empty file. ``read_only`` is for commands that only
        read: never created, migrated or written; an older ledger is read as it is when
        it holds every column settled reads (``Ledger.open``)."""
        if self._ledger is None:
            from .storage import Ledger

            cfg = self.config()
            path = self.ledger_location()
            if create and not self.db and not cfg.ledger_path and not cfg.ledger_url:
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            ledger = Ledger.open(
                path,
                busy_timeout=cfg.busy_timeout,
                create=create,
                migrate=self.migrate,
                read_only=read_only,
                probe=self.probe,
                postgres=self.postgres_settings(),
            )
            self._ledger = self._not_moved(ledger, write=not read_only)
        return self._ledger

    def postgres_settings(self) -> PostgresSettings:
        """``[postgres]`` of settled.toml, as a PostgreSQL ledger takes it."""
        from .storage import PostgresSettings

        cfg = self.config()
        return PostgresSettings(
            pool_min=cfg.pool_min, pool_max=cfg.pool_max, pgbouncer=cfg.pgbouncer
        )

    def _not_moved(self, ledger: Ledger, *, write: bool) -> Ledger:
        """A ledger ``migrate-ledger`` moved is refused to a writer (one line naming the
        new one); a reader may read it, told once that it moved (``moved_notice``)."""
        moved = ledger.moved()
        if moved is None:
            return ledger
        from .storage.ledger import moved_message

        if write:
            ledger.close()
            raise LedgerMoved(moved_message(ledger.location, *moved))
        self.moved_notice(
            f"ledger {ledger.location} was moved to {moved[0]} at {moved[1]} "
            "(migrate-ledger); reading it as it was then"
        )
        return ledger

    def moved_notice(self, line: str) -> None:
        """Told when a reader opens a moved ledger; the CLI prints it on stderr."""

    def registry(self) -> Registry:
        if self._registry is None:
            from .providers import Registry

            cfg = self.config()
            self._registry = Registry(cfg.providers, source=cfg.source)
        return self._registry

    def dispatcher(self, actor: str) -> Dispatcher:
        """The dispatcher every sending path uses, configured from settled.toml."""
        from .dispatch import Dispatcher, DispatchSettings

        cfg = self.config()
        settings = DispatchSettings(
            lease_grace=cfg.lease_grace,
            backoff=cfg.backoff,
            group=cfg.dispatch_group,
            callbacks=frozenset(cfg.callbacks),
        )
        return Dispatcher(
            self.ledger(), self.registry(), settings=settings, actor=actor, probe=self.probe
        )

    def reconciler(self, concurrency: int | None = None, **kw: Any) -> Reconciler:
        """The reconciler every verifying path uses, configured from settled.toml.
        ``concurrency`` (``--concurrency``) overrides ``[reconcile] concurrency``."""
        from .reconcile import Reconciler

        cfg = self.config()
        kw.setdefault("batch", cfg.reconcile_batch)
        kw.setdefault("lease", cfg.reconcile_lease)
        kw.setdefault("probe", self.probe)
        threads, limits = self.query_concurrency(concurrency)
        kw.setdefault("concurrency", threads)
        kw.setdefault("limits", limits)
        return Reconciler(self.ledger(), self.registry(), **kw)

    def hooks(self, *, max_body: int | None = None) -> Hooks:
        """The callback core for this config and ledger (``Hooks.handle``), made once;
        every callback secret is read from the environment when it is made."""
        from .callbacks.hooks import MAX_BODY, Hooks

        if self._hooks is None:
            self._hooks = Hooks(
                self.ledger(),
                self.config().callbacks,
                max_body=MAX_BODY if max_body is None else max_body,
            )
        return self._hooks

    def query_concurrency(self, explicit: int | None = None) -> tuple[int, dict[str, int]]:
        """Threads for a pass's queries and each configured provider's limit."""
        cfg = self.config()
        chosen = explicit if explicit is not None else cfg.reconcile_concurrency
        return cfg.concurrency(chosen, sorted(cfg.providers))

    def send_concurrency(self, provider: str, explicit: int | None = None) -> int:
        """Requests in flight at once for a bulk dispatch to ``provider``."""
        return self.config().concurrency(explicit, [provider])[1][provider]

    def share(self, ledger: Ledger) -> None:
        """Use ``ledger`` (a thread-safe one another session opened, and closes) as this
        session's: sessions of one process then share its connections
        (``PostgresSettings.pool_max`` for the process, not for each session)."""
        assert ledger.thread_safe and self._ledger is None
        self._ledger, self._lent = ledger, True

    def hand_over(self) -> Ledger:
        """This session's open ledger, from now on closed by whoever took it: the
        session goes on using it (``share``)."""
        assert self._ledger is not None
        self._lent = True
        return self._ledger

    def close(self) -> None:
        if self._registry is not None:
            self._registry.close()
            self._registry = None
        if self._ledger is not None:
            if not self._lent:
                self._ledger.close()
            self._ledger = None
            self._lent = False
        self._hooks = None
        self._config = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Session"]
