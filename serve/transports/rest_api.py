"""TF Serving's REST API on aiohttp: same paths, JSON shapes, status codes and messages.

    GET  /v1/models/NAME[/versions/V | /labels/L]            model status
    GET  /v1/models/NAME[/versions/V | /labels/L]/metadata   signature defs
    POST /v1/models/NAME[/versions/V | /labels/L]:predict    row ("instances") or columnar ("inputs")
    POST /v1/models/NAME[/versions/V | /labels/L]:classify   {"examples": [...], "context": {...}}
    POST /v1/models/NAME[/versions/V | /labels/L]:regress
    OPTIONS (any /v1/ path)                                    CORS preflight
Paths match case-insensitively, the model name and label are percent-decoded, as in TF
Serving's http_rest_api_util.cc. Errors are {"error": "..."} with the HTTP code TF
Serving maps the gRPC status to; JSON that does not parse gets rapidjson's wording.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
import urllib.parse
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

from tfpipe.serve.codecs.json_text import parse_json
from tfpipe.serve.codecs.rest_json import json_debug, json_examples, json_inputs, json_output_text, json_outputs
from tfpipe.serve.codecs.model_info import fill_spec, metadata_response, status_response
from tfpipe.serve.codecs.rest_protos import example_protos, predict_protos
from tfpipe.serve.codecs.tensor_proto import classification_result, regression_result
from tfpipe.serve.core.inference import OFF_LOOP_BYTES, Inference
from tfpipe.serve.core.large_requests import large_request, large_turn
from tfpipe.serve.core.manager import ModelSpec
from tfpipe.serve.core.turns import PEER
from tfpipe.serve.drain import pending
from tfpipe.serve.errors import ServingError, capped, invalid, precondition, quoted
from tfpipe.serve.metrics import Metrics
from tfpipe.serve.request_log import RequestLogs
from tfpipe.serve.transports.deadlines import Deadlines
from tfpipe.serve.transports.rest_answers import encoded, error_response, json_chunks, json_response, text_in_pieces

_PREDICTION_PATH = re.compile(r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
                              r"(classify|regress|predict)", re.IGNORECASE)
_STATUS_PATH = re.compile(r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
                          re.IGNORECASE)
_API_PATH = re.compile(r"/v1/.*", re.IGNORECASE)
CORS_HEADERS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "POST, GET",
                "Access-Control-Allow-Headers": "Content-Type"}


def _proto_json(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _signature_name(body: dict) -> str:
    name = body.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid(f"JSON Value: {json_debug(body)} not formatted correctly. 'signature_name' key must be a "
                      "string value.")
    return name


def parse_path(method: str, raw_path: str) -> tuple[str, int | None, str | None, str] | None:
    """(model name, version, label, api) of a TF Serving REST path; api is predict /
    classify / regress (POST), metadata or model_status (GET). None: not one of them."""
    m = (_PREDICTION_PATH if method == "POST" else _STATUS_PATH).fullmatch(raw_path) \
        if method in ("POST", "GET") else None
    if m is None:
        return None
    name, version, label, last = m.groups()
    name = urllib.parse.unquote(name or "")
    label = urllib.parse.unquote(label) if label else None
    if version is not None:
        number = int(version)
        if number >= 2**63:
            raise invalid(f"Failed to convert version: {quoted(version)} to numeric.")
        version = number
    api = last.lower() if method == "POST" else ("metadata" if last else "model_status")
    if method == "POST" and last not in ("predict", "classify", "regress"):
        return None  # TF Serving's verbs are matched case-insensitively, then compared exactly
    return name, version, label, api


async def _expect(request: web.BaseRequest, draining: bool) -> bool:
    """`Expect: 100-continue` (curl sends it before a body over 1 KiB): the interim answer, as an
    aiohttp Application's router gives it; any other expectation is a 417. While the server drains,
    the client is not asked for its body: _NotRead. True when the client was told to send it."""
    expect = request.headers["Expect"]
    if request.version == HttpVersion11:
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(reason=f"Unknown Expect: {quoted(expect)}")
        if draining:
            raise _NotRead()
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's own size starts after it
        return True
    return False


def _peer(request: web.BaseRequest) -> str:
    """The connection a request came on, as grpc names a peer."""
    transport = request.transport
    where = transport.get_extra_info("peername") if transport is not None else None
    return f"rest:{where[0]}:{where[1]}" if isinstance(where, tuple) and len(where) >= 2 else f"rest:{where}"


def _take_apart(held: list) -> None:
    """On a REST thread: a large parsed document that `held` alone holds, freed a piece at a time,
    its objects' members and its lists' items a slice at a time. Dropped whole, its millions of
    objects would be freed by one call, holding Python's GIL for as long as that takes, on whichever
    thread (the loop, as a rule) dropped it last. A part something else still holds is left to it."""
    with large_request():
        while held:
            value = held.pop()
            if sys.getrefcount(value) != 2:  # (`value`, and getrefcount's argument)
                continue
            if type(value) is dict:
                held.extend(value.values())
                value.clear()
            elif type(value) is list:
                while value:
                    del value[-1024:]


class _SlowBody(Exception):
    """The body did not arrive within the read timeout."""


class _Undecodable(Exception):
    """The body is not what its Content-Encoding (the argument) says: the client's error."""


