"""A TF-Serving-shaped REST endpoint for benchmarking load generators.

    python benchmarks/noop_endpoint.py PORT [DELAY_MS]

Answers GET /v1/models/noop/metadata and POST /v1/models/noop:predict (after DELAY_MS, 0 by
default). With a delay it records how long it held each request and serves the figures at
GET /held (JSON, milliseconds), the truth a load tester's percentiles are compared with.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiohttp import web

held: list[float] = []


async def metadata(_):
    return web.json_response({"metadata": {"signature_def": {"signature_def": {
        "serving_default": {"inputs": {"x": {"dtype": "DT_FLOAT"}}}}}}})


def make_predict(delay: float):
    body = b'{"predictions": [0.0]}'

    async def predict(request):
        t0 = time.perf_counter()
        await request.read()
        if delay:
            await asyncio.sleep(delay)
        held.append((time.perf_counter() - t0) * 1000)
        return web.Response(body=body, content_type="application/json")

    return predict


async def held_times(_):
    return web.json_response(held)


async def reset(_):
    held.clear()
    return web.json_response({})


def main() -> None:
    port, delay = int(sys.argv[1]), (float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.0)
    app = web.Application()
    app.router.add_get("/v1/models/noop/metadata", metadata)
    app.router.add_post("/v1/models/noop:predict", make_predict(delay))
    app.router.add_get("/held", held_times)
    app.router.add_post("/reset", reset)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=lambda *_: print(f"noop endpoint at 127.0.0.1:{port}", flush=True))


if __name__ == "__main__":
    main()
