"""Fuzzing the REST API's JSON-to-tensor path: hypothesis strategies for request bodies that a
client could send (deep nesting, huge and ragged arrays, mixed types, bad UTF-8, b64 objects
right and wrong, numbers beyond every dtype), used two ways:

- in process, on the functions that turn a body into tensors or tf.Examples (parse_json,
  json_inputs, json_examples): anything they raise other than a ServingError (a 4xx) is a bug;
- over HTTP against a running `tfpipe serve`: every answer must be under 500, and the server
  must still answer a good request afterwards.

tests/test_rest_fuzz.py runs a short round of each in the suite. The long run is this file as a
script, against a server it starts on loopback:

    python tests/rest_fuzz.py --requests 20000 [--seed N]
"""

from __future__ import annotations

import json
import random
import string

from hypothesis import strategies as st

# ---- JSON values ------------------------------------------------------------------------------

INT_EDGES = [0, 1, -1, 2**31 - 1, -2**31, 2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**63, 2**64, -2**64 - 1, 10**40]
FLOAT_EDGES = [0.0, -0.0, 0.5, 1e-310, 1e38, 3.5e38, -3.5e38, 1.7e308, float("inf"), float("-inf"), float("nan")]
B64_TEXT = ["", "AAEC", "AAE=", "AA==", "A", "====", "!!!!", "AAEC\n", "YWJj", "YWJjZA", "\u00e9"]

leaves = st.one_of(
    st.none(), st.booleans(), st.sampled_from(INT_EDGES), st.integers(-2**70, 2**70),
    st.sampled_from(FLOAT_EDGES), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20), st.text(alphabet=string.ascii_letters, max_size=5),
    st.builds(lambda t: {"b64": t}, st.sampled_from(B64_TEXT) | st.text(max_size=8)),
    st.builds(lambda t: {"b64": t}, st.integers()),
)


def _nest(value, depth: int, as_dict: bool = False):
    for _ in range(depth):
        value = {"x": value} if as_dict else [value]
    return value


json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=6)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=5), max_leaves=40)
deep = st.builds(_nest, leaves, st.integers(60, 70) | st.integers(90, 120) | st.integers(950, 1100)
                 | st.sampled_from([5_000, 50_000]), st.booleans())
rectangular = st.builds(lambda rows, cols, v: [[v] * cols for _ in range(rows)], st.integers(0, 300),
                        st.integers(0, 40), leaves)
ragged = st.lists(st.lists(st.floats(allow_nan=False, width=32), max_size=4), min_size=2, max_size=6)
values = st.one_of(json_values, deep, rectangular, ragged)

# ---- bodies -------------------------------------------------------------------------------------

names = st.sampled_from(["x", "y", "inputs", "species", "island", "bill_length_mm", "body_mass_g", ""]) | st.text(
    max_size=6)
rows = st.lists(st.dictionaries(names, values, max_size=4) | values, max_size=5)
bodies = st.one_of(
    st.builds(lambda v: {"instances": v}, values | rows),
    st.builds(lambda v: {"inputs": v}, values | st.dictionaries(names, values, max_size=4)),
    st.builds(lambda v, s: {"signature_name": s, "instances": v}, values | rows,
              st.sampled_from(["serving_default", "classification", "regression", "predict_examples"])
              | st.text(max_size=8) | st.integers()),
    st.builds(lambda e, c: {"examples": e, "context": c}, st.lists(st.dictionaries(names, values, max_size=4)
                                                                   | values, max_size=5),
              st.dictionaries(names, values, max_size=3) | values),
    st.builds(lambda e: {"examples": e}, st.lists(st.dictionaries(names, values, max_size=4), max_size=5)),
    st.builds(lambda v, i: {"instances": v, "inputs": i}, values, values),
    st.dictionaries(st.text(max_size=10), values, max_size=4),
    values,
)


