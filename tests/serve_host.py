"""Several `tfpipe serve` command lines in one process: the TF Serving suite's long-lived servers.

Each command line goes through tfpipe's own parser (`tfpipe.cli.build_parser`, then
`options_from_args`) and becomes an EmbeddedServer on its own ports, socket and log, exactly
as `tfpipe serve` would start it; only the process is shared, so that TensorFlow is imported
once instead of once per server (about 4 CPU-seconds each). A server that fails to start
writes `HOST: failed to start: ...` to its log; the others keep serving. SIGTERM stops all.

    python serve_host.py SPEC.json    # [{"argv": ["--port=...", ...], "log": "/path/server-0.log"}, ...]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

FAILED = "HOST: failed to start: "


def main(spec_path: str) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tfpipe.cli import build_parser
    from tfpipe.serve.flags import options_from_args
    from tfpipe.serve.server import EmbeddedServer

    with open(spec_path) as f:
        spec = json.load(f)
    parser = build_parser()

    async def serve_all() -> None:
        logs = [open(s["log"], "a", buffering=1) for s in spec]
        servers = []
        for s, log in zip(spec, logs, strict=True):
            args, extra = parser.parse_known_args(["serve", *s["argv"]])
            assert not extra, extra
            servers.append(EmbeddedServer(options_from_args(args), lambda line, log=log: log.write(line + "\n")))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        results = await asyncio.gather(*(s.start() for s in servers), return_exceptions=True)
        started = []
        for server, result, log in zip(servers, results, logs, strict=True):
            if isinstance(result, BaseException):
                log.write(f"{FAILED}{type(result).__name__}: {result}\n")
            else:
                started.append(server)
        await stop.wait()
        await asyncio.gather(*(s.stop(2.0) for s in started), return_exceptions=True)
        for log in logs:
            log.close()

    asyncio.run(serve_all())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
