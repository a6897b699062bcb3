"""TensorProto and the other protos of TF Serving's gRPC API, to and from numpy: a Predict's
inputs (with the bounds on what a request may ask the server to fill in, below), tf.Example
inputs of Classify and Regress, output tensors, and the results and model specs both APIs
answer with."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import input_pb2, predict_pb2

from tfpipe.serve.errors import invalid, quoted


# TensorProto <-> numpy without tf.make_ndarray / tf.make_tensor_proto, whose cost per tensor is
# paid once per input: with many one-row inputs it was most of a request's time in the server.
_VALUE_FIELDS = {
    types_pb2.DT_FLOAT: ("float_val", np.float32), types_pb2.DT_DOUBLE: ("double_val", np.float64),
    types_pb2.DT_INT32: ("int_val", np.int32), types_pb2.DT_INT16: ("int_val", np.int16),
    types_pb2.DT_INT8: ("int_val", np.int8), types_pb2.DT_UINT8: ("int_val", np.uint8),
    types_pb2.DT_UINT16: ("int_val", np.uint16), types_pb2.DT_INT64: ("int64_val", np.int64),
    types_pb2.DT_BOOL: ("bool_val", np.bool_), types_pb2.DT_UINT32: ("uint32_val", np.uint32),
    types_pb2.DT_UINT64: ("uint64_val", np.uint64),
}
_DTYPES = {np.dtype(t): dt for dt, (_, t) in _VALUE_FIELDS.items()}


# What a TensorProto may ask the server to fill in: TensorFlow repeats a tensor's last value (or
# zeros, given none) over the elements the request does not carry, so a request of a few hundred
# bytes could declare a shape of billions of elements and have them allocated. The fill is taken
# up to these bounds only, for all of a request's tensors together; a tensor is otherwise built
# only from the values the request carries (docs/serve.md states them).
MAX_FILL_ELEMENTS = 1 << 20
MAX_FILL_STRING_BYTES = 16 << 20  # a string tensor filled: its text in all
MAX_TENSOR_RANK = 64  # numpy's limit on dimensions (TensorFlow's is 254)
_MAX_ENTRIES = (2**63 - 1) // 16  # elements numpy can lay out at 16 bytes each (complex128), zeros left out
# the typed fields make_ndarray reads, for the dtypes read by it rather than below; a complex takes two values
_PAIRED_FIELDS = ("scomplex_val", "dcomplex_val")
_OTHER_FIELDS = ("half_val", "float_val", "double_val", "int_val", "string_val", "int64_val", "bool_val",
                 "uint32_val", "uint64_val", "float8_val", "resource_handle_val", "variant_val")


def tensor_shape(proto, name: str = "") -> tuple[tuple[int, ...], int]:
    """A TensorProto's shape and element count, checked before anything is allocated: a fully
    defined shape of at most MAX_TENSOR_RANK dimensions whose sizes multiply (zeros left out)
    to no more than numpy can lay out; Python's integers do not overflow."""
    dims = proto.tensor_shape.dim
    if len(dims) > MAX_TENSOR_RANK:
        raise invalid(f"input '{quoted(name)}' has {len(dims)} dimensions: a tensor here has at most "
                      f"{MAX_TENSOR_RANK}")
    shape = tuple(d.size for d in dims)
    entries = 1
    for d in shape:
        if d < 0:
            raise invalid(f"input '{quoted(name)}': a TensorProto needs a fully defined shape, got {list(shape)}")
        if d:
            entries *= d
    if entries > _MAX_ENTRIES:
        raise invalid(f"input '{quoted(name)}': shape {list(shape)} is too large (more than 2**59 elements)")
    return shape, (0 if 0 in shape else entries)


