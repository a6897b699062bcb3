"""Fuzzing the gRPC API with what a hostile client sends: bytes that are no request (random, cut
short, bit-flipped valid requests), tensors declaring shapes far beyond the values they carry,
dimensions whose product overflows int64, wrong dtypes and ranks, huge model, label and signature
names, missing and unknown inputs; and bytes that are no health check, or name a huge service,
to the health service. Seeded: the same seed sends the same requests.

Every answer must be one of the status codes its kind of request may get (never UNKNOWN or
INTERNAL, never RESOURCE_EXHAUSTED for a name too long to quote), the server's peak RSS must stay
within a bound of where it started, and it must still answer a good request afterwards.

tests/test_serve.py runs a short round in the suite. The long run is this file as a script,
against `tfpipe serve` started in its own process on 127.0.0.1:

    python tests/grpc_fuzz.py --cases 20000 [--seed N] [--model NAME=BASE_PATH ...]
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

PREDICTION = "/tensorflow.serving.PredictionService/"
MODEL = "/tensorflow.serving.ModelService/"
METHODS = [PREDICTION + m for m in ("Predict", "Classify", "Regress", "MultiInference", "GetModelMetadata")] + [
    MODEL + "GetModelStatus"]
RELOAD = MODEL + "HandleReloadConfigRequest"
# the health service (the server must run with --enable_grpc_healthcheck_service); Watch is a stream,
# of which a case reads the first answer
HEALTH_CHECK, HEALTH_WATCH = "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"
HEALTH = [HEALTH_CHECK, HEALTH_WATCH]

REFUSED = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED"})
# what a mutation may turn into a request the server rightly answers (a flipped bit in a value)
REFUSED_OR_OK = REFUSED | {"OK"}
# ... or into a MultiInference task of a method TF Serving does not run (UNIMPLEMENTED, as it answers)
MUTATED = REFUSED_OR_OK | {"UNIMPLEMENTED"}
# a name or label the server must quote, cut, in a status a client can read
NAMED = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"})
# bytes that parse as a HealthCheckRequest name a service, known (OK) or not (Check: NOT_FOUND;
# Watch: OK, its first answer SERVICE_UNKNOWN, as the health protocol says)
HEALTH_ANSWERS = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "OK"})
SHAPES = frozenset({"INVALID_ARGUMENT"})
KINDS = ("random_bytes", "truncated", "bit_flipped", "oversized_shape", "overflowing_dims", "inconsistent_values",
         "wrong_dtype", "wrong_rank", "huge_name", "missing_input")
# the largest fill TF Serving's rule may make here (tfpipe.serve.codecs.tensor_proto.MAX_FILL_ELEMENTS),
# for shapes beyond it
FILL_LIMIT = 1 << 20


@dataclass
class Signature:
    """A model's serving_default inputs: name -> (DataType number, dims with -1 for any size, or
    None for a shape of unknown rank)."""
    model: str
    inputs: dict[str, tuple[int, list[int] | None]]


@dataclass
class Case:
    kind: str
    method: str
    payload: bytes
    allowed: frozenset[str]


@dataclass
class Result:
    counts: Counter = field(default_factory=Counter)  # (kind, code) -> requests
    methods: Counter = field(default_factory=Counter)  # method name -> requests
    encodings: Counter = field(default_factory=Counter)  # grpc.Compression name -> requests
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_code(self) -> Counter:
        out: Counter = Counter()
        for (_, code), n in self.counts.items():
            out[code] += n
        return out


def signatures(channel, models: list[str]) -> list[Signature]:
    """Each model's serving_default inputs, read with GetModelMetadata as any client would."""
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    out = []
    for name in models:
        req = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        req.model_spec.name = name
        sig_map = get_model_metadata_pb2.SignatureDefMap()
        stub.GetModelMetadata(req, timeout=30).metadata["signature_def"].Unpack(sig_map)
        sig = sig_map.signature_def["serving_default"]
        out.append(Signature(name, {k: (v.dtype, None if v.tensor_shape.unknown_rank
                                        else [d.size for d in v.tensor_shape.dim])
                                    for k, v in sig.inputs.items()}))
    return out


