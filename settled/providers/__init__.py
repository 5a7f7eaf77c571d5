"""Provider registration: providers are registered by name, each with its
operations and their declarations. Built-in types are ``sim``, ``http`` and
``caldav``; third-party types plug in through the ``settled.providers`` entry-point
group (name = the ``type`` used in settled.toml, value = a factory
``create(name, conf, client) -> Provider``).

Providers are built lazily, so commands that only read the ledger never import httpx.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from ..errors import ConfigError, UnknownProvider

if TYPE_CHECKING:
    import httpx

    from .base import OperationSpec, Provider

Factory = Callable[[str, Mapping[str, Any], "httpx.Client"], "Provider"]

BUILTIN: dict[str, str] = {
    "sim": "settled.providers.sim:create",
    "http": "settled.providers.http:create",
    "caldav": "settled.providers.caldav:create",
}
ENTRY_POINT_GROUP = "settled.providers"
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
        rest = {k: v for k, v in conf.items() if k != "type"}
        try:
            provider = factory(name, rest, self.client)
        except ConfigError as exc:
            msg = str(exc)
            if not msg.startswith(self._source):
                # "operations.send.tier: …" continues the key path; anything else is a sentence.
                msg = f"{where}.{msg}" if _KEY_PATH.match(msg) else f"{where}: {msg}"
            raise ConfigError(msg) from None
        self._providers[name] = provider
        return provider

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
