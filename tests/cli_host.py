"""A process that has imported tfpipe's stages (TensorFlow, Keras, Beam, the TF Serving protos)
once and forks a child for each `tfpipe` command line a test runs.

A child is a new process running `tfpipe.cli.main` as `python -m tfpipe.cli ARGS` would: its own
pid, arguments, working directory, environment, stdin from /dev/null, stdout and stderr to files,
exit code. What it skips is the 3-4 CPU-seconds of importing TensorFlow, which the suite would
otherwise pay about forty times. Nothing has run a TensorFlow op, started a gRPC channel or
imported locust in this process before it forks, so each child starts TensorFlow's runtime,
thread pools and gRPC afresh. Tests that signal the process or read its output as it runs start
`python -m tfpipe.cli` themselves, and `run_cli(..., fresh=True)` does too.

Protocol, one JSON line each way per command over a Unix socket: the request
{"argv", "cwd", "env", "stdout", "stderr"} (the last two are file paths); the answer first
{"pid"}, then {"returncode"} when the child has exited.

    python tests/cli_host.py SOCKET_PATH
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _child(request: dict, *inherited) -> None:
    """Become `python -m tfpipe.cli ARGV`; never returns."""
    code = 1
    try:
        for end in inherited:  # the host's socket ends: its clients wait on the host, not on us
            end.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        import tfpipe.cli

        sys.argv = [tfpipe.cli.__file__, *request["argv"]]
        try:
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


def _answer(stream, message: dict) -> None:
    try:
        stream.write(json.dumps(message).encode() + b"\n")
        stream.flush()
    except OSError:
        pass  # the client has gone (it timed out); the next one is served as usual


def serve(path: str) -> None:
    _die_with_parent()
    # What `python -m tfpipe.cli` does before it imports TensorFlow, then the imports themselves.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tfpipe.cli  # noqa: F401
    import tfpipe.export.job  # noqa: F401
    import tfpipe.pipeline.job  # noqa: F401
    import tfpipe.run  # noqa: F401
    import tfpipe.serve.configs  # noqa: F401
    import tfpipe.train.job  # noqa: F401

    assert "locust" not in sys.modules, "locust patches the standard library on import: not in the host"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)  # one command at a time: a worker's tests run one after another
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn, conn.makefile("rwb") as stream:
            line = stream.readline()
            if not line:
                continue
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request, stream, conn, listener)
            try:
                _answer(stream, {"pid": pid})
            finally:
                _, status = os.waitpid(pid, 0)  # a client that timed out has killed the child
            _answer(stream, {"returncode": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve(sys.argv[1])