def _value_field(dtype: int) -> tuple[str, object]:
    from tensorflow.core.framework import types_pb2 as t

    return {t.DT_FLOAT: ("float_val", 1.0), t.DT_DOUBLE: ("double_val", 1.0), t.DT_INT32: ("int_val", 1),
            t.DT_INT64: ("int64_val", 1), t.DT_BOOL: ("bool_val", True), t.DT_STRING: ("string_val", b"a"),
            t.DT_HALF: ("half_val", 15360), t.DT_INT8: ("int_val", 1), t.DT_UINT8: ("int_val", 1),
            t.DT_INT16: ("int_val", 1), t.DT_UINT16: ("int_val", 1), t.DT_UINT32: ("uint32_val", 1),
            t.DT_UINT64: ("uint64_val", 1)}.get(dtype, ("float_val", 1.0))


def _fill_tensor(proto, dtype: int, dims: list[int], values: int) -> None:
    proto.Clear()
    proto.dtype = dtype
    for d in dims:
        proto.tensor_shape.dim.add(size=d)
    name, value = _value_field(dtype)
    getattr(proto, name).extend([value] * values)


def good_predict(sig: Signature):
    """A Predict of one row that the model answers: each input of its own dtype, every unknown
    dimension 1."""
    from tensorflow_serving.apis import predict_pb2

    req = predict_pb2.PredictRequest()
    req.model_spec.name = sig.model
    for name, (dtype, dims) in sig.inputs.items():
        shape = [1] if dims is None else [1 if d < 0 else d for d in dims]
        n = 1
        for d in shape:
            n *= d
        _fill_tensor(req.inputs[name], dtype, shape, n)
    return req


def _example(sig: Signature):
    from tensorflow.core.example import example_pb2
    from tensorflow.core.framework import types_pb2 as t

    ex = example_pb2.Example()
    for name, (dtype, _) in sig.inputs.items():
        f = ex.features.feature[name]
        if dtype == t.DT_STRING:
            f.bytes_list.value.append(b"a")
        elif dtype in (t.DT_FLOAT, t.DT_DOUBLE, t.DT_HALF):
            f.float_list.value.append(1.0)
        else:
            f.int64_list.value.append(1)
    return ex


def valid_requests(sig: Signature) -> list[tuple[str, bytes]]:
    """(method, serialized request) of every method on this model, for the mutations to start from."""
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        regression_pb2,
    )

    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = sig.model
    classify.input.example_list.examples.add().CopyFrom(_example(sig))
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name = sig.model
    regress.input.CopyFrom(classify.input)
    multi = inference_pb2.MultiInferenceRequest()
    task = multi.tasks.add()
    task.model_spec.name = sig.model
    task.method_name = "tensorflow/serving/classify"
    multi.input.CopyFrom(classify.input)
    meta = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    meta.model_spec.name = sig.model
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = sig.model
    return [(METHODS[0], good_predict(sig).SerializeToString()), (METHODS[1], classify.SerializeToString()),
            (METHODS[2], regress.SerializeToString()), (METHODS[3], multi.SerializeToString()),
            (METHODS[4], meta.SerializeToString()), (METHODS[5], status.SerializeToString())]


def health_requests() -> list[tuple[str, bytes]]:
    """(method, serialized request) of the health service's two methods, for a service it knows."""
    from grpc_health.v1 import health_pb2

    raw = health_pb2.HealthCheckRequest(service="PredictionService").SerializeToString()
    return [(HEALTH_CHECK, raw), (HEALTH_WATCH, raw)]


def _huge_dims(rng: random.Random, rank: int) -> list[int]:
    """Dimensions of a tensor far beyond what a request carries."""
    if rank == 1:
        return [rng.choice([FILL_LIMIT + 1, 250_000_000, 10**12, rng.randrange(FILL_LIMIT + 1, 2**40)])]
    return [rng.choice([1, 2, 1000, rng.randrange(1100, 2**16)]) for _ in range(rank - 1)] + [
        rng.randrange(FILL_LIMIT + 1, 2**31)]


def _overflowing_dims(rng: random.Random) -> list[int]:
    big = rng.choice([2**32, 2**40, 2**62, 2**63 - 1, rng.randrange(2**31, 2**63)])
    return rng.choice([
        [big, big], [2**63 - 1, 2], [2**20] * rng.randrange(4, 10), [0, big, big], [big, 3, big],
        [-1], [1, -2**63], [-rng.randrange(1, 2**63)], [big] * rng.randrange(2, 64)])


