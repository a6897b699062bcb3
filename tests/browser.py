"""Open an HTML file in headless Chromium over the DevTools protocol and report what went wrong:
uncaught exceptions, console errors, failed loads. Used to check that reports render."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import tempfile
import threading

import aiohttp
import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no headless Chromium on this machine (Debian: apt-get install chromium; .ci/run installs it)")


def render(path: str, timeout: float = 60) -> dict:
    """Load file://path; returns {'errors': [...], 'title', 'svgs', 'tables', 'text', 'height'}."""
    # Chromium's helpers (renderer, crashpad) write to the profile after the browser process dies,
    # so the whole process group is killed and the profile removed only once the group is gone.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
        try:
            port = None
            while port is None:
                line = lines.get(timeout=timeout)  # raises queue.Empty when Chromium never says
                m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
                port = int(m[1]) if m else None
            return asyncio.run(asyncio.wait_for(_inspect(port, os.path.abspath(path)), timeout))
        finally:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    for _ in range(50):  # until every member of the group has exited
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        threading.Event().wait(0.1)


async def _inspect(port: int, path: str) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 1_000_000))
            errors: list[str] = []

            async def call(method: str, **params) -> dict:
                i = next(ids)
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    msg = json.loads((await ws.receive()).data)
                    if msg.get("id") == i:
                        if "error" in msg:
                            raise RuntimeError(f"{method}: {msg['error']}")
                        return msg["result"]
                    note(msg)

            def note(msg: dict) -> None:
                method, params = msg.get("method"), msg.get("params", {})
                if method == "Runtime.exceptionThrown":
                    errors.append("exception: " + params["exceptionDetails"].get("text", ""))
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    errors.append("console: " + " ".join(str(a.get("value")) for a in params.get("args", [])))
                elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                    errors.append("log: " + params["entry"]["text"])

            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            nav = await call("Page.navigate", url="file://" + path)
            if nav.get("errorText"):
                errors.append("navigation: " + nav["errorText"])
            while True:
                msg = json.loads((await ws.receive()).data)
                note(msg)
                if msg.get("method") == "Page.loadEventFired":
                    break
            facts = (await call("Runtime.evaluate", returnByValue=True, expression=(
                "JSON.stringify({title: document.title, svgs: document.querySelectorAll('svg').length,"
                " tables: document.querySelectorAll('table').length, text: document.body.innerText,"
                " height: document.body.scrollHeight,"
                " empty_svgs: [...document.querySelectorAll('svg')].filter(s => s.getBBox().width == 0).length})"
            )))["result"]["value"]
            return {"errors": errors, **json.loads(facts)}