def encode(body, mutation: int, rng: random.Random) -> bytes:
    """A body as bytes, sometimes broken on the way: bad UTF-8, cut short, bare NaN, junk after."""
    try:
        text = json.dumps(body, allow_nan=True)
    except (RecursionError, ValueError):  # deeper than json.dumps goes: write it by hand
        text = _deep_text(body)
    raw = text.encode("utf-8", "surrogatepass")
    if mutation == 1 and raw:
        at = rng.randrange(len(raw))
        raw = raw[:at] + bytes([rng.choice([0x80, 0xC3, 0xED, 0xF5, 0xFF])]) + raw[at:]
    elif mutation == 2 and raw:
        raw = raw[:rng.randrange(len(raw))]
    elif mutation == 3:
        raw = raw + b" trailing junk {"
    elif mutation == 4:
        raw = raw.replace(b"0", b"NaN", 1)
    return raw


def _deep_text(body) -> str:
    opens = []
    while isinstance(body, (list, dict)) and body:
        if isinstance(body, list):
            opens.append(("[", "]"))
            body = body[0]
        else:
            key = next(iter(body))
            opens.append(("{" + json.dumps(key) + ":", "}"))
            body = body[key]
    leaf = json.dumps(body, allow_nan=True) if not isinstance(body, (list, dict)) else json.dumps(body)
    return "".join(o for o, _ in opens) + leaf + "".join(c for _, c in reversed(opens))


requests_ = st.tuples(bodies, st.integers(0, 8), st.randoms(use_true_random=False))


# ---- the long run ---------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import argparse
    import os
    import sys
    import tempfile
    import time
    from collections import Counter

    import warnings

    import requests as http
    import hypothesis
    from hypothesis import HealthCheck, given, settings

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from serving_models import save_half, save_multi

    from tfpipe.serve.flags import ServeOptions
    from tfpipe.serve.server import ServerThread

    parser = argparse.ArgumentParser(description="Fuzz tfpipe serve's REST API over HTTP on 127.0.0.1: "
                                     "counts answers by status; exits 1 on any 5xx or a server that stops answering")
    parser.add_argument("--requests", type=int, default=20000, help="requests to send (default 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", hypothesis.errors.HypothesisWarning)

    root = tempfile.mkdtemp(prefix="rest-fuzz-")
    save_half(os.path.join(root, "half", "1"))
    save_multi(os.path.join(root, "multi", "1"))
    with open(os.path.join(root, "models.config"), "w") as f:
        f.write("model_config_list {" + "".join(
            f' config {{ name: "{n}" base_path: "{os.path.join(root, n)}" model_platform: "tensorflow" }}'
            for n in ("half", "multi")) + " }")
    opts = ServeOptions(host="127.0.0.1", port=-1, rest_api_port=-1,
                        model_config_file=os.path.join(root, "models.config"), file_system_poll_wait_seconds=0,
                        max_request_bytes=1024 * 1024)
    paths = ["/v1/models/half:predict", "/v1/models/multi:predict", "/v1/models/half:regress",
             "/v1/models/half:classify", "/v1/models/multi:classify"]
    statuses: Counter = Counter()
    failures: list[str] = []
    started = time.monotonic()
    with ServerThread(opts) as server:
        url = f"http://127.0.0.1:{server.rest_port}"
        session = http.Session()

        @settings(max_examples=args.requests, deadline=None, database=None, derandomize=False,
                  suppress_health_check=list(HealthCheck))
        @given(requests_)
        def send(request):
            body, mutation, rng = request
            r = session.post(url + rng.choice(paths), data=encode(body, mutation, rng), timeout=60)
            statuses[r.status_code] += 1
            if r.status_code >= 500:
                failures.append(f"{r.status_code} {r.text[:300]}")
            done = sum(statuses.values())
            if done % 2000 == 0:
                print(f"  {done:,} requests, {time.monotonic() - started:.0f}s: {dict(sorted(statuses.items()))}",
                      flush=True)

        hypothesis.seed(args.seed)(send)()
        alive = session.post(url + "/v1/models/half:predict", data='{"instances": [2.0]}', timeout=30)
    total = sum(statuses.values())
    print(f"{total:,} requests in {time.monotonic() - started:.0f}s: " + ", ".join(
        f"{s}: {n:,}" for s, n in sorted(statuses.items())))
    print(f"5xx: {len(failures)}; the server answered a good request afterwards: "
          f"{alive.status_code == 200 and alive.json() == {'predictions': [3.0]}}")
    for f in failures[:10]:
        print("  " + f)
    return 0 if not failures and alive.status_code == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