def _check_fill(name: str, shape: tuple[int, ...], n: int, carried: int, string_bytes: int = 0,
                bounded: bool = True, left: list[int] | None = None) -> None:
    """A tensor of `n` elements from `carried` values: fewer values than elements are filled out
    only up to MAX_FILL_ELEMENTS (and, for strings, MAX_FILL_STRING_BYTES of text), when `bounded`;
    `left`: what the request's other tensors have left of MAX_FILL_ELEMENTS (one number in a list,
    taken from)."""
    if carried > n:
        raise invalid(f"input '{quoted(name)}': {carried} values for shape {list(shape)}")
    if not bounded or carried >= n:
        return
    budget = MAX_FILL_ELEMENTS if left is None else left[0]
    if n > budget or string_bytes > MAX_FILL_STRING_BYTES:
        raise invalid(f"input '{quoted(name)}': shape {list(shape)} has {n:,} elements and the request carries "
                      f"{carried:,} values; a tensor is filled out from fewer values than its elements only up to "
                      f"{MAX_FILL_ELEMENTS:,} elements" + (f" and {MAX_FILL_STRING_BYTES >> 20} MiB of strings"
                                                          if string_bytes else "")
                      + (f", for all of a request's tensors together ({budget:,} left for this one)"
                         if budget < MAX_FILL_ELEMENTS else ""))
    if left is not None:
        left[0] -= n


def tensor_to_numpy(proto, name: str = "", bounded: bool = True, left: list[int] | None = None) -> np.ndarray:
    """A TensorProto's value, with TF's rules: tensor_content, or typed values where fewer
    values than elements repeat the last one (within MAX_FILL_ELEMENTS unless not `bounded`:
    a model's own warmup records are filled out as TF Serving fills them; `left`: see
    _check_fill), checked before any allocation."""
    shape, n = tensor_shape(proto, name)
    if proto.dtype == types_pb2.DT_STRING:
        values = proto.string_val
        text = 0
        if len(values) < n:
            text = sum(map(len, values)) + (n - len(values)) * (len(values[-1]) if values else 0)
        _check_fill(name, shape, n, len(values), text, bounded, left)
        values = list(values)
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
    elif proto.dtype in _VALUE_FIELDS:
        field, dtype = _VALUE_FIELDS[proto.dtype]
        if proto.tensor_content:
            if len(proto.tensor_content) != n * np.dtype(dtype).itemsize:
                raise invalid(f"input '{quoted(name)}': tensor_content holds {len(proto.tensor_content)} bytes, "
                              f"shape {list(shape)} needs {n * np.dtype(dtype).itemsize}")
            return np.frombuffer(proto.tensor_content, dtype=dtype).reshape(shape)
        values = getattr(proto, field)
        _check_fill(name, shape, n, len(values), bounded=bounded, left=left)
        try:
            arr = np.array(values, dtype=dtype)
        except OverflowError:  # int_val holds int32s; int8, int16, uint8 and uint16 take fewer
            raise invalid(f"input '{quoted(name)}': a value out of range for {np.dtype(dtype).name}") from None
    else:
        if not proto.tensor_content:  # make_ndarray fills out as above: the same bounds
            carried = (sum(len(getattr(proto, f)) for f in _OTHER_FIELDS)
                       + sum(len(getattr(proto, f)) // 2 for f in _PAIRED_FIELDS))
            _check_fill(name, shape, n, carried, bounded=bounded, left=left)
        try:
            return tf.make_ndarray(proto)
        except Exception as e:  # an unsupported or inconsistent TensorProto
            raise invalid(f"input '{quoted(name)}' is not a valid TensorProto: {e}") from None
    if len(arr) == n:
        return arr.reshape(shape)
    if len(arr) == 0:
        return np.zeros(shape, dtype=arr.dtype) if arr.dtype != object else np.full(shape, b"", dtype=object)
    return np.concatenate([arr, np.repeat(arr[-1:], n - len(arr))]).reshape(shape)


def declared_shape(request: predict_pb2.PredictRequest) -> tuple[int | None, int]:
    """What a Predict's tensors declare, in one pass over them: the rows (the first dimension they
    share, as batching counts them; None when they share none: a scalar, different first
    dimensions) and how many elements in all, what decoding builds, which TensorFlow's fill-out
    rule may make far more than the request's bytes. Nothing is checked here (predict_inputs
    refuses what is wrong); of a tensor of more dimensions than it takes, only as many are
    counted, so that the count costs little however many a request declares."""
    firsts, elements = set(), 0
    for proto in request.inputs.values():
        dims = proto.tensor_shape.dim
        firsts.add(dims[0].size if dims else None)
        n = 1
        for d in dims[:MAX_TENSOR_RANK + 1]:
            n *= max(d.size, 0)
        elements += n
    return (firsts.pop() if len(firsts) == 1 else None), elements


def predict_inputs(request: predict_pb2.PredictRequest, bounded: bool = True) -> dict[str, np.ndarray]:
    """A Predict's tensors (`bounded`: see tensor_to_numpy; the fill-out bound is for all of them)."""
    inputs = request.inputs
    fast = one_value_inputs(inputs)
    if fast is not None:
        return fast
    left = [MAX_FILL_ELEMENTS]
    return {name: tensor_to_numpy(proto, name, bounded, left) for name, proto in inputs.items()}


# the dtypes one_value_inputs reads: their value field and numpy type
_ONE_VALUE_FIELDS = {dt: _VALUE_FIELDS[dt] for dt in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE, types_pb2.DT_INT32,
                                                      types_pb2.DT_INT64, types_pb2.DT_BOOL)}
_ONE_VALUE_FIELDS[types_pb2.DT_STRING] = ("string_val", object)
_ONE_ROW = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])


