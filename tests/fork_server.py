"""Runs a command (`python client.py ARGS`, `python -m MODULE ARGS`) in a child forked
from this process, which imported the command's modules once: a child is the process a
person starts, without the second or more of imports it pays on a loaded machine.

Started by `tests.procs.Forks`, with the modules to import as arguments (`module`, or
`module:function` to call what the command calls first, as it would). It reads
requests from standard input and answers each with the child's exit code. It starts no
thread and no SDK runtime of its own, so a fork holds nothing another process holds; a
child reads its environment, folder and arguments as a process started anew would.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import runpy
import signal
import struct
import sys
import threading
import time
import traceback

HEADER = struct.Struct("!I")


def read_exactly(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def exit_code(code: object) -> int:
    """The interpreter's exit code for `SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def child(request: dict, protocol: tuple[int, int], fresh: bool) -> None:
    """In the forked child: the command, as `python` would run it (`fresh`: python
    itself, run anew); never returns."""
    code = 1
    try:
        for fd in protocol:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        args = request["args"]
        if fresh:
            os.execve(sys.executable, [sys.executable, *args], request["env"])
        try:
            if args[0] == "-m":
                sys.argv = [args[1], *args[2:]]
                sys.path[0] = os.getcwd()
                # `python -m` runs the module (or a package's `__main__`) as `__main__`
                # only: imported here, it would run beside its own import.
                for name in (args[1], f"{args[1]}.__main__"):
                    if not hasattr(sys.modules.get(name), "__path__"):
                        sys.modules.pop(name, None)
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(args)
                sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
                runpy.run_path(args[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = exit_code(e.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def waited(pid: int, timeout: float) -> int:
    """The child's exit code as `subprocess` gives it (-N for a signal); killed at
    `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def preloaded(modules: list[str]) -> set[str]:
    """Imports `modules` (`module`, or `module:function` for what the command does
    first at start-up); the names of the environment variables they read as they did."""
    read: set[str] = set()
    environ = type(os.environ)
    get = environ.__getitem__

    def recorded(self: os._Environ[str], key: str) -> str:
        read.add(key)
        return get(self, key)

    environ.__getitem__ = recorded  # type: ignore[method-assign]
    try:
        for name in modules:
            # One that fails here (an extra not installed) fails again in the child that
            # needs it, as it would in a process of its own.
            module, _, function = name.partition(":")
            with contextlib.suppress(Exception):
                imported = importlib.import_module(module)
                if function:
                    getattr(imported, function)()
    finally:
        environ.__getitem__ = get  # type: ignore[method-assign]
    return read


def serve(modules: list[str]) -> None:
    # The requests come on standard input and the answers go out on standard output;
    # a child's own are files of the test's.
    protocol = (os.dup(0), os.dup(1))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    loaded_in = dict(os.environ)
    read = preloaded(modules)
    if threading.active_count() != 1:
        raise SystemExit("fork_server: importing the modules started a thread")
    os.write(protocol[1], HEADER.pack(0))  # ready
    while True:
        try:
            (size,) = HEADER.unpack(read_exactly(protocol[0], HEADER.size))
        except EOFError:
            return
        request = pickle.loads(read_exactly(protocol[0], size))
        pid = os.fork()
        if pid == 0:
            # A run whose environment differs in what a module read as it loaded (a
            # task queue, a port: `runtime.settings`) would see this process's values:
            # it runs as a process of its own instead.
            fresh = any(request["env"].get(k) != loaded_in.get(k) for k in read)
            child(request, protocol, fresh)
        code = waited(pid, request["timeout"])
        os.write(protocol[1], struct.pack("!i", code))


if __name__ == "__main__":
    serve(sys.argv[1:])
