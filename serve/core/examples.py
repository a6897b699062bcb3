"""Classify and Regress, TF Serving's rules for them: the examples run through the signature
(`run_examples`, with a number sent as the other numeric list than the model parses sent again as
the one it parses), and the outputs checked as TF Serving checks them
(`classification_outputs`, `regression_outputs`)."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Coroutine

import numpy as np
from google.protobuf.message import DecodeError
from tensorflow.core.example import example_pb2

from tfpipe.serve.errors import ServingError, invalid


async def run_examples(serialized: list[bytes], check: Callable[[dict], dict], run: Callable[[dict], Awaitable[dict]],
                       off_loop: Callable[..., Awaitable] | None = None) -> dict[str, np.ndarray]:
    """A classification or regression signature on the examples: `check(inputs)` the signature's
    check of `{"inputs": the serialized examples}`, `await run(checked)` its call; `off_loop(fn,
    *args)`, when given, reads the examples there (a large request's: not on the event loop). A
    number sent as the other numeric list is that number (as :predict takes either): where the
    model's ParseExample refuses a feature's int64_list for a float, or a float_list of whole numbers
    for an int64, that feature's values are sent again as the list it parses, key by key. (TF
    Serving refuses the request; REST's JSON makes an int64_list of `48` and a float_list of `48.0`.)"""
    async def read(fn, *args):
        return fn(*args) if off_loop is None else await off_loop(fn, *args)

    if not serialized:
        raise invalid("Input is empty.")
    converted: set[str] = set()
    while True:
        try:
            return await run(await read(_checked, check, serialized))
        except ServingError as e:
            found = _NUMBER_KIND.search(e.message)
            if found is None or found["key"] in converted:
                raise
            converted.add(found["key"])
            fixed = await read(as_numbers, serialized, found["key"], found["want"] or found["want2"])
            if fixed is None:  # a value with a fraction for an int64: the model's refusal stands
                raise
            serialized = fixed


def _checked(check: Callable[[dict], dict], serialized: list[bytes]) -> dict:
    value = np.empty(len(serialized), dtype=object)
    value[:] = serialized
    return check({"inputs": value})


def finished(call: Coroutine):
    """The value of a coroutine that never waits: a Classify or Regress of Servable's own (its model
    called on the caller's thread), for code on a thread with no event loop (warmup, the shadow, the
    canary's agreement)."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value
    call.close()
    raise RuntimeError("the call waited for something: it needs an event loop")


def classification_outputs(out: dict[str, np.ndarray], examples: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A classification signature's classes and scores, checked as TF Serving checks them."""
    classes, scores = out.get("classes"), out.get("scores")
    for name, value, dtype in (("classes", classes, "DT_STRING"), ("scores", scores, "DT_FLOAT")):
        if value is None:
            continue
        if value.ndim != 2:
            raise invalid(f"Expected Tensor shape: [batch_size num_classes] but got {list(value.shape)}")
        if (dtype == "DT_STRING") != (value.dtype.kind in "OSU") or (dtype == "DT_FLOAT" and value.dtype != np.float32):
            raise invalid(f"Expected {name} Tensor of {dtype}. Got: {value.dtype.name}")
        if value.shape[0] != examples:
            raise invalid(f"Expected {name} output batch size of {examples}. Got: {value.shape[0]}")
    if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
        raise invalid(f"Tensors class and score should match in dim_size(1). Got {classes.shape[1]} vs. "
                      f"{scores.shape[1]}")
    return classes, scores


def regression_outputs(out: dict[str, np.ndarray], examples: int) -> np.ndarray:
    values = out["outputs"]
    if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
        raise invalid(f"Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got "
                      f"{list(values.shape)}")
    if values.shape[0] != examples:
        raise invalid(f"Input batch size did not match output batch size: {examples} vs. {values.shape[0]}")
    if values.dtype != np.float32:
        raise invalid(f"Expected output Tensor of DT_FLOAT.  Got: {values.dtype.name}")
    return values.reshape(examples)


# ParseExample's refusal of one numeric list where the model parses the other, in its two wordings (a
# fixed-length feature's and a ragged one's): the feature's name and the list the model parses
_NUMBER_KIND = re.compile(r"Key: (?P<key>.+?), Index: \d+\.\s+Data types don't match\. (?:Data type: (?:int64|float) "
                          r"but expected type: (?P<want>float|int64)|Expected type: (?P<want2>float|int64), "
                          r"Actual type: (?:int64|float))")


def as_numbers(serialized: list[bytes], key: str, want: str) -> list[bytes] | None:
    """The examples with feature `key`'s numbers in a float_list (`want` "float") or an int64_list
    ("int64"); None when a float with a fraction (or beyond int64) would have to become an int, or
    a string is not an Example."""
    out = []
    for raw in serialized:
        try:
            ex = example_pb2.Example.FromString(raw)
        except DecodeError:  # not an Example at all: the model's refusal stands
            return None
        feature = ex.features.feature.get(key)
        kind = None if feature is None else feature.WhichOneof("kind")
        if want == "float" and kind == "int64_list":
            values = list(feature.int64_list.value)
            feature.float_list.value[:] = values  # the kind is a oneof: setting floats clears the ints
            raw = ex.SerializeToString()
        elif want == "int64" and kind == "float_list":
            values = list(feature.float_list.value)
            if not all(math.isfinite(v) and v.is_integer() and -2**63 <= v < 2**63 for v in values):
                return None
            feature.int64_list.value[:] = [int(v) for v in values]
            raw = ex.SerializeToString()
        out.append(raw)
    return out