def _text(rng: random.Random, n: int) -> str:
    alphabet = rng.choice(["x", "abcdefghijklmnopqrstuvwxyz/:%\"'\\\n", "\u00e9\u4e2d\U0001f600\u200b"])
    chunk = "".join(rng.choice(alphabet) for _ in range(min(n, 256)))
    return (chunk * (n // len(chunk) + 1))[:n]


def make_case(rng: random.Random, sigs: list[Signature], max_name: int) -> Case:
    """One hostile request, of a kind drawn evenly from KINDS."""
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import predict_pb2

    kind = rng.choice(KINDS)
    sig = rng.choice(sigs)
    if kind == "random_bytes":
        method = rng.choice(METHODS + [RELOAD] + HEALTH)
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 2000)))
        if method == RELOAD:  # a tag of field 0 never parses: a decoded reload could change the model set
            return Case(kind, method, b"\x00" + raw, frozenset({"INVALID_ARGUMENT"}))
        return Case(kind, method, raw, HEALTH_ANSWERS if method in HEALTH else REFUSED)
    if kind in ("truncated", "bit_flipped"):
        method, raw = rng.choice(valid_requests(sig) + health_requests())
        raw = bytearray(raw)
        if kind == "truncated":
            raw = raw[:rng.randrange(1, len(raw))]
        else:
            for _ in range(rng.randrange(1, 9)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return Case(kind, method, bytes(raw), HEALTH_ANSWERS if method in HEALTH else MUTATED)
    if kind == "huge_name":
        method, raw = rng.choice(valid_requests(sig) + health_requests())
        name = _text(rng, rng.randrange(1000, max_name + 1))
        if method in HEALTH:
            from grpc_health.v1 import health_pb2

            # an unknown service: Check quotes it, cut, in NOT_FOUND; Watch answers SERVICE_UNKNOWN
            return Case(kind, method, health_pb2.HealthCheckRequest(service=name).SerializeToString(),
                        frozenset({"NOT_FOUND"}) if method == HEALTH_CHECK else frozenset({"OK"}))
        request = _request_type(method).FromString(raw)
        spec = request.tasks[0].model_spec if method.endswith("MultiInference") else request.model_spec
        # status and metadata read no signature name
        where = rng.choice(["name", "name", "label"] + (["signature"] if method in METHODS[:4] else []))
        if where == "name":
            spec.name = name
        elif where == "label":
            spec.version_label = name
        else:
            spec.signature_name = name
        return Case(kind, method, request.SerializeToString(), NAMED)
    req = good_predict(sig)
    name = rng.choice(sorted(req.inputs))
    proto = req.inputs[name]
    dtype, dims = sig.inputs[name]
    if kind == "oversized_shape":
        _fill_tensor(proto, dtype, _huge_dims(rng, rng.randrange(1, 4)), rng.choice([0, 1, 1, 3]))
        allowed = SHAPES
    elif kind == "overflowing_dims":
        _fill_tensor(proto, dtype, _overflowing_dims(rng), rng.choice([0, 1]))
        allowed = SHAPES
    elif kind == "inconsistent_values":
        shape = [rng.randrange(1, 5)]
        if rng.random() < 0.5:  # more values than elements
            _fill_tensor(proto, dtype, shape, shape[0] + rng.randrange(1, 100))
        else:  # tensor_content of the wrong size, or none at all for a big shape
            _fill_tensor(proto, dtype if dtype != types_pb2.DT_STRING else types_pb2.DT_FLOAT,
                         [rng.randrange(FILL_LIMIT + 1, 2**40)], 0)
            proto.tensor_content = bytes(rng.randrange(0, 64))
        allowed = SHAPES
    elif kind == "wrong_dtype":
        others = [d for d in types_pb2.DataType.values() if d != dtype] + [rng.randrange(-5, 2**31)]
        new = rng.choice(others)
        proto.dtype = new
        if rng.random() < 0.3:
            field_name = rng.choice(["float_val", "double_val", "int_val", "int64_val", "string_val", "bool_val",
                                     "half_val", "scomplex_val", "dcomplex_val", "uint32_val", "uint64_val"])
            _set_values(proto, field_name, rng)
        if rng.random() < 0.2:
            proto.tensor_content = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 3, 4, 8, 16, 17])))
        allowed = REFUSED_OR_OK  # a lossless conversion (int32 values for a float input) answers
    elif kind == "wrong_rank":
        rank = rng.choice([0, 2, 3, 9, 40, 64, 65, 80, rng.randrange(0, 100)])
        _fill_tensor(proto, dtype, [1] * rank, 1)
        most = 64 if dims is None else len(dims) + 1  # the server's rule: one dimension more than the signature's
        allowed = SHAPES if rank > most else REFUSED_OR_OK
    else:  # missing_input
        for gone in rng.sample(sorted(req.inputs), rng.randrange(1, len(req.inputs) + 1)):
            del req.inputs[gone]
        if rng.random() < 0.5:
            _fill_tensor(req.inputs[_text(rng, rng.randrange(1, 5000))], types_pb2.DT_FLOAT, [1], 1)
        allowed = SHAPES
    assert isinstance(req, predict_pb2.PredictRequest)
    return Case(kind, METHODS[0], req.SerializeToString(), allowed)


