"""`settled` as a real OS process, without a new interpreter for each command.

Most of a short command's time is the interpreter starting and importing typer, rich,
pydantic, httpx and settled (about 0.2 s of CPU); the suite runs a few thousand of
them. A warm process per test worker (the zygote) imports all of that once, then forks
a child for each command. The child is a real process: its own pid, its own standard
streams (files the test reads back), its exit status as the kernel reports it, and
signals, crash points (``settled.testing``) and SIGKILL all work on it as on any
other. What it shares with the zygote is only what an import leaves behind.

A command goes through a new interpreter instead (``support.command``) when:

- ``SETTLED_TEST_EXEC=1`` is set (the whole suite can be run that way, to prove that
  nothing depends on the fork);
- its environment differs from the zygote's in a variable an interpreter or an import
  reads before any command runs (``_AT_START``: ``LD_PRELOAD`` and libfaketime, the
  ``PYTHON*`` flags, the locale and time zone, typer's width settings);
- the zygote cannot be started or reached.

The protocol, over a Unix socket: the test sends a JSON request (argv, environment,
working directory) with the three descriptors for stdin, stdout and stderr attached
(``socket.send_fds``); the zygote answers one line with the child's pid, and one with
its exit status (``os.waitstatus_to_exitcode``: negative for a signal, as
``subprocess`` reports it) when the child ends.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import locale
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What the children import anyway, imported once here (the commands import the rest
# of settled lazily; these are the modules nearly every command reaches).
PRELOAD = (
    "settled.cli.commands",
    "settled.cli.common",
    "settled.session",
    "settled.config",
    "tomllib",
    "settled.dispatch",
    "settled.reconcile",
    "settled.storage.sqlite",
    "settled.storage.postgres",
    "settled.providers.sim",
    "settled.providers.http",
    "httpx",
    "psycopg",
    "pydantic",
    "typer._adapters",
    "rich.console",
    "rich.table",
)

# Variables read when an interpreter starts or a module is imported: a child forked
# from the zygote would see the zygote's values, so a command whose environment
# differs in one of these gets a new interpreter.
_AT_START = ("LD_", "FAKETIME", "PYTHON", "LANG", "LC_", "TZ", "TERMINAL_WIDTH", "_TYPER", "TYPER")

_HEADER = struct.Struct("!I")


def _starts_an_interpreter(env: Mapping[str, str], base: Mapping[str, str]) -> bool:
    keys = set(env) ^ set(base) | {k for k in env.keys() & base.keys() if env[k] != base[k]}
    return any(k == p or k.startswith(p) for k in keys for p in _AT_START)


# ---------------------------------------------------------------------- the test's side
class _Client:
    """One zygote per test process, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.path = ""
        self.env: dict[str, str] = {}
        self.broken = False

    def ready(self) -> bool:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                return True
            if self.broken:
                return False
            folder = tempfile.mkdtemp(prefix="settled-zygote-")
            self.path = os.path.join(folder, "sock")
            self.env = dict(os.environ)
            ready_r, ready_w = os.pipe()
            self.proc = subprocess.Popen(
                [sys.executable, __file__, self.path, str(ready_w)],
                stdin=subprocess.PIPE,  # its end of life: EOF when this process goes
                stdout=subprocess.DEVNULL,
                env=self.env,
                pass_fds=(ready_w,),
                cwd=str(Path(__file__).resolve().parents[2]),
            )
            os.close(ready_w)
            with os.fdopen(ready_r, "rb") as ready:
                ok = ready.read() == b"ready\n"  # EOF without it: it failed to start
            if not ok:
                self.proc.wait()
                self.broken = True
                return False
            atexit.register(self.stop)
            return True

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        if self.path:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)  # its socket


_CLIENT = _Client()


def usable(env: Mapping[str, str]) -> bool:
    if env.get("SETTLED_TEST_EXEC") == "1" or os.environ.get("SETTLED_TEST_EXEC") == "1":
        return False
    if not _CLIENT.ready():
        return False
    return not _starts_an_interpreter(env, _CLIENT.env)


def _text(raw: bytes) -> str:
    """As ``subprocess`` reads a child's output with ``text=True``: the locale's
    encoding, universal newlines."""
    wrapper = io.TextIOWrapper(io.BytesIO(raw), encoding=locale.getpreferredencoding(False))
    return wrapper.read()