class _NotRead(Exception):
    """The server drains and has not read this request's body, nor will: it asked `Expect:
    100-continue` and was told to wait, or was told to send and no byte of it has come."""


class RestApi:
    """`read_timeout`: seconds a connection has to send a request's line and headers (from its
    start, or from the previous answer: an idle connection is closed after as long), and then
    its body; 0 or less, no limit of this server's own (aiohttp closes idle connections after an
    hour)."""

    def __init__(self, inference: Inference, metrics: Metrics, timeout_ms: int, max_body_bytes: int,
                 metrics_path: str | None, render_metrics, cors: bool = False, logs: RequestLogs | None = None,
                 read_timeout: float = 0.0):
        self.inference, self.metrics, self.logs = inference, metrics, logs
        self.deadlines = Deadlines(timeout_ms / 1000) if timeout_ms > 0 else None
        self.metrics_path = metrics_path
        self.render_metrics = render_metrics  # () -> the Prometheus page
        self.max_body_bytes = max_body_bytes
        self.read_timeout = read_timeout
        self.cors = cors
        self.canary_key = inference.canary.options.key if inference.canary is not None else ""  # its header
        self.draining = False  # set by the server's drain (see give_up_bodies): answers say Connection: close
        self._continued: dict[int, web.BaseRequest] = {}  # told `100 Continue`, their bodies to come (by id)
        # aiohttp's low-level server: every path comes to one handler, so an Application's router,
        # middleware chain and per-request bookkeeping, a fixed cost on every request, are left out.
        # Its keep-alive timer runs from a connection's start and from each answer, and closes the
        # connection if no complete request line and headers have come by then: the header timeout.
        # After an answer given before the body was read (a 413 on Content-Length), aiohttp reads and
        # drops what the client still sends, so that it reads the answer rather than a reset, for
        # up to its lingering time (10 s): no longer than the read timeout either.
        limits = {"keepalive_timeout": read_timeout, "lingering_time": min(10.0, read_timeout)} \
            if read_timeout > 0 else {}
        self.server = web.Server(self.handle, request_factory=self._request, access_log=None, **limits)

    def give_up_bodies(self) -> None:
        """The drain begins: answers say Connection: close from now on, and a request that was told
        `100 Continue` and has sent no byte of its body is answered 503 at once rather than held
        until its read timeout (a client that never sends would hold the drain that long)."""
        self.draining = True
        for request in list(self._continued.values()):
            if request.content.total_bytes == 0 and not request.content.is_eof():
                request.content.set_exception(_NotRead())

    def _request(self, message, payload, protocol, writer, task) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, asyncio.get_running_loop(),
                               client_max_size=self.max_body_bytes)

    async def handle(self, request: web.BaseRequest) -> web.Response:
        """Every request: dispatched, aiohttp's own HTTP errors answered as TF Serving's JSON errors."""
        try:
            length = request.content_length
            if length is not None and length > self.max_body_bytes:  # refused before any of it is read
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=length)
            if "Expect" in request.headers and await _expect(request, self.draining):
                self._continued[id(request)] = request
                try:
                    response = await self.dispatch(request)
                finally:
                    del self._continued[id(request)]
            else:
                response = await self.dispatch(request)
        except web.HTTPException as e:  # aiohttp's own: 413 over the size limit, 417, ...
            response = error_response(e.status, e.reason if e.status != 413 else
                              f"Request body too large (limit {self.max_body_bytes} bytes)")
        except _NotRead:  # nothing of the body has come: the client sends the request again, elsewhere
            response = error_response(503, "The server is shutting down and did not read this request: send it again")
            response.force_close()
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
            return response
        except _SlowBody:  # the connection goes, with a 408 if the client still reads
            response = error_response(408, f"Request body not received within {self.read_timeout:g} s "
                                   "(--rest_read_timeout_seconds)")
            response.force_close()
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()  # the transport sends what is written, then closes
            return response
        if self.cors:
            response.headers.update(CORS_HEADERS)
        if self.draining and not pending(request.protocol):
            response.force_close()  # a request behind this one is answered first; the last says close
        return response

    async def dispatch(self, request: web.BaseRequest) -> web.Response:
        raw_path = request.raw_path.split("?", 1)[0]
        if self.metrics_path and request.path == self.metrics_path:
            if request.method != "GET":
                return error_response(405, f"Malformed request: {request.method} {quoted(request.path)}")
            return web.Response(text=self.render_metrics(), content_type="text/plain", charset="utf-8")
        if not _API_PATH.fullmatch(raw_path):
            return error_response(404, f"Not found: {quoted(request.method)} {quoted(request.path)}")
        t0 = time.perf_counter()
        started = time.time_ns(), time.perf_counter_ns()
        PEER.set(_peer(request))  # (this request's task: its work takes its connection's turns)
        name, api, status, body = "", "unknown", "OK", None
        try:
            if request.method == "OPTIONS":
                if not re.search(r"https?://", request.headers.get("Origin", "")):
                    raise precondition("Origin header is missing in CORS preflight")
                return web.Response(status=200, content_type="application/json")
            parsed = parse_path(request.method, raw_path)
            if parsed is None:
                raise invalid(f"Malformed request: {quoted(request.method)} {quoted(raw_path)}")
            name, version, label, api = parsed
            spec = ModelSpec(name, version, label)
            if api in ("predict", "classify", "regress"):
                raw = await self._body(request)
                large = len(raw) > OFF_LOOP_BYTES
                if not large:
                    body = parse_json(raw)
                    del raw
                    response = await self._answered(request, api, spec, body, started, False)
                else:
                    async with large_turn():
                        body = await self._off_loop(parse_json, raw)
                        del raw  # (a large body's bytes need not wait for its answer)
                        response = await self._answered(request, api, spec, body, started, True)
            elif not name:
                raise invalid("Missing model name in request.")
            elif api == "metadata":
                req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
                fill_spec(req.model_spec, spec)
                resp = metadata_response(self.inference.manager, req)
                sig_map = get_model_metadata_pb2.SignatureDefMap()
                resp.metadata["signature_def"].Unpack(sig_map)
                response = json_response({"model_spec": _proto_json(resp.model_spec),
                                  "metadata": {"signature_def": _proto_json(sig_map)}})
            else:
                req = get_model_status_pb2.GetModelStatusRequest()
                fill_spec(req.model_spec, spec)
                response = json_response(_proto_json(status_response(self.inference.manager, req)))
        except ServingError as e:
            status = e.code.name
            response = error_response(e.http_status, e.message)
        except web.HTTPException as e:  # 413 from the body reader: answered by the middleware
            self.metrics.request(name, api, f"HTTP_{e.status}", time.perf_counter() - t0)
            raise
        except _SlowBody:
            self.metrics.request(name, api, "HTTP_408", time.perf_counter() - t0)
            raise
        except _NotRead:
            self.metrics.request(name, api, "HTTP_503", time.perf_counter() - t0)
            raise
        except _Undecodable as e:
            status = "INVALID_ARGUMENT"
            response = error_response(400, f"The request body could not be decoded as its Content-Encoding ({capped(str(e))}) "
                                   "says")
            response.force_close()  # what is left of such a body on the connection cannot be read past
        except TimeoutError:
            status = "DEADLINE_EXCEEDED"
            response = error_response(504, "Request timed out (--rest_api_timeout_in_ms)")
        except Exception as e:  # a bug, not bad input
            status = "INTERNAL"
            response = error_response(500, f"{type(e).__name__}: {e}")
        if body is not None and large:
            held, body = [body], None
            with contextlib.suppress(RuntimeError):  # (the threads stopped: the server is closing)
                self.inference.executor.submit(_take_apart, held)
        self.metrics.request(name, api, status, time.perf_counter() - t0)
        return response

    async def _answered(self, request: web.BaseRequest, api: str, spec, body, started: tuple[int, int],
                        large: bool) -> web.Response:
        """Predict, Classify or Regress (`api`) on the parsed `body`, within --rest_api_timeout_in_ms."""
        client = request.headers.get(self.canary_key) if self.canary_key else None
        work = getattr(self, api)(spec, body, started, client, large)
        if self.deadlines:  # on this task (wait_for would run the work as a task of its own)
            return await self.deadlines.run(work)
        return await work

    async def _body(self, request: web.BaseRequest) -> bytes:
        """The request's body, within the read timeout (no timer when it has all come already);
        _Undecodable when its Content-Encoding does not decode it."""
        try:
            if self.read_timeout <= 0 or request.content.is_eof():
                return await self._read(request)
            try:
                async with asyncio.timeout(self.read_timeout):
                    return await self._read(request)
            except TimeoutError:
                raise _SlowBody from None
        except web.RequestPayloadError:
            request.content.feed_eof()  # nothing more to read of it (aiohttp would try, and log the error)
            raise _Undecodable(request.headers.get("Content-Encoding", "")) from None

    async def _read(self, request: web.BaseRequest) -> bytes:
        """The whole body, as request.read() gives it (413 past --max_request_bytes), but kept as the
        pieces it came in until a large one is joined on a REST thread: read() copies it whole on
        the loop."""
        pieces, size = [], 0
        while piece := await request.content.readany():
            size += len(piece)
            if size > self.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=size)
            pieces.append(piece)
        return await self._off_loop(b"".join, pieces) if size > OFF_LOOP_BYTES else b"".join(pieces)

    async def _off_loop(self, fn, *args):
        """`fn(*args)` on a REST thread: a large body's parsing and decoding, or its answer's
        writing, which would keep the loop (and every other connection's request) waiting for as
        long as they take on it."""
        return await asyncio.get_running_loop().run_in_executor(self.inference.executor, fn, *args)

    async def predict(self, spec, body: dict, started: tuple[int, int], client: str | None = None,
                      large: bool = False) -> web.Response:
        signature_name = _signature_name(body)
        rows = False

        def decode(sig):  # the JSON's numbers are read as the signature's dtypes
            nonlocal rows
            inputs, rows = json_inputs(body, sig.input_dtypes)
            return inputs

        p = await self.inference.predict(spec, signature_name, decode, unknown_signature=_unknown_signature,
                                         client=client, decode_off_loop=large)
        if large or p.large_answer():
            with large_request():
                answer = json_chunks(await self._off_loop(lambda: encoded(json_output_text(p.outputs, rows))))
        else:
            answer = json_response(json_outputs(p.outputs, rows))
        self._log("predict", spec.name, p.servable.version, p.signature.name, started,
                  lambda: predict_protos(spec, signature_name, p.inputs, p.servable.version, p.signature.name,
                                          p.outputs),
                  rest_format="instances" if rows else "inputs")
        return answer

    async def classify(self, spec, body: dict, started: tuple[int, int], client: str | None = None,
                       large: bool = False) -> web.Response:
        signature_name = _signature_name(body)
        servable, sig, examples, classes, scores = await self.inference.classify(
            spec, signature_name, lambda: json_examples(body), client, decode_off_loop=large)

        def answered():  # (the result, its JSON value)
            result = classification_result(classes, scores)
            return result, {"results": [[[c.label, c.score] for c in row.classes] for row in result.classifications]}

        result, answer = await self._answer(answered, large)
        self._log("classify", spec.name, servable.version, sig.name, started,
                  lambda: example_protos("classify", spec, signature_name, examples, servable.version, sig.name,
                                          result))
        return answer

    async def regress(self, spec, body: dict, started: tuple[int, int], client: str | None = None,
                      large: bool = False) -> web.Response:
        signature_name = _signature_name(body)
        servable, sig, examples, values = await self.inference.regress(
            spec, signature_name, lambda: json_examples(body), client, decode_off_loop=large)

        def answered():  # (the result, its JSON value)
            result = regression_result(values)
            return result, {"results": [r.value for r in result.regressions]}

        result, answer = await self._answer(answered, large)
        self._log("regress", spec.name, servable.version, sig.name, started,
                  lambda: example_protos("regress", spec, signature_name, examples, servable.version, sig.name,
                                          result))
        return answer

    async def _answer(self, answer, large: bool) -> tuple[Any, web.Response]:
        """(the result, its JSON answer) from `answer()`'s (result, JSON value): a large one built
        and encoded on a REST thread, in pieces."""
        if not large:
            result, value = answer()
            return result, json_response(value)

        def built():
            result, value = answer()
            return result, encoded(text_in_pieces(value))
        result, chunks = await self._off_loop(built)
        return result, json_chunks(chunks)

    def _log(self, api: str, model: str, version: int, used: str, started: tuple[int, int], build,
             rest_format: str = "") -> None:
        if self.logs is not None:
            self.logs.record(model, version, used, api, "rest", started, build, rest_format)


def _unknown_signature(key: str) -> ServingError:
    """A signature the SavedModel lacks, as TF Serving's JSON decoding words it."""
    return invalid(f'Serving signature name: "{quoted(key)}" not found in signature def')
