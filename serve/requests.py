"""Request and response bodies: TF Serving's protos and its REST JSON, to and from numpy.

The JSON mapping follows TF Serving's REST API: row ("instances") and columnar ("inputs")
predict formats, {"b64": ...} for binary strings, outputs whose name ends in `_bytes` sent
back as {"b64": ...}, NaN/Infinity allowed as numbers.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import input_pb2, predict_pb2

from serve.errors import invalid
from serve.servable import Signature


# TensorProto <-> numpy without tf.make_ndarray / tf.make_tensor_proto, which cost ~25 us
# per tensor: with 17 one-row inputs that was most of a request's time in the server.
_VALUE_FIELDS = {
    types_pb2.DT_FLOAT: ("float_val", np.float32), types_pb2.DT_DOUBLE: ("double_val", np.float64),
    types_pb2.DT_INT32: ("int_val", np.int32), types_pb2.DT_INT16: ("int_val", np.int16),
    types_pb2.DT_INT8: ("int_val", np.int8), types_pb2.DT_UINT8: ("int_val", np.uint8),
    types_pb2.DT_UINT16: ("int_val", np.uint16), types_pb2.DT_INT64: ("int64_val", np.int64),
    types_pb2.DT_BOOL: ("bool_val", np.bool_), types_pb2.DT_UINT32: ("uint32_val", np.uint32),
    types_pb2.DT_UINT64: ("uint64_val", np.uint64),
}
_DTYPES = {np.dtype(t): dt for dt, (_, t) in _VALUE_FIELDS.items()}


def tensor_to_numpy(proto, name: str = "") -> np.ndarray:
    """A TensorProto's value, with TF's rules: tensor_content, or typed values where fewer
    values than elements repeat the last one."""
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    n = 1
    for d in shape:
        if d < 0:
            raise invalid(f"input '{name}': a TensorProto needs a fully defined shape, got {list(shape)}")
        n *= d
    if proto.dtype == types_pb2.DT_STRING:
        values = list(proto.string_val)
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
    elif proto.dtype in _VALUE_FIELDS:
        field, dtype = _VALUE_FIELDS[proto.dtype]
        if proto.tensor_content:
            if len(proto.tensor_content) != n * np.dtype(dtype).itemsize:
                raise invalid(f"input '{name}': tensor_content holds {len(proto.tensor_content)} bytes, "
                              f"shape {list(shape)} needs {n * np.dtype(dtype).itemsize}")
            return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape)
        arr = np.array(getattr(proto, field), dtype=dtype)
    else:
        try:
            return tf.make_ndarray(proto)
        except Exception as e:  # an unsupported or inconsistent TensorProto
            raise invalid(f"input '{name}' is not a valid TensorProto: {e}") from None
    if len(arr) == n:
        return arr.reshape(shape)
    if len(arr) > n:
        raise invalid(f"input '{name}': {len(arr)} values for shape {list(shape)}")
    if len(arr) == 0:
        return np.zeros(shape, dtype=arr.dtype) if arr.dtype != object else np.full(shape, b"", dtype=object)
    return np.concatenate([arr, np.repeat(arr[-1:], n - len(arr))]).reshape(shape)


def predict_inputs(request: predict_pb2.PredictRequest) -> dict[str, np.ndarray]:
    return {name: tensor_to_numpy(proto, name) for name, proto in request.inputs.items()}


def tensor_proto(value: np.ndarray) -> tensor_pb2.TensorProto:
    """Typed value fields, as TF Serving fills its responses (clients read float_val etc.)."""
    proto = tensor_pb2.TensorProto()
    for d in value.shape:
        proto.tensor_shape.dim.add(size=d)
    if value.dtype.kind in "OSU":
        proto.dtype = types_pb2.DT_STRING
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in value.ravel())
        return proto
    dt = _DTYPES.get(value.dtype)
    if dt is None:
        return tf.make_tensor_proto(value)
    proto.dtype = dt
    getattr(proto, _VALUE_FIELDS[dt][0]).extend(value.ravel().tolist())
    return proto


def input_examples(inp: input_pb2.Input) -> list[bytes]:
    """Serialized tf.Examples of a tensorflow.serving.Input; context features merged into each."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        return [e.SerializeToString() for e in inp.example_list.examples]
    if kind == "example_list_with_context":
        ctx = inp.example_list_with_context.context
        out = []
        for e in inp.example_list_with_context.examples:
            merged = example_pb2.Example()
            merged.CopyFrom(ctx)
            merged.MergeFrom(e)
            out.append(merged.SerializeToString())
        return out
    raise invalid("Input is empty.")