def run(
    cmd: Sequence[str],
    module_args: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    input: str | None,
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)``, with the child
    forked from the zygote: ``module_args`` is what follows ``python -m``."""
    with contextlib.ExitStack() as stack:
        stdin = stack.enter_context(tempfile.TemporaryFile())
        if input is not None:
            stdin.write(input.encode(locale.getpreferredencoding(False)))
            stdin.seek(0)
        out = stack.enter_context(tempfile.TemporaryFile())
        err = stack.enter_context(tempfile.TemporaryFile())
        conn = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        conn.connect(_CLIENT.path)
        _request(conn, module_args, env, cwd, [f.fileno() for f in (stdin, out, err)])
        answers = conn.makefile("rb")
        pid = int(answers.readline())
        conn.settimeout(timeout)
        try:
            line = answers.readline()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            conn.settimeout(None)
            answers.readline()
            out.seek(0)
            err.seek(0)
            raise subprocess.TimeoutExpired(list(cmd), timeout, out.read(), err.read()) from None
        code = int(line)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(list(cmd), code, _text(out.read()), _text(err.read()))


class Forked(subprocess.Popen[str]):
    """``subprocess.Popen(cmd, stdout=PIPE, stderr=PIPE, text=True)`` for a child forked
    from the zygote: the same methods, on a real process that is the zygote's child
    (its exit status comes over the socket, ``wait``)."""

    def __init__(
        self, cmd: Sequence[str], module_args: Sequence[str], *, env: Mapping[str, str], cwd: str
    ) -> None:
        # Popen's own __init__ would start a process; this one asks the zygote for it.
        self._child_created = False  # Popen.__del__: no child of ours to reap
        self.args = list(cmd)
        self.returncode: int | None = None
        self.stdin = None
        self._readers: list[threading.Thread] = []
        self._output: dict[str, str] = {}
        encoding = locale.getpreferredencoding(False)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        with open(os.devnull, "rb") as null:
            self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self._conn.connect(_CLIENT.path)
                _request(self._conn, module_args, env, cwd, [null.fileno(), out_w, err_w])
            finally:
                os.close(out_w)
                os.close(err_w)
        self.stdout = open(out_r, encoding=encoding)
        self.stderr = open(err_r, encoding=encoding)
        self._answers = self._conn.makefile("rb")
        self.pid = int(self._answers.readline())

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                line = self._answers.readline()
            except (BlockingIOError, TimeoutError):
                line = b""
            finally:
                self._conn.setblocking(True)
            if line:
                self._ended(line)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                line = self._answers.readline()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            finally:
                self._conn.settimeout(None)
            self._ended(line)
        assert self.returncode is not None
        return self.returncode

    def _ended(self, line: bytes) -> None:
        self.returncode = int(line)
        self._answers.close()
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def communicate(
        self, input: str | None = None, timeout: float | None = None
    ) -> tuple[str, str]:
        if input:
            raise ValueError("a forked child's stdin is /dev/null")
        if not self._readers:
            for name in ("stdout", "stderr"):
                stream = getattr(self, name)
                reader = threading.Thread(target=self._drain, args=(name, stream), daemon=True)
                reader.start()
                self._readers.append(reader)
        for reader in self._readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(timeout)
        return self._output.get("stdout", ""), self._output.get("stderr", "")

    def _drain(self, name: str, stream: Any) -> None:
        try:
            self._output[name] = stream.read() if not stream.closed else ""
        finally:
            stream.close()

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()

    def __del__(self) -> None:
        pass


def popen(
    cmd: Sequence[str], module_args: Sequence[str], *, env: Mapping[str, str], cwd: str
) -> Forked:
    return Forked(cmd, module_args, env=env, cwd=cwd)


def _request(
    conn: socket.socket,
    module_args: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    fds: list[int],
) -> None:
    body = json.dumps({"argv": list(module_args), "env": dict(env), "cwd": cwd}).encode()
    socket.send_fds(conn, [_HEADER.pack(len(body)) + body], fds)


# ---------------------------------------------------------------------- the zygote
def _child(request: dict[str, Any], fds: list[int], closing: list[Any]) -> None:
    """In the forked child: become ``python -m ARGV`` with these streams, never
    return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for thing in closing:  # the zygote's sockets and selector, closed as objects
            thing.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import runpy

        argv = request["argv"]
        sys.argv = [argv[0], *argv[1:]]
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            # as an interpreter does: die of the signal itself
            _finish()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        _finish()
    finally:
        os._exit(code & 0xFF)


def _finish() -> None:
    """What an interpreter does on its way out: wait for its threads, run atexit,
    flush the streams."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


def _serve(path: str, ready_fd: int) -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the tests, which stop this
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    children: dict[int, socket.socket] = {}
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 1024):
                    return  # the test process is gone; children finish on their own
            elif key.data == "accept":
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, [sel, listener, conn, *children.values()])
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                _send(conn, f"{pid}\n")
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 1024):
                        pass
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        _send(conn, f"{os.waitstatus_to_exitcode(status)}\n")
                        conn.close()


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    (size,) = _HEADER.unpack(data[: _HEADER.size])
    body = data[_HEADER.size :]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("request cut short")
        body += more
    return json.loads(body), list(fds)


def _send(conn: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):  # the test gave up on it (a timeout)
        conn.sendall(text.encode())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _serve(sys.argv[1], int(sys.argv[2]))
