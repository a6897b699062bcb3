"""A process that has imported tfpipe's stages (TensorFlow, Keras, Beam, the TF Serving protos)
once and forks a child for each `tfpipe` command line a test runs.

A child is a new process running `tfpipe.cli.main` as `python -m tfpipe.cli ARGS` would: its own
pid (tests signal it), arguments, working directory, environment, stdin from /dev/null, the
caller's stdout and stderr (pipes or files), exit code. What it skips is the 3-4 CPU-seconds of
importing TensorFlow, which the suite would otherwise pay about fifty times. Nothing has run a
TensorFlow op, started a gRPC channel or imported locust in this process before it forks, so
each child starts TensorFlow's runtime, thread pools and gRPC afresh. What a process reads only
at its start (glibc's MALLOC_* variables, TensorFlow's TF_* at import) cannot change in a
child: `tests/conftest.py` starts a fresh interpreter for those, and `run_cli(..., fresh=True)`
does so on request.

Protocol, one connection per command over a Unix socket: the client sends an 8-byte length
with the child's stdout and stderr file descriptors attached (SCM_RIGHTS), then the request
{"argv", "cwd", "env", "new_session", "script"} as JSON (new_session: the child calls setsid
first; script: the child runs that Python file as `python SCRIPT ARGV` would, not the CLI); the
host answers with JSON lines, first {"pid"}, then {"returncode"} when the child has exited.
Commands run side by side: for each one the host forks a waiter, which forks the child, reports
its pid and waits for it.

    python tests/cli_host.py SOCKET_PATH    (a file in a folder of its own: the host removes the folder
                                            when it ends)
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1


def _die_with_parent(folder: str) -> None:
    """SIGTERM when the test process that started this host ends, however it ends (an xdist worker
    can be gone without running its atexit hooks), and on SIGTERM: remove `folder` (the socket and
    the log) and exit."""

    def leave(*_) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, leave)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _child(request: dict, fds: list[int], conn: socket.socket) -> None:
    """Become `python -m tfpipe.cli ARGV` with `fds` as stdout and stderr; never returns."""
    code = 1
    try:
        conn.close()  # the client waits on the waiter, not on us
        if request.get("new_session"):
            os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        import tfpipe.cli

        script = request.get("script")
        sys.argv = [script or tfpipe.cli.__file__, *request["argv"]]
        try:
            if script:
                import runpy

                runpy.run_path(script, run_name="__main__")
                code = 0
            else:
                code = tfpipe.cli.main(request["argv"])
        except SystemExit as e:  # argparse's errors and --help
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            # What the interpreter does on its way out: wait for non-daemon threads, run atexit.
            for thread in threading.enumerate():
                if thread is not threading.main_thread() and not thread.daemon:
                    thread.join()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _answer(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the client has gone (it timed out and killed the child)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(conn, 8, 2)
    while len(head) < 8:
        head += conn.recv(8 - len(head))
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        body += chunk
    return json.loads(body), fds


def _wait_for(request: dict, fds: list[int], conn: socket.socket) -> None:
    """The waiter: fork the child, report its pid, wait for it, report its exit; never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the host ignores it; the child must not
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the host's removes its folder
        pid = os.fork()
        if pid == 0:
            _child(request, fds, conn)
        for fd in set(fds):
            os.close(fd)
        _answer(conn, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer(conn, {"returncode": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)


def serve(path: str) -> None:
    _die_with_parent(os.path.dirname(path))
    # What `python -m tfpipe.cli` does before it imports TensorFlow, then the imports themselves.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tfpipe.cli  # noqa: F401
    import tfpipe.export.job  # noqa: F401
    import tfpipe.pipeline.job  # noqa: F401
    import tfpipe.run  # noqa: F401
    import tfpipe.serve.tfserving.configs  # noqa: F401
    import tfpipe.train.job  # noqa: F401

    assert "locust" not in sys.modules, "locust patches the standard library on import: not in the host"
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # waiters are reaped as they end
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            _wait_for(request, fds, conn)
        conn.close()
        for fd in set(fds):
            os.close(fd)


if __name__ == "__main__":
    serve(sys.argv[1])