def one_value_inputs(inputs) -> dict[str, np.ndarray] | None:
    """The common gRPC request read in one pass: every input a shape [1] tensor holding its one
    value in its typed field (a row of one example, as clients send it), of a float, double,
    int32, int64, bool or string dtype. Each dtype's values become one array and each input a
    view of it, much cheaper per input than tensor_to_numpy on a model of many one-row inputs.
    None for anything else, which tensor_to_numpy reads input by input."""
    groups: dict[int, list] = {}
    places = []
    for name, proto in inputs.items():
        if proto.tensor_shape != _ONE_ROW or proto.tensor_content:  # (one compare: cheaper than reading dims)
            return None
        dtype = proto.dtype
        field = _ONE_VALUE_FIELDS.get(dtype)
        if field is None:
            return None
        values = getattr(proto, field[0])
        if len(values) != 1:
            return None
        group = groups.get(dtype)
        if group is None:
            group = groups[dtype] = []
        places.append((name, dtype, len(group)))
        group.append(values[0])
    blocks = {}
    for dtype, values in groups.items():
        numpy = _ONE_VALUE_FIELDS[dtype][1]
        if numpy is object:
            blocks[dtype] = np.empty(len(values), dtype=object)
            blocks[dtype][:] = values
        else:
            blocks[dtype] = np.array(values, dtype=numpy)
    return {name: blocks[dtype][i:i + 1] for name, dtype, i in places}  # in the request's order


def tensor_proto(value: np.ndarray, content: bool = False, into: tensor_pb2.TensorProto | None = None
                 ) -> tensor_pb2.TensorProto:
    """Typed value fields, as TF Serving fills its responses (clients read float_val etc.);
    `content`: numbers as tensor_content bytes (--enable_serialization_as_tensor_content).
    `into`: an empty TensorProto to fill (a response's output) rather than a new one."""
    proto = tensor_pb2.TensorProto() if into is None else into
    for d in value.shape:
        proto.tensor_shape.dim.add(size=d)
    if value.dtype.kind in "OSU":
        proto.dtype = types_pb2.DT_STRING
        for part in _parts(value.ravel()):
            proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in part)
        return proto
    dt = _DTYPES.get(value.dtype)
    if dt is None:
        made = tf.make_tensor_proto(value)
        if into is None:
            return made
        into.CopyFrom(made)
        return into
    proto.dtype = dt
    if content:
        proto.tensor_content = np.ascontiguousarray(value).tobytes()
    else:
        field = getattr(proto, _VALUE_FIELDS[dt][0])
        for part in _parts(value.ravel()):
            field.extend(part.tolist())
    return proto


# Values converted by one call: a call holds Python's GIL until it returns, so a long answer is
# filled in parts of this many values, and the server's other threads run between them.
PART_VALUES = 65536


def _parts(flat: np.ndarray) -> list[np.ndarray]:
    if len(flat) <= PART_VALUES:
        return [flat]
    return [flat[i:i + PART_VALUES] for i in range(0, len(flat), PART_VALUES)]


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
