"""``settled mcp``'s stdio transport: every request gets an answer, and the server
stays up for the next one.

The SDK's stdio transport hands a line it cannot parse to the server as an exception,
which the server only logs: a request nested deeper than the parser goes, holding a
lone surrogate (``"\\ud800"``) or bytes that are not UTF-8 got no answer at all, and
its client waited forever. Here each line is read as bytes and checked before the
session sees it; a line that is not a message the session can take is answered at
once with a JSON-RPC error that carries the request's own id (found by a scan that
needs no parser, so any depth goes), as the streamable HTTP transport answers 400:

    -32700  parse error      not UTF-8, not JSON (a lone surrogate is not Unicode text)
    -32600  invalid request  JSON, but not a JSON-RPC message; nested too deeply; too large

A notification (no id) that cannot be read is only logged: JSON-RPC answers none. An
answer the server cannot encode is replaced by an internal error for the same id.

Like the SDK's transport, it claims the process's standard streams while serving:
fd 0 reads the null device and fd 1 writes to stderr, so that nothing a handler or a
library prints can tear a frame; both are restored at the end.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import IO, Any

import anyio
import anyio.to_thread
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

log = logging.getLogger("settled.mcp")

MAX_LINE = 4 * 1024 * 1024  # bytes in one message: what the HTTP transport takes too
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
Outgoing = SessionMessage | dict[str, Any]


def scan(text: str) -> tuple[bool, Any, bool, bool]:
    """``(found, id, has_id, has_method)`` of a JSON-RPC message's text, without
    parsing it: the top-level ``id`` when it is one (a string, a whole number or
    null), whether an ``id`` member is there at all, and whether a ``method`` is.
    Linear in the text, whatever its depth; never raises."""
    found, rid, method, has_id = False, None, False, False
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            m = _STRING.match(text, i)
            if m is None:
                break
            i = m.end()
            if depth != 1:
                continue
            j = _skip(text, i)
            if j >= n or text[j] != ":":
                continue
            key = _loads(m.group(0))
            i = _skip(text, j + 1)
            if key == "method":
                method = True
            elif key == "id" and not has_id:
                has_id = True
                found, rid = _scalar(text, i)
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        i += 1
    return found, rid, has_id, method


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _loads(token: str) -> Any:
    try:
        return json.loads(token)
    except ValueError:
        return None


def _scalar(text: str, i: int) -> tuple[bool, Any]:
    """A JSON-RPC id at ``i``: a string, a whole number or null; else not found."""
    if text.startswith('"', i):
        m = _STRING.match(text, i)
        value = _loads(m.group(0)) if m else None
        if isinstance(value, str) and not _surrogate(value):
            return True, value
        return False, None
    if text.startswith("null", i):
        return True, None
    m = _NUMBER.match(text, i)
    if m is not None and re.fullmatch(r"-?\d+", m.group(0)):
        return True, int(m.group(0))
    return False, None


def _surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def problem(raw: bytes) -> tuple[str | None, str]:
    """The line as text, or why it is not UTF-8 text (a parse error)."""
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return None, (
            f"Parse error: the message is not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
            f"offset {exc.start})"
        )


def _why(exc: ValidationError, text: str) -> tuple[int, str]:
    """The error code and one-line message for a line the session cannot take."""
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0] if errors else {"type": "", "msg": str(exc)}
    msg = " ".join(str(first.get("msg", "")).split())[:300]
    if first.get("type") != "json_invalid":
        return types.INVALID_REQUEST, f"Invalid request: not a JSON-RPC 2.0 message ({msg})"
    deep = (
        types.INVALID_REQUEST,
        "Invalid request: nested too deeply for this server (at most about 200 levels "
        "in all); send flatter params",
    )
    try:  # Python's reader goes deeper, and takes lone surrogates: it tells why
        value = json.loads(text)
    except RecursionError:
        return deep
    except ValueError:
        return types.PARSE_ERROR, f"Parse error: not JSON ({msg})"
    if any(_surrogate(t) for t in _texts(value)):
        return types.PARSE_ERROR, (
            "Parse error: the message holds a lone surrogate (such as \\ud800), which "
            "is not Unicode text"
        )
    return deep


def _texts(value: Any) -> list[str]:
    """Every string (keys too) in a JSON value, without recursion."""
    out: list[str] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            out += list(v)
            todo += list(v.values())
        elif isinstance(v, list):
            todo += v
    return out


def error_answer(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class _Lines:
    """Lines of a binary stream, at most ``MAX_LINE`` bytes each; a longer one is
    skipped to its end and reported by its first bytes."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def next(self) -> tuple[bytes, bool]:
        """``(line, too_long)``; ``b""`` at the end of the stream."""
        line = self.stream.readline(MAX_LINE + 1)
        if len(line) <= MAX_LINE or line.endswith(b"\n"):
            return line, False
        rest = line
        while rest and not rest.endswith(b"\n"):
            rest = self.stream.readline(MAX_LINE)
        return line[:4096], True