def _set_values(proto, field_name: str, rng: random.Random) -> None:
    n = rng.randrange(0, 5)
    values = {"float_val": lambda: rng.uniform(-1e6, 1e6), "double_val": lambda: rng.uniform(-1e6, 1e6),
              "int_val": lambda: rng.randrange(-2**31, 2**31), "int64_val": lambda: rng.randrange(-2**63, 2**63),
              "string_val": lambda: rng.randbytes(rng.randrange(0, 8)), "bool_val": lambda: rng.random() < 0.5,
              "half_val": lambda: rng.randrange(0, 2**16), "scomplex_val": lambda: rng.uniform(-1, 1),
              "dcomplex_val": lambda: rng.uniform(-1, 1), "uint32_val": lambda: rng.randrange(0, 2**32),
              "uint64_val": lambda: rng.randrange(0, 2**64)}[field_name]
    getattr(proto, field_name).extend([values() for _ in range(n)])


def _request_type(method: str):
    from tensorflow_serving.apis import (
        classification_pb2,
        get_model_metadata_pb2,
        get_model_status_pb2,
        inference_pb2,
        predict_pb2,
        regression_pb2,
    )

    return {"Predict": predict_pb2.PredictRequest, "Classify": classification_pb2.ClassificationRequest,
            "Regress": regression_pb2.RegressionRequest, "MultiInference": inference_pb2.MultiInferenceRequest,
            "GetModelMetadata": get_model_metadata_pb2.GetModelMetadataRequest,
            "GetModelStatus": get_model_status_pb2.GetModelStatusRequest}[method.rsplit("/", 1)[1]]


def channel(target: str):
    """A client channel with grpcio's default limits on what it receives (so a status message too
    large for its metadata shows as the RESOURCE_EXHAUSTED a real client would get); no limit on
    what it sends."""
    import grpc

    return grpc.insecure_channel(target, options=[("grpc.max_send_message_length", -1)])


def run(target: str, sigs: list[Signature], cases: int, seed: int, max_name: int = 1 << 20,
        progress=None, max_request_bytes: int | None = None) -> Result:
    """Send `cases` hostile requests to the server at `target`; count the answers by kind and code,
    and keep a line for each answer its case does not allow. A request over `max_request_bytes` (the
    server's --max_request_bytes) may only get RESOURCE_EXHAUSTED. Each case goes plain or
    compressed, with each of grpc's encodings in turn (a compressed case must get what the plain one
    may: the server inflates it)."""
    import grpc

    rng = random.Random(seed)
    encodings = (grpc.Compression.NoCompression, grpc.Compression.Gzip, grpc.Compression.Deflate)
    result = Result()
    started = time.monotonic()
    with channel(target) as ch:
        calls = {}
        for i in range(cases):
            case = make_case(rng, sigs, max_name)
            call = calls.get(case.method) or calls.setdefault(case.method, (
                ch.unary_stream if case.method == HEALTH_WATCH else ch.unary_unary)(
                    case.method, request_serializer=None, response_deserializer=None))
            try:
                encoding = encodings[i % len(encodings)]
                if case.method == HEALTH_WATCH:  # its first answer, then the stream is left
                    stream = call(case.payload, timeout=60, compression=encoding)
                    next(stream)
                    stream.cancel()
                else:
                    call(case.payload, timeout=60, compression=encoding)
                code, details = "OK", ""
            except grpc.RpcError as e:
                code, details = e.code().name, e.details() or ""
            result.counts[(case.kind, code)] += 1
            result.methods[case.method.rsplit("/", 1)[1]] += 1
            result.encodings[encoding.name] += 1
            over = max_request_bytes is not None and len(case.payload) > max_request_bytes
            if code not in (frozenset({"RESOURCE_EXHAUSTED"}) if over else case.allowed):
                result.failures.append(f"{case.kind} {case.method.rsplit('/', 1)[1]} ({len(case.payload)} bytes, "
                                       f"{encoding.name}): "
                                       f"{code} {details[:300]!r}")
            if progress is not None and (i + 1) % 2000 == 0:
                progress(i + 1, result, time.monotonic() - started)
    result.seconds = time.monotonic() - started
    return result