# ---- REST JSON -> numpy -------------------------------------------------------------

def _leaf(v: Any, where: str) -> Any:
    if isinstance(v, dict):
        if set(v) == {"b64"} and isinstance(v["b64"], str):
            try:
                return base64.b64decode(v["b64"], validate=True)
            except (binascii.Error, ValueError):
                raise invalid(f"{where}: 'b64' value is not valid base64") from None
        raise invalid(f"{where}: objects are only allowed as {{\"b64\": ...}} binary values")
    if isinstance(v, str):
        return v.encode("utf-8")
    return v


def _array(value: Any, where: str) -> np.ndarray:
    """A JSON value (scalar or nested lists) as a rectangular numpy array."""
    def has_text(v):
        if isinstance(v, list):
            return any(has_text(x) for x in v)
        return isinstance(v, (str, dict))

    def convert(v):
        return [convert(x) for x in v] if isinstance(v, list) else _leaf(v, where)

    if value is None:
        raise invalid(f"{where}: null is not a tensor value")
    if has_text(value):
        nested = convert(value)
        shape = _shape_of(nested, where)
        flat = np.empty(int(np.prod(shape, dtype=np.int64)), dtype=object)
        flat[:] = list(_flatten(nested)) if shape else [nested]
        return flat.reshape(shape)
    try:
        arr = np.asarray(value)
    except ValueError:
        raise invalid(f"{where}: ragged lists; every element along a dimension must have the same shape") from None
    if arr.dtype == object:
        raise invalid(f"{where}: values must be numbers, booleans, strings or lists of them")
    return arr


def _shape_of(v, where: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        return ()
    shapes = {_shape_of(x, where) for x in v}
    if len(shapes) > 1:
        raise invalid(f"{where}: ragged lists; every element along a dimension must have the same shape")
    return (len(v), *(shapes.pop() if shapes else ()))


def _flatten(v):
    for x in v:
        if isinstance(x, list):
            yield from _flatten(x)
        else:
            if isinstance(x, (list, dict)) or x is None:
                raise invalid("null or mixed values inside a string tensor")
            yield x


def json_inputs(body: dict, sig: Signature) -> tuple[dict[str, np.ndarray], bool]:
    """Named numpy inputs from a :predict body, and whether it used the row format."""
    if ("instances" in body) == ("inputs" in body):
        raise invalid("JSON Value: should have one of 'instances' or 'inputs' key, but not both" if "inputs" in body
                      else "Missing 'instances' or 'inputs' key")
    names = list(sig.inputs)
    if "inputs" in body:
        value = body["inputs"]
        if isinstance(value, dict) and not (set(value) == {"b64"}):
            return {k: _array(v, f"input '{k}'") for k, v in value.items()}, False
        if len(names) != 1:
            raise invalid(f"'inputs' must be an object naming each of the signature's inputs {names}")
        return {names[0]: _array(value, f"input '{names[0]}'")}, False
    instances = body["instances"]
    if not isinstance(instances, list):
        raise invalid("'instances' must be a list")
    if not instances:
        raise invalid("'instances' is empty")
    objects = [isinstance(i, dict) and set(i) != {"b64"} for i in instances]
    if all(objects):
        keys = set(instances[0])
        for n, inst in enumerate(instances):
            if set(inst) != keys:
                raise invalid(f"Failed to process element: {n} of 'instances' list. Error: the instances name "
                              f"different inputs ({sorted(set(inst) ^ keys)})")
        return {k: _array([inst[k] for inst in instances], f"input '{k}'") for k in keys}, True
    if any(objects):
        raise invalid("'instances' mixes objects and plain values")
    if len(names) != 1:
        raise invalid(f"the signature has several inputs {names}: each instance must be an object naming them")
    return {names[0]: _array(instances, f"input '{names[0]}'")}, True


def json_examples(body: dict) -> list[bytes]:
    """Serialized tf.Examples from a :classify / :regress body ('examples' plus optional 'context')."""
    examples = body.get("examples")
    if not isinstance(examples, list) or not examples:
        raise invalid("'examples' must be a non-empty list of objects")
    context = body.get("context", {})
    if not isinstance(context, dict):
        raise invalid("'context' must be an object")
    ctx = _example(context, "context")
    out = []
    for n, e in enumerate(examples):
        if not isinstance(e, dict):
            raise invalid(f"examples[{n}] must be an object")
        clash = set(e) & set(context)
        if clash:
            raise invalid(f"examples[{n}]: features {sorted(clash)} also appear in 'context'")
        ex = _example(e, f"examples[{n}]")
        ex.MergeFrom(ctx)
        out.append(ex.SerializeToString())
    return out


def _example(features: dict, where: str) -> example_pb2.Example:
    ex = example_pb2.Example()
    for name, value in features.items():
        values = value if isinstance(value, list) else [value]
        leaves = [_leaf(v, f"{where}.{name}") for v in values]
        f = ex.features.feature[name]
        if all(isinstance(v, bytes) for v in leaves):
            f.bytes_list.value.extend(leaves)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in leaves):
            if any(not -2**63 <= v < 2**63 for v in leaves):
                raise invalid(f"{where}.{name}: integer out of int64 range")
            f.int64_list.value.extend(leaves)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in leaves):
            f.float_list.value.extend(float(v) for v in leaves)
        else:
            raise invalid(f"{where}.{name}: a feature holds numbers or strings, all of one kind")
    return ex