async def _read(
    lines: _Lines,
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
    answers: MemoryObjectSendStream[Outgoing],
) -> None:
    async with to_session:
        while True:
            raw, too_long = await anyio.to_thread.run_sync(lines.next, abandon_on_cancel=True)
            if not raw:
                return  # the client closed stdin: the session ends
            if not raw.strip():
                continue
            message, code, why = _check(raw, too_long)
            if message is not None:
                await to_session.send(SessionMessage(message))
                continue
            found, rid, has_id, has_method = scan(raw.decode("utf-8", "replace"))
            if has_method and not has_id:  # a notification: JSON-RPC answers none
                log.warning("settled mcp: a notification could not be read: %s", why)
                continue
            await answers.send(error_answer(rid if found else None, code, why))


def _check(raw: bytes, too_long: bool) -> tuple[Any, int, str]:
    """The message a line holds, or why there is none (code and message)."""
    if too_long:
        return None, types.INVALID_REQUEST, f"Invalid request: larger than {MAX_LINE} bytes"
    text, why = problem(raw)
    if text is None:
        return None, types.PARSE_ERROR, why
    try:
        return types.jsonrpc_message_adapter.validate_json(text, by_name=False), 0, ""
    except ValidationError as exc:
        code, why = _why(exc, text)
        return None, code, why


def encode(item: Outgoing) -> bytes:
    """One frame: a message as the session made it, or an answer of this transport's.
    A message that cannot be encoded becomes an internal error for its id."""
    if isinstance(item, dict):
        return json.dumps(item, ensure_ascii=True).encode("ascii") + b"\n"
    message = item.message
    try:
        text = message.model_dump_json(by_alias=True, exclude_unset=True)
        return text.encode("utf-8") + b"\n"
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError and pydantic's own
        rid = getattr(message, "id", None)
        log.error("settled mcp: an answer could not be encoded: %s", type(exc).__name__)
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            why = f"Internal error: the answer could not be encoded ({type(exc).__name__})"
            return encode(error_answer(rid, types.INTERNAL_ERROR, why))
        return b""


async def _write(
    from_session: MemoryObjectReceiveStream[SessionMessage],
    answers: MemoryObjectReceiveStream[Outgoing],
    out: IO[bytes],
) -> None:
    """The one writer: the session's messages and this transport's answers, each a
    whole frame, flushed as it goes."""

    def put(frame: bytes) -> None:
        if frame:
            out.write(frame)
            out.flush()

    async def pump(source: MemoryObjectReceiveStream[Any]) -> None:
        async with source:
            async for item in source:
                await anyio.to_thread.run_sync(put, encode(item))

    async with anyio.create_task_group() as tg:
        tg.start_soon(pump, answers)
        await pump(from_session)
        tg.cancel_scope.cancel()


@asynccontextmanager
async def stdio_transport(
    stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` for ``Server.run``, over the process's stdin
    and stdout (claimed while serving) or the binary streams given."""
    restore: list[tuple[int, int]] = []
    if stdin is None or stdout is None:
        stdin, stdout, restore = _claim()
    to_session, session_reads = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    session_writes, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    answers_in, answers_out = anyio.create_memory_object_stream[Outgoing](16)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read, _Lines(stdin), to_session, answers_in)
            tg.start_soon(_write, from_session, answers_out, stdout)
            yield session_reads, session_writes
            tg.cancel_scope.cancel()
    finally:
        for fd, saved in restore:
            with suppress(OSError):
                os.dup2(saved, fd)


def _claim() -> tuple[IO[bytes], IO[bytes], list[tuple[int, int]]]:
    """Private copies of fd 0 and 1 for the wire; fd 0 then reads the null device and
    fd 1 writes to stderr. Returns the wire's streams and how to put the fds back."""
    import fcntl

    sys.stdout.flush()
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    # closefd=False: a reading thread may still block on the wire after serving ends.
    reader = os.fdopen(wire_in, "rb", closefd=False)
    writer = os.fdopen(wire_out, "wb", closefd=False)
    return reader, writer, [(0, wire_in), (1, wire_out)]


__all__ = ["MAX_LINE", "encode", "error_answer", "problem", "scan", "stdio_transport"]
