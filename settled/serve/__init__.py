"""``settled serve``: one ASGI process for apps, agents and monitors (docs/serve.md).

    /api/v1/...          JSON for apps (settled.serve.api; described by settled.serve.api.openapi)
    /mcp                 the MCP server of ``settled mcp``, streamable HTTP (settled.agents)
    /metrics, /healthz   Prometheus metrics and a health check (settled.metrics)
    /hooks/{provider}    provider callbacks: mounted in ``settled.serve.asgi.routes``

It is a shell, like the CLI: it parses, calls the core and renders, and keeps no state
of its own beyond a pool of ledger sessions. Nothing heavy is imported here: the
config loader reads ``settled.address`` for every command.
"""
