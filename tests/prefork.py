"""Child processes that start warm: forked from a process that imported the `store` command once.

A test that starts the same short Python program dozens of times (a writer
killed at each of its steps, `store relations repair` after each) spent most
of each child's time, and far more on a busy machine, importing the package
again. `Prefork` starts one server process that imports `store.cli` and
nothing else, opens no connection and starts no thread; each `Prefork.run`
forks it, and the child (a process of its own: its own pid, connections and
exit, a SIGKILL kills it alone) runs the program as ``python -c CODE ARGS``
or ``python -m MODULE ARGS`` would, from the point where their imports are
done: its own stdin (empty), stdout, stderr, arguments, folder and
environment; an exception that escapes it printed and exit code 1, a
``SystemExit`` its exit code, atexit handlers run at its end.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["Prefork"]

SERVER = r"""
import json, os, sys
import store.cli  # what every child imports, once

request = None
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        request = job
        break
    sys.stdout.write(json.dumps({"pid": pid}) + "\n")
    sys.stdout.flush()
    _pid, status = os.waitpid(pid, 0)
    sys.stdout.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n")
    sys.stdout.flush()

if request is not None:
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    os.dup2(sys.stdin.fileno(), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["module"] is not None:
        import runpy

        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *request["args"]]
        code = compile(request["code"], "<string>", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


class Prefork:
    """The fork server (see the module's text): start it with ``with Prefork() as children:``."""

    def __init__(self) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="store-prefork-"))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self._runs = 0

    def __enter__(self) -> Prefork:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def run(
        self,
        args: list[str],
        *,
        code: str | None = None,
        module: str | None = None,
        cwd: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """``python -c CODE ARGS`` (or ``-m MODULE ARGS``) in a child of the server: its exit code
        (negative: the signal that killed it), stdout and stderr."""
        assert (code is None) != (module is None), "a code or a module"
        assert self._proc.stdin is not None
        self._runs += 1
        out, err = self._folder / f"{self._runs}.out", self._folder / f"{self._runs}.err"
        job = {
            "code": code,
            "module": module,
            "args": args,
            "cwd": str(cwd or Path.cwd()),
            "env": dict(os.environ),
            "stdout": str(out),
            "stderr": str(err),
        }
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        pid = int(json.loads(self._line(10))["pid"])
        try:
            code = int(json.loads(self._line(timeout))["exit"])
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)  # as subprocess.run's timeout does; the server reaps it
            self._line(10)
            raise
        done = subprocess.CompletedProcess(
            args, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )
        out.unlink()
        err.unlink()
        return done

    def _line(self, timeout: float) -> str:
        """The server's next line, within ``timeout`` seconds."""
        stdout = self._proc.stdout
        assert stdout is not None
        ready, _w, _x = select.select([stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("a child of the fork server", timeout)
        line = stdout.readline()
        assert line, f"the fork server ended (exit code {self._proc.poll()})"
        return line

    def close(self) -> None:
        """End the server (its children are gone already) and remove its files."""
        import shutil

        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        shutil.rmtree(self._folder, ignore_errors=True)
