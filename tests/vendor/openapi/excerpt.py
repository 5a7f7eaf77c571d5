"""Cut the operations the cookbook sends out of a provider's full OpenAPI 3
description, with everything they refer to, and nothing else; responses are replaced
by one ``default`` (the cookbook tests validate requests only).

    python tests/vendor/openapi/excerpt.py FULL.json OUT.json "post /v1/refunds" ...

A Swagger 2.0 description (Slack's) is converted to OpenAPI 3.0 on the way
(``from_swagger2``): ``formData`` parameters become the request body's properties, for
each type the operation ``consumes``; a ``token`` header parameter, which the API takes
as ``Authorization: Bearer``, becomes a bearer security scheme.

Standard library only; how each excerpt here was made is in README.md beside it."""

from __future__ import annotations

import json
import sys
from typing import Any


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        out = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for v in node.values():
            out |= refs(v)
        return out
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def resolve(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def excerpt(doc: dict[str, Any], wanted: list[tuple[str, str]]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for method, path in wanted:
        item = doc["paths"][path]
        op = {k: v for k, v in item[method].items() if k != "responses"}
        op["responses"] = {"default": {"description": "not part of this excerpt"}}
        kept = paths.setdefault(path, {k: v for k, v in item.items() if k == "parameters"})
        kept[method] = op
    out: dict[str, Any] = {
        "openapi": doc["openapi"],
        "info": {k: doc["info"][k] for k in ("title", "version", "license") if k in doc["info"]},
        "servers": doc.get("servers", []),
        "paths": paths,
    }
    if "security" in doc:
        out["security"] = doc["security"]
    todo = refs(paths) | refs(out.get("security", []))
    for op in (o for p in paths.values() for o in p.values() if isinstance(o, dict)):
        for req in op.get("security", doc.get("security", [])):
            todo |= {f"#/components/securitySchemes/{name}" for name in req}
    done: set[str] = set()
    components: dict[str, dict[str, Any]] = {}
    while todo:
        ref = todo.pop()
        if ref in done or not ref.startswith("#/components/"):
            continue
        done.add(ref)
        _, _, kind, name = ref.split("/", 3)
        node = resolve(doc, ref)
        components.setdefault(kind, {})[name] = node
        todo |= refs(node) - done
    if components:
        out["components"] = {k: dict(sorted(v.items())) for k, v in sorted(components.items())}
    return out


def from_swagger2(doc: dict[str, Any]) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if not isinstance(op, dict) or method == "parameters":
                continue
            params, form, required = [], {}, []
            bearer = False
            for p in op.get("parameters", []):
                if p["in"] == "formData":
                    form[p["name"]] = {k: p[k] for k in ("type", "description") if k in p}
                    if p.get("required"):
                        required.append(p["name"])
                elif p["in"] == "header" and p["name"] == "token":
                    bearer = True
                else:
                    schema = {k: p[k] for k in ("type", "items", "enum") if k in p}
                    kept = {k: p[k] for k in ("name", "in", "description", "required") if k in p}
                    params.append({**kept, "schema": schema})
            new: dict[str, Any] = {k: op[k] for k in ("operationId", "description") if k in op}
            new["parameters"] = params
            if form:
                schema: dict[str, Any] = {"type": "object", "properties": form}
                if required:
                    schema["required"] = required
                types = op.get("consumes", ["application/x-www-form-urlencoded"])
                new["requestBody"] = {
                    "required": True,
                    "content": {t: {"schema": schema} for t in types},
                }
            if bearer:
                new["security"] = [{"bearer": []}]
            new["responses"] = op.get("responses", {})
            paths.setdefault(path, {})[method] = new
    return {
        "openapi": "3.0.3",
        "info": doc["info"],
        "servers": [{"url": f"https://{doc['host']}{doc.get('basePath', '')}"}],
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def main(argv: list[str]) -> None:
    full, target, *ops = argv
    with open(full, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("swagger") == "2.0":
        doc = from_swagger2(doc)
    wanted = [(m.lower(), p) for m, p in (op.split(" ", 1) for op in ops)]
    with open(target, "w", encoding="utf-8") as f:
        json.dump(excerpt(doc, wanted), f, indent=1, sort_keys=False)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
