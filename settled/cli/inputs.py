"""What a command reads from a person before it opens a ledger: ``--params`` (JSON, @FILE
or - for stdin, at most 1 MiB) and action ids."""

from __future__ import annotations

import json
import sys
from typing import Any

MAX_PARAMS = 1024 * 1024  # bytes of --params: far above any API body, far below memory trouble


def _read_capped(stream: Any, source: str) -> str:
    from ..errors import InvalidInput

    raw = stream.read(MAX_PARAMS + 1)
    if isinstance(raw, str):  # a text stream (stdin replaced in process): count bytes anyway
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_PARAMS:
        raise InvalidInput(
            f"{source} is larger than {MAX_PARAMS // 1024} KiB; settled reads at most that much "
            "params (put large content where the provider can fetch it)"
        )
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_params(raw: str | None) -> Any:
    from ..errors import InvalidInput

    if raw is None:
        return {}
    source = "--params"
    if raw == "-":
        source = "--params - (stdin)"
        text_ = _read_capped(getattr(sys.stdin, "buffer", sys.stdin), source)
    elif raw.startswith("@"):
        path = raw[1:]
        source = f"--params @{path}"
        try:
            with open(path, "rb") as fh:
                text_ = _read_capped(fh, source)
        except FileNotFoundError:
            raise InvalidInput(f"--params @{path}: file not found") from None
        except OSError as exc:
            raise InvalidInput(f"--params @{path}: cannot read: {exc.strerror or exc}") from None
    else:
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_PARAMS:
            raise InvalidInput(f"--params is larger than {MAX_PARAMS // 1024} KiB")
        text_ = raw
    try:
        value = json.loads(text_)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{source} is nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{source} must be a JSON object, got {type(value).__name__}")
    try:  # Python's json accepts NaN, Infinity, 1e999 and lone surrogates; JSON does not
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except ValueError as exc:
        raise InvalidInput(f"{source} is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidInput(f"{source} is nested too deeply") from None
    return value


def check_id(action_id: str) -> str:
    from ..model import check_action_id

    return check_action_id(action_id)