# ---- numpy -> REST JSON -------------------------------------------------------------

def _jsonable(name: str, value: np.ndarray) -> Any:
    if value.dtype.kind in "OSU":
        binary = name.endswith("_bytes")

        def enc(v):
            if isinstance(v, bytes):
                if not binary:
                    try:
                        return v.decode("utf-8")
                    except UnicodeDecodeError:
                        pass
                return {"b64": base64.b64encode(v).decode("ascii")}
            return v

        return np.vectorize(enc, otypes=[object])(value).tolist() if value.size else value.tolist()
    return value.tolist()


def json_outputs(outputs: dict[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    if not row_format:
        if len(outputs) == 1:
            (name, value), = outputs.items()
            return {"outputs": _jsonable(name, value)}
        return {"outputs": {k: _jsonable(k, v) for k, v in outputs.items()}}
    sizes = {v.shape[0] if v.ndim else None for v in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise invalid("Tensor name: outputs do not share a batch (0-th) dimension; use the columnar "
                      "'inputs' format for this signature")
    if len(outputs) == 1:
        (name, value), = outputs.items()
        return {"predictions": _jsonable(name, value)}
    columns = {k: _jsonable(k, v) for k, v in outputs.items()}
    n = sizes.pop()
    return {"predictions": [{k: columns[k][i] for k in columns} for i in range(n)]}


# ---- results shared by gRPC and REST ------------------------------------------------

def classification_result(classes: np.ndarray | None, scores: np.ndarray | None):
    from tensorflow_serving.apis import classification_pb2

    result = classification_pb2.ClassificationResult()
    rows = (classes if classes is not None else scores).shape[0]
    for i in range(rows):
        c = result.classifications.add()
        k = (classes if classes is not None else scores).shape[1]
        for j in range(k):
            cls = c.classes.add()
            if classes is not None:
                label = classes[i, j]
                cls.label = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            if scores is not None:
                cls.score = float(scores[i, j])
    return result


def regression_result(values: np.ndarray):
    from tensorflow_serving.apis import regression_pb2

    result = regression_pb2.RegressionResult()
    for v in values:
        result.regressions.add(value=float(v))
    return result


def model_spec(spec, name: str, version: int, signature_name: str) -> None:
    """Fill a response's ModelSpec the way TF Serving does (the version actually used)."""
    spec.name = name
    spec.version.value = version
    spec.signature_name = signature_name
