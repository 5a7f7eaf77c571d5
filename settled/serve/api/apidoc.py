"""docs/api.md, rendered from the OpenAPI description (``settled.serve.api.DOCUMENT``).

    python -m settled.serve.api.apidoc            print it
    python -m settled.serve.api.apidoc --write    write docs/api.md (the suite fails when it drifts)

The page is generated, never edited by hand: the description is the one source."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import DOCUMENT

HEADER = (
    "<!-- Generated from the OpenAPI description by `python -m settled.serve.api.apidoc --write`; "
    "do not edit. -->"
)


def _ref(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else ""


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = _ref(schema)
        return f"[{name}](#{name.lower()})"
    kind = schema.get("type", "any")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if text == "array" and "items" in schema:
        text = f"array of {_type(schema['items'])}"
    if "enum" in schema:
        text += ": " + ", ".join(f"`{v}`" if v is not None else "`null`" for v in schema["enum"])
    return text


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _properties(schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        extra = []
        for key in ("minLength", "maxLength", "minimum", "maximum"):
            if key in prop:
                extra.append(f"{key} {prop[key]}")
        if "default" in prop:
            extra.append(f"default `{json.dumps(prop['default'])}`")
        meaning = prop.get("description", "")
        if "$ref" in prop and not meaning:
            meaning = schemas.get(_ref(prop), {}).get("description", "")
        if extra:
            meaning = f"{meaning} ({'; '.join(extra)})".strip()
        rows.append(
            f"| `{name}` | {_type(prop)} | {'yes' if name in required else ''} | {_cell(meaning)} |"
        )
    return rows


def _operation(method: str, path: str, op: dict[str, Any], prefix: str) -> list[str]:
    out = [
        f"### `{method.upper()} {prefix}{path}`",
        "",
        f"**{op['summary']}.** {op['description']}",
        "",
    ]
    roles = op.get("x-settled-roles")
    out.append(
        f"Token role: {' or '.join(f'`{r}`' for r in roles)}." if roles else "No token needed."
    )
    out.append("")
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
        for p in params:
            out.append(
                f"| `{p['name']}` | {p['in']} | {_type(p['schema'])} | {_cell(p.get('description', ''))} |"
            )
        out.append("")
    body = op.get("requestBody")
    if body:
        schema = body["content"]["application/json"]["schema"]
        need = "required" if body.get("required") else "optional (may be empty)"
        out += [f"Body ({need}): {_type(schema)}.", ""]
    out += ["| status | meaning | body |", "|---|---|---|"]
    for code, resp in op["responses"].items():
        content = resp.get("content", {})
        kind = next(iter(content), "")
        schema = content[kind]["schema"] if kind else {}
        shown = f"{_type(schema)} ({kind})" if schema else (kind or "")
        out.append(f"| {code} | {_cell(resp['description'])} | {shown} |")
    out.append("")
    return out


def render(doc: dict[str, Any]) -> str:
    """The whole page for ``doc``."""
    info = doc["info"]
    prefix = doc["servers"][0]["url"]
    schemas = doc["components"]["schemas"]
    out = [
        HEADER,
        "",
        f"# {info['title']} (v{info['version']})",
        "",
        info["description"],
        "",
        f"The description itself: `GET {prefix}/openapi.json` (OpenAPI {doc['openapi']}). How to run "
        "the service, tokens, the reverse proxy: [serve.md](serve.md).",
        "",
        "## Routes",
        "",
        "| method | path | what | role |",
        "|---|---|---|---|",
    ]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            roles = " or ".join(op.get("x-settled-roles", [])) or "none"
            anchor = f"{method} {prefix}{path}".lower()
            anchor = "".join(c for c in anchor if c.isalnum() or c in " -_").replace(" ", "-")
            out.append(
                f"| {method.upper()} | [`{prefix}{path}`](#{anchor}) | {_cell(op['summary'])} | {roles} |"
            )
    out += ["", "## Operations", ""]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out += _operation(method, path, op, prefix)
    out += ["## Schemas", ""]
    for name, schema in schemas.items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        base = [_ref(s) for s in schema.get("allOf", []) if "$ref" in s]
        if base:
            out += [f"Every field of [{base[0]}](#{base[0].lower()}), and:", ""]
        if "properties" in schema:
            out += [*_properties(schema, schemas), ""]
        else:
            out += [f"Type: {_type(schema)}.", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render(DOCUMENT)
    if args == ["--write"]:
        target = Path(__file__).resolve().parents[3] / "docs" / "api.md"
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target.name}", file=sys.stderr)
    elif args:
        print("usage: python -m settled.serve.api.apidoc [--write]", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
