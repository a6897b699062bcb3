"""TF Serving's REST API on aiohttp: same paths, JSON shapes and status codes.

    GET  /v1/models/NAME[/versions/V | /labels/L]            model status
    GET  /v1/models/NAME[/versions/V | /labels/L]/metadata   signature defs
    POST /v1/models/NAME[/versions/V | /labels/L]:predict    row ("instances") or columnar ("inputs")
    POST /v1/models/NAME[/versions/V | /labels/L]:classify   {"examples": [...], "context": {...}}
    POST /v1/models/NAME[/versions/V | /labels/L]:regress
Errors are {"error": "..."} with the HTTP code TF Serving maps the gRPC status to.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

from aiohttp import web
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from serve.errors import ServingError, invalid
from serve.grpc_api import metadata_response, status_response
from serve.inference import Inference
from serve.metrics import Metrics
from serve.requests import (
    classification_result,
    json_examples,
    json_inputs,
    json_outputs,
    regression_result,
)

_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
                   r"(?:(?P<meta>/metadata)|:(?P<verb>[A-Za-z_]+))?/?$")


def _json(body, status: int = 200) -> web.Response:
    # allow_nan: TF Serving's REST API sends NaN / Infinity as bare tokens.
    return web.Response(text=json.dumps(body, allow_nan=True), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _proto_json(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


class RestApi:
    def __init__(self, inference: Inference, metrics: Metrics, timeout_ms: int, max_body_bytes: int,
                 metrics_path: str | None = None):
        self.inference, self.metrics = inference, metrics
        self.timeout = timeout_ms / 1000 if timeout_ms > 0 else None
        self.metrics_path = metrics_path
        self.max_body_bytes = max_body_bytes
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._errors_as_json])
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    @web.middleware
    async def _errors_as_json(self, request, handler):
        try:
            return await handler(request)
        except web.HTTPException as e:  # aiohttp's own: 413 over the size limit, 405, ...
            return _error(e.status, e.reason if e.status != 413 else
                          f"Request body too large (limit {self.max_body_bytes} bytes)")

    async def dispatch(self, request: web.Request) -> web.Response:
        if self.metrics_path and request.path == self.metrics_path:
            if request.method != "GET":
                return _error(405, f"Malformed request: {request.method} {request.path}")
            depth = self.inference.batcher.depth() if self.inference.batcher else 0
            return web.Response(text=self.metrics.render(self.inference.manager.loaded(), depth),
                                content_type="text/plain", charset="utf-8")
        m = _PATH.match(request.path)
        if not request.path.startswith("/v1/"):
            return _error(404, f"Not found: {request.method} {request.path}")
        if m is None:
            return _error(400, f"Malformed request: {request.method} {request.path}")
        verb = m["verb"]
        api = verb or ("metadata" if m["meta"] else "model_status")
        t0 = time.perf_counter()
        status = "OK"
        try:
            if (request.method == "POST") != bool(verb) or request.method not in ("GET", "POST") \
                    or (verb and verb not in ("predict", "classify", "regress")):
                raise invalid(f"Malformed request: {request.method} {request.path}")
            try:
                version = int(m["version"]) if m["version"] is not None else None
            except ValueError:
                raise invalid(f"Malformed request: {request.method} {request.path}") from None
            spec = (m["name"], version, m["label"])
            if verb:
                body = await self._body(request)
                work = getattr(self, verb)(spec, body)
                response = await (asyncio.wait_for(work, self.timeout) if self.timeout else work)
            elif m["meta"]:
                req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
                _fill_spec(req.model_spec, *spec)
                resp = metadata_response(self.inference, req)
                sig_map = get_model_metadata_pb2.SignatureDefMap()
                resp.metadata["signature_def"].Unpack(sig_map)
                response = _json({"model_spec": _proto_json(resp.model_spec),
                                  "metadata": {"signature_def": _proto_json(sig_map)}})
            else:
                req = get_model_status_pb2.GetModelStatusRequest()
                _fill_spec(req.model_spec, *spec)
                response = _json(_proto_json(status_response(self.inference, req)))
        except ServingError as e:
            status = e.code.name
            response = _error(e.http_status, e.message)
        except web.HTTPException as e:  # 413 from the body reader: answered by the middleware
            self.metrics.request(m["name"], api, f"HTTP_{e.status}", time.perf_counter() - t0)
            raise
        except TimeoutError:
            status = "DEADLINE_EXCEEDED"
            response = _error(504, "Request timed out (--rest_api_timeout_in_ms)")
        except Exception as e:  # a bug, not bad input
            status = "INTERNAL"
            response = _error(500, f"{type(e).__name__}: {e}")
        self.metrics.request(m["name"], api, status, time.perf_counter() - t0)
        return response

    async def _body(self, request: web.Request) -> dict:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise invalid(f"JSON Parse error: {e}") from None
        if not isinstance(body, dict):
            raise invalid("JSON Value: request body must be a JSON object")
        name = body.get("signature_name", "")
        if not isinstance(name, str):
            raise invalid("'signature_name' must be a string")
        return body

    async def predict(self, spec, body: dict) -> web.Response:
        servable = self.inference.manager.resolve(*spec)
        sig = servable.signature(body.get("signature_name", ""))
        inputs, rows = json_inputs(body, sig)
        _, _, outputs = await self.inference.predict_async(servable, sig.name, inputs)
        return _json(json_outputs(outputs, rows))

    async def classify(self, spec, body: dict) -> web.Response:
        _, _, classes, scores = await self.inference.classify_async(*spec, body.get("signature_name", ""),
                                                              json_examples(body))
        result = classification_result(classes, scores)
        return _json({"results": [[[c.label, c.score] for c in row.classes] for row in result.classifications]})

    async def regress(self, spec, body: dict) -> web.Response:
        _, _, values = await self.inference.regress_async(*spec, body.get("signature_name", ""), json_examples(body))
        return _json({"results": [r.value for r in regression_result(values).regressions]})


def _fill_spec(spec, name: str, version: int | None, label: str | None) -> None:
    spec.name = name
    if version is not None:
        spec.version.value = version
    if label:
        spec.version_label = label
