"""Provider registration: providers are registered by name, each with its
operations and their declarations. Built-in types are ``sim``, ``http`` and
``caldav``; third-party types plug in through the ``settled.providers`` entry-point
group (name = the ``type`` used in settled.toml, value = a factory
``create(name, conf, client) -> Provider``).

Providers are built lazily, so commands that only read the ledger never import httpx.

Two declarations of an operation belong to settled rather than to its provider type,
so every type takes them in its ``[providers.NAME.operations.OP]`` table (for ``sim``
and ``caldav``, whose operations are fixed, that table holds only these):
``action_key`` (rule 21: the action id made from the params, ``settled.intent``) and
``approval`` (``"client"`` or ``"person"``: who may confirm each action; declaring it
means each action needs a confirmation). The registry takes them out before the
provider type reads its table and lays them over the operations it declares
(``Declared``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Self

from .. import intent
from ..errors import ConfigError, UnknownProvider

if TYPE_CHECKING:
    import httpx

    from .base import Observation, OperationSpec, Provider, QueryTarget, Request, WireResult

Factory = Callable[[str, Mapping[str, Any], "httpx.Client"], "Provider"]

BUILTIN: dict[str, str] = {
    "sim": "settled.providers.sim:create",
    "http": "settled.providers.http:create",
    "caldav": "settled.providers.caldav:create",
}
ENTRY_POINT_GROUP = "settled.providers"
# Per-operation keys every provider type takes (the registry reads them, not the type).
SETTLED_KEYS = ("action_key", "approval")
APPROVALS = ("client", "person")
_KEY_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*: ")


def _load_ref(ref: str) -> Factory:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def find_factory(type_name: str, where: str = "config") -> Factory:
    if type_name in BUILTIN:
        return _load_ref(BUILTIN[type_name])
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == type_name:
            return ep.load()  # type: ignore[no-any-return]
    raise ConfigError(
        f"{where}: unknown provider type {type_name!r}; use one of "
        f"{', '.join(sorted(BUILTIN))} or install a plug-in that registers it "
        f"under the {ENTRY_POINT_GROUP!r} entry-point group"
    )


def make_client() -> httpx.Client:
    """One client per process; TLS verification on; redirects not followed (a
    redirect is not an answer about the effect); every try bounded by one total
    deadline (``_wire.deadline_transport``).

    Loading the CA bundle is most of what creating a client costs (20-40 ms), and a
    command that only talks plain ``http://`` (the sim, a local service) never needs
    it: the transport loads it on the first ``https://`` request, with verification
    on as always."""
    import httpx

    return httpx.Client(follow_redirects=False, trust_env=False, transport=_transport())


def _transport() -> httpx.BaseTransport:
    import ssl
    import threading

    import httpx

    from ._wire import deadline_transport

    class LazyTLSTransport(httpx.BaseTransport):
        """``https://`` through a default (verifying) transport made on first use;
        ``http://`` through one whose TLS context holds no CA and is never used."""

        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._tls: httpx.HTTPTransport | None = None
            self._plain: httpx.HTTPTransport | None = None

        def for_scheme(self, scheme: str) -> httpx.HTTPTransport:
            with self._lock:
                if scheme == "https":
                    if self._tls is None:
                        self._tls = deadline_transport(True)
                    return self._tls
                if self._plain is None:
                    # Verifying and empty: were it ever used for TLS, it would refuse.
                    self._plain = deadline_transport(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
                return self._plain

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return self.for_scheme(request.url.scheme).handle_request(request)

        def close(self) -> None:
            with self._lock:
                for t in (self._tls, self._plain):
                    if t is not None:
                        t.close()
                self._tls = self._plain = None

    return LazyTLSTransport()


def split_declarations(
    conf: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``conf`` without the keys settled reads itself (``SETTLED_KEYS``), and those keys
    by operation. An operation table left empty is dropped, and so is an ``operations``
    table left empty (``sim`` and ``caldav`` take none of their own)."""
    ops = conf.get("operations")
    if not isinstance(ops, Mapping):
        return dict(conf), {}
    own: dict[str, dict[str, Any]] = {}
    kept: dict[str, Any] = {}
    for op, table in ops.items():
        if not isinstance(table, Mapping):
            kept[op] = table  # the provider type says what is wrong with it
            continue
        mine = {k: v for k, v in table.items() if k in SETTLED_KEYS}
        if mine:
            own[str(op)] = mine
        rest = {k: v for k, v in table.items() if k not in SETTLED_KEYS}
        if rest or not mine:
            kept[op] = rest
    out = {k: v for k, v in conf.items() if k != "operations"}
    if kept:
        out["operations"] = kept
    return out, own


def declared(provider: Provider, own: Mapping[str, Mapping[str, Any]]) -> Provider:
    """``provider`` with ``own`` laid over its operations, and every operation's
    ``action_key`` and ``approval`` checked (a plug-in may declare them in its specs)."""
    ops = dict(provider.operations())
    for op in own:
        if op not in ops:
            raise ConfigError(
                f"operations.{op}: {provider.name} has no operation {op!r} (it has: "
                f"{', '.join(sorted(ops)) or 'none'})"
            )
    changed = False
    for op, spec in ops.items():
        table = own.get(op, {})
        approval = table.get("approval", spec.approval)
        if approval not in APPROVALS:
            raise ConfigError(
                f'operations.{op}.approval: {approval!r} is not allowed; use "client" (the '
                'agent\'s client may ask the person) or "person" (only `settled confirm`, the '
                "API or the console)"
            )
        key = table.get("action_key", spec.action_key)
        if key is not None:
            intent.parse(f"operations.{op}.action_key", key, spec.params_schema)
        if table:
            confirm = spec.needs_confirmation or "approval" in table
            ops[op] = replace(spec, action_key=key, approval=approval, needs_confirmation=confirm)
            changed = True
    return Declared(provider, ops) if changed else provider


class Declared:
    """A provider whose operations carry what settled.toml declares for every provider
    type (``SETTLED_KEYS``); everything else is the provider's own."""

    def __init__(self, inner: Provider, ops: Mapping[str, OperationSpec]) -> None:
        self._inner = inner
        self._ops = dict(ops)
        self.name = inner.name

    def operations(self) -> Mapping[str, OperationSpec]:
        return self._ops

    def execute(self, request: Request) -> WireResult:
        return self._inner.execute(request)

    def query(self, target: QueryTarget) -> Observation:
        return self._inner.query(target)

    def snapshot(self, operation: str, params: Any) -> Any:
        return self._inner.snapshot(operation, params)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, attr: str) -> Any:  # a type's extras: check_params, render
        return getattr(self._inner, attr)


class Registry:
    """Name → provider. Providers come from config sections or from ``add``."""

    def __init__(
        self,
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        source: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self._configs = dict(configs or {})
        self._source = source or "config"
        self._providers: dict[str, Provider] = {}
        self._client = client
        self._own_client = client is None

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = make_client()
        return self._client

    def add(self, provider: Provider) -> None:
        self._providers[provider.name] = provider

    def names(self) -> list[str]:
        return sorted(set(self._configs) | set(self._providers))

    def provider(self, name: str) -> Provider:
        if name in self._providers:
            return self._providers[name]
        conf = self._configs.get(name)
        if conf is None:
            known = ", ".join(self.names()) or "none configured"
            raise UnknownProvider(
                f"unknown provider {name!r} (configured: {known}); add [providers.{name}] "
                "to settled.toml"
            )
        where = f"{self._source}: providers.{name}"
        factory = find_factory(str(conf.get("type")), where + ".type")
        rest, own = split_declarations({k: v for k, v in conf.items() if k != "type"})
        try:
            provider = declared(factory(name, rest, self.client), own)
        except ConfigError as exc:
            placed = [self._placed(where, msg) for msg in exc.problems]
            raise ConfigError(self._placed(where, str(exc)), placed) from None
        self._providers[name] = provider
        return provider

    def _placed(self, where: str, msg: str) -> str:
        """A provider's message with the file and ``providers.NAME`` in front of it."""
        if msg.startswith(self._source):
            return msg
        # "operations.send.tier: …" continues the key path; anything else is a sentence.
        return f"{where}.{msg}" if _KEY_PATH.match(msg) else f"{where}: {msg}"

    def problems(self) -> list[str]:
        """Every configuration problem of every provider, one line each (``settled
        providers check``): what building them would refuse, all of it, not only the
        first. Builds the providers that have none."""
        out: list[str] = []
        for name in self.names():
            try:
                self.provider(name)
            except ConfigError as exc:
                out += exc.problems
        return out

    def operation(self, provider: str, operation: str) -> OperationSpec:
        ops = self.provider(provider).operations()
        spec = ops.get(operation)
        if spec is None:
            raise UnknownProvider(
                f"provider {provider!r} has no operation {operation!r} "
                f"(it has: {', '.join(sorted(ops)) or 'none'})"
            )
        return spec

    def check_params(self, provider: str, operation: str, params: Any) -> None:
        """Refuse, before anything is recorded, params this operation could never
        send (``InvalidInput``); providers that check nothing accept everything."""
        check = getattr(self.provider(provider), "check_params", None)
        if check is not None:
            check(operation, params)

    def load_all(self) -> None:
        """Build every configured provider now, so config mistakes surface at once."""
        for name in self.names():
            self.provider(name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for p in self._providers.values():
            p.close()
        if self._own_client and self._client is not None:
            self._client.close()
            self._client = None