def answers_good_requests(target: str, sigs: list[Signature]) -> bool:
    """Whether every model still answers a valid Predict."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with channel(target) as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        return all(len(stub.Predict(good_predict(s), timeout=30).outputs) > 0 for s in sigs)


# ---- the server's memory, read from /proc (Linux) -------------------------------------------------

def rss_bytes(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def reset_peak_rss(pid: int) -> None:
    """Start the process's peak RSS (VmHWM) again from its current RSS (Linux 4.0+)."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


# ---- the long run ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import queue
    import re
    import subprocess
    import sys
    import tempfile
    import threading

    parser = argparse.ArgumentParser(description="Fuzz tfpipe serve's gRPC API on 127.0.0.1 with hostile requests: "
                                     "counts answers by kind and code; exits 1 on an answer a case does not allow, "
                                     "a peak RSS over --max-rss-growth-mb, or a server that stops answering")
    parser.add_argument("--cases", type=int, default=20000, help="requests to send (default 20000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-name", type=int, default=1 << 20, help="longest model name sent, in characters")
    parser.add_argument("--max-rss-growth-mb", type=float, default=100.0)
    parser.add_argument("--model", action="append", default=[], metavar="NAME=BASE_PATH",
                        help="serve this model too (e.g. penguins=runs/penguins/export/models/penguins)")
    args = parser.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    root = tempfile.mkdtemp(prefix="grpc-fuzz-")
    # the models are built in a child, so that this process stays a plain client
    subprocess.run([sys.executable, "-c", "import sys; from serving_models import save_half, save_multi; "
                    "save_half(sys.argv[1]); save_multi(sys.argv[2])",
                    os.path.join(root, "half", "1"), os.path.join(root, "multi", "1")],
                   check=True, cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True)
    models = {"half": os.path.join(root, "half"), "multi": os.path.join(root, "multi")}
    models.update(m.split("=", 1) for m in args.model)
    with open(os.path.join(root, "models.config"), "w") as f:
        f.write("model_config_list {" + "".join(
            f' config {{ name: "{n}" base_path: "{os.path.abspath(p)}" model_platform: "tensorflow" }}'
            for n, p in models.items()) + " }")
    proc = subprocess.Popen([sys.executable, "-m", "tfpipe.cli", "serve", "--host=127.0.0.1", "--port=-1",
                             "--rest_api_port=0", "--workers=1", "--enable_grpc_healthcheck_service",
                             f"--model_config_file={root}/models.config",
                             "--file_system_poll_wait_seconds=0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    port = None
    while port is None:
        line = lines.get(timeout=300)
        m = re.search(r"gRPC ModelServer at [\d.]+:(\d+)", line)
        port = int(m[1]) if m else None
    target = f"127.0.0.1:{port}"
    try:
        with channel(target) as ch:
            sigs = signatures(ch, sorted(models))
        answers_good_requests(target, sigs)
        start = rss_bytes(proc.pid)
        reset_peak_rss(proc.pid)

        def progress(done, result, seconds):
            print(f"  {done:,} cases, {seconds:.0f}s: {dict(sorted(result.by_code().items()))}", flush=True)

        result = run(target, sigs, args.cases, args.seed, args.max_name, progress)
        peak = rss_bytes(proc.pid, "VmHWM")
        alive = answers_good_requests(target, sigs)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    growth = (peak - start) / 2**20
    print(f"{result.total:,} cases (seed {args.seed}, models {', '.join(sorted(models))}) in {result.seconds:.0f}s: "
          + ", ".join(f"{c}: {n:,}" for c, n in sorted(result.by_code().items())))
    for kind in KINDS:
        print(f"  {kind}: " + ", ".join(f"{c} {n:,}" for (k, c), n in sorted(result.counts.items()) if k == kind))
    print("by method: " + ", ".join(f"{m} {n:,}" for m, n in sorted(result.methods.items())))
    print("by encoding: " + ", ".join(f"{m} {n:,}" for m, n in sorted(result.encodings.items())))
    print(f"answers a case does not allow: {len(result.failures)}; server RSS {start / 2**20:.0f} MB at the start, "
          f"peak {peak / 2**20:.0f} MB (+{growth:.0f} MB); a good request afterwards answered: {alive}")
    for f in result.failures[:20]:
        print("  " + f)
    return 0 if not result.failures and alive and growth <= args.max_rss_growth_mb else 1


if __name__ == "__main__":
    raise SystemExit(main())
