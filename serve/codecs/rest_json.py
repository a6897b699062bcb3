"""TF Serving's REST JSON, to and from numpy.

The mapping follows TF Serving's REST API: row ("instances") and columnar ("inputs")
predict formats, {"b64": ...} for binary strings, outputs whose name ends in `_bytes` sent
back as {"b64": ...}, NaN/Infinity allowed as numbers; Classify and Regress examples as JSON
objects of features.
"""

from __future__ import annotations

import base64
import binascii
import json
import operator
import warnings
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2

from tfpipe.serve.codecs.tensor_proto import MAX_TENSOR_RANK
from tfpipe.serve.errors import ServingError, invalid, quoted


# ---- REST JSON -> numpy -------------------------------------------------------------
# As TF Serving's util/json_tensor.cc: the signature's dtype says what each JSON value must
# be; a tensor's shape comes from its first elements and every list must match it. Messages
# are TF Serving's.

_TF_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half"}
_DEBUG_BYTES = 256  # TF Serving cuts the JSON it quotes in errors at this length


def json_debug(value: Any) -> str:
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    except RecursionError:  # nested deeper than the encoder goes: quote its start
        opening = ""
        while isinstance(value, (list, dict)) and value and len(opening) < _DEBUG_BYTES:
            opening += "[" if isinstance(value, list) else "{"
            value = value[0] if isinstance(value, list) else next(iter(value.values()))
        text = opening + "..."
    return text if len(text) <= _DEBUG_BYTES else text[:_DEBUG_BYTES]


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


def dtype_name(dtype: tf.DType) -> str:
    """TensorFlow's DataTypeString: float, double, int64, string, ..."""
    return _TF_TYPE_NAMES.get(dtype.name, dtype.name)


def _type_error(value: Any, dtype: tf.DType) -> ServingError:
    return invalid(f"JSON Value: {json_debug(value)} Type: {_json_type(value)} is not of expected type: "
                   f"{dtype_name(dtype)}")


def _b64(value: dict) -> bytes:
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise invalid(f"JSON Value: {json_debug(value)} not formatted correctly for base64 data")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Unable to base64 decode") from None


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _scalar(value: Any, dtype: tf.DType) -> Any:
    """One JSON leaf as the dtype wants it (AddValueToTensor)."""
    if dtype == tf.string:
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, dict):
            return _b64(value)
        if isinstance(value, bool):  # JSON's spelling (TF Serving refuses it; a tfpipe model reads it in any case)
            return b"true" if value else b"false"
        raise _type_error(value, dtype)
    if isinstance(value, dict):
        raise _type_error(value, dtype)
    if dtype == tf.bool:
        if isinstance(value, bool):
            return value
        raise _type_error(value, dtype)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(value, dtype)
    if dtype.is_floating:
        return value
    if isinstance(value, float) or not dtype.is_integer:  # a JSON number with a fraction is not an integer
        raise _type_error(value, dtype)
    info = _json_int_range(dtype)
    if not info.min <= value <= info.max:
        raise _type_error(value, dtype)
    return value


def _json_int_range(dtype: tf.DType) -> np.iinfo:
    """The integers a JSON value may hold for an integer dtype (TF Serving reads int8, int16
    and uint8 as int32: IsInt)."""
    return np.iinfo(np.int32 if dtype in (tf.int8, tf.int16, tf.uint8) else dtype.as_numpy_dtype)


def _array_of(flat: list, shape: list[int], dtype: tf.DType) -> np.ndarray:
    """Values gathered in row-major order as a tensor of `shape` (strings as bytes objects)."""
    if dtype == tf.string:
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
    else:
        arr = np.array(flat, dtype=_numpy_dtype(dtype))
    return arr.reshape(shape)


def _check_rank(rank: int) -> None:
    if rank > MAX_TENSOR_RANK:
        raise invalid(f"JSON value nested more than {MAX_TENSOR_RANK} lists deep: a tensor here has at most "
                      f"{MAX_TENSOR_RANK} dimensions")


def _dense_shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        _check_rank(len(shape))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, shape: list[int], dtype: tf.DType, out: list) -> None:
    """FillTensorProto: leaves only at the deepest level, every list of the expected size."""
    rank = len(shape)
    if not isinstance(value, list):
        if level != rank:
            raise invalid(f"JSON Value: {json_debug(value)} found at incorrect level: {level + 1} in the JSON DOM. "
                          f"Expected at level: {rank}")
        out.append(_scalar(value, dtype))
        return
    if level >= rank:
        raise invalid(f"Encountered list at unexpected level: {level} expected < {rank}")
    if len(value) != shape[level]:
        raise invalid(f"Encountered list at unexpected size: {len(value)} at level: {level} "
                      f"expected size: {shape[level]}")
    for v in value:
        _fill(v, level + 1, shape, dtype, out)


def _numpy_dtype(dtype: tf.DType) -> np.dtype:
    return np.dtype(object) if dtype == tf.string else np.dtype(dtype.as_numpy_dtype)


def json_tensor(value: Any, dtype: tf.DType) -> np.ndarray:
    """A JSON value (scalar or nested lists) as a tensor of the signature's dtype."""
    if dtype != tf.string and isinstance(value, list):
        fast = _fast_numeric(value, dtype)
        if fast is not None:
            return fast
    shape = _dense_shape(value)
    flat: list = []
    _fill(value, 0, shape, dtype, flat)
    return _array_of(flat, shape, dtype)


@dataclass(frozen=True)
class _Kind:
    """What the JSON reader needs to know of a dtype, looked up once per dtype, not per value."""

    numpy: np.dtype
    string: bool
    boolean: bool
    floating: bool
    integer: bool
    int_range: np.iinfo | None


# By id: TensorFlow keeps one DType object per type (tf.as_dtype's table), and DType's own __hash__
# and __eq__ are Python calls, a measurable share of a small request.
_KINDS_OF: dict[int, tuple[tf.DType, _Kind]] = {}


def _kind(dtype: tf.DType) -> _Kind:
    known = _KINDS_OF.get(id(dtype))
    if known is not None and known[0] is dtype:
        return known[1]
    integer = dtype.is_integer
    numpy = _numpy_dtype(dtype)
    kind = _Kind(numpy, dtype == tf.string, dtype == tf.bool, dtype.is_floating, integer,
                 _json_int_range(dtype) if integer else None)
    _KINDS_OF[id(dtype)] = (dtype, kind)
    return kind


# A JSON number beyond a float dtype's range becomes inf, as rapidjson's GetFloat makes it; numpy
# would also warn, once per place, on the server's stderr.
warnings.filterwarnings("ignore", message="overflow encountered in cast", category=RuntimeWarning)


def _fast_numeric(value: list, dtype: tf.DType) -> np.ndarray | None:
    """numpy's conversion when it is decisive (rectangular numbers of an acceptable kind);
    None sends the value through the exact, slower walk (which also words the errors)."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        return None
    kind, want = arr.dtype.kind, _kind(dtype)
    if arr.dtype == want.numpy:  # already the dtype (int64 from JSON integers): nothing to check or cast
        return arr
    if want.boolean:
        return arr if kind == "b" else None
    if want.floating and kind in "iuf":
        return arr.astype(want.numpy, copy=False)
    if want.integer and kind in "iu" and arr.size:
        info = want.int_range
        if info.min <= arr.min() and arr.max() <= info.max:
            return arr.astype(want.numpy, copy=False)
    return None


def _status(e: ServingError) -> str:
    return f"{e.code.name}: {e.message}"


# rapidjson's refusal of a number beyond a double's range. An integer literal that far out (310 digits
# or more) is refused with it, as rapidjson refuses it; a literal with an exponent (1e400) is read as
# Infinity, which a float input takes as it takes 1e39 beyond float32's range.
TOO_BIG = "Number too big to be stored in double."


def json_inputs(body: dict, inputs: dict[str, tf.DType]) -> tuple[dict[str, np.ndarray], bool]:
    """Named numpy inputs from a :predict body and whether it used the row format; `inputs`
    is the signature's input names and dtypes."""
    try:
        return _json_inputs(body, inputs)
    except OverflowError:  # a Python int beyond a double's range, for a float input
        raise invalid(f"JSON Parse error: {TOO_BIG}") from None


def _json_inputs(body: dict, inputs: dict[str, tf.DType]) -> tuple[dict[str, np.ndarray], bool]:
    if not inputs:
        raise invalid(f"Failed to get input map for signature: {quoted(body.get('signature_name') or 'DEFAULT')}")
    has_instances, has_inputs = "instances" in body, "inputs" in body
    if has_instances and has_inputs:
        raise invalid(f"JSON Value: {json_debug(body)} Not formatted correctly expecting only one of 'inputs' or "
                      "'instances' keys to exist ")
    if has_instances:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise invalid(f"JSON Value: {json_debug(body)} Expecting 'instances' to be an list/array")
        if not instances:
            raise invalid(f"JSON Value: {json_debug(body)} No values in 'instances' array")
        return _instances(instances, inputs), True
    if has_inputs:
        return _columns(body["inputs"], inputs), False
    raise invalid("Missing 'inputs' or 'instances' key")


def _scalar_rows(instances: list, inputs: dict[str, tf.DType]) -> dict[str, np.ndarray] | None:
    """The common row request read in one pass: objects naming every input once, each value one
    JSON scalar of the input's own kind (see _group_check). The inputs of one dtype are taken from
    each object at once and become one array, each input a row of it. None for anything else,
    which the exact reader below reads (or words the error for) value by value; both give the
    same tensors."""
    plan = _row_plan(inputs)
    if plan is None:
        return None
    width, groups = plan
    rows: list[list[tuple]] = [[] for _ in groups]
    for item in instances:
        if type(item) is not dict or len(item) != width:
            return None
        for (_, _, take, check), taken in zip(groups, rows):
            try:
                values = take(item)
            except KeyError:
                return None
            if not check(values):
                return None
            taken.append(values)
    out = {}
    convert = _block if len(instances) <= BLOCK_ROWS else _blocks
    for (dtype, names, _, _), taken in zip(groups, rows):
        out.update(zip(names, convert(dtype, taken)))
    return out


# Rows converted by one numpy call: a call holds Python's GIL until it returns, so a long request
# is converted in blocks of this many rows, and the server's other threads run between them.
BLOCK_ROWS = 16384


def _blocks(dtype: np.dtype, rows: list[tuple]) -> np.ndarray:
    """_block's array for many rows, converted BLOCK_ROWS rows at a time."""
    return np.concatenate([_block(dtype, rows[i:i + BLOCK_ROWS]) for i in range(0, len(rows), BLOCK_ROWS)], axis=1)


def _block(dtype: np.dtype, rows: list[tuple]) -> np.ndarray:
    """[inputs, rows] of `dtype` (each input's values contiguous) from rows of JSON scalars,
    converted as the exact reader converts them (at most BLOCK_ROWS rows: see _blocks)."""
    if dtype == object:
        block = np.empty((len(rows), len(rows[0])), dtype=object)
        block[...] = [[v.encode("utf-8") for v in row] for row in rows]
    elif dtype.kind in "iu":
        block = np.array(rows, dtype=np.int64).astype(dtype, copy=False)
    elif dtype.kind == "b":
        block = np.array(rows, dtype=bool)
    else:
        block = np.array(rows, dtype=np.float64).astype(dtype, copy=False)
    return np.ascontiguousarray(block.T)


# By id, as _KINDS_OF: a signature's {input: dtype} is one dict for the servable's life.
_ROW_PLANS: dict[int, tuple[dict, Any]] = {}


def _row_plan(inputs: dict[str, tf.DType]):
    """For _scalar_rows, once per signature: how many inputs, and per dtype its numpy dtype, its
    inputs (sorted by name), a getter of their values from one object (a tuple) and the check of
    those values; None when an input has a dtype that only the exact reader reads."""
    known = _ROW_PLANS.get(id(inputs))
    if known is not None and known[0] is inputs:
        return known[1]
    members: dict[np.dtype, list[str]] = {}
    checks: dict[np.dtype, Any] = {}
    plan = None
    for name in sorted(inputs):
        want = _kind(inputs[name])
        check = _group_check(inputs[name], want.numpy)
        if check is None:
            break
        members.setdefault(want.numpy, []).append(name)
        checks[want.numpy] = check
    else:
        groups = []
        for dtype, names in members.items():
            take = operator.itemgetter(*names) if len(names) > 1 else (lambda item, n=names[0]: (item[n],))
            groups.append((dtype, tuple(names), take, checks[dtype]))
        plan = len(inputs), tuple(groups)
    if len(_ROW_PLANS) > 1000:  # signatures of versions long unloaded
        _ROW_PLANS.clear()
    _ROW_PLANS[id(inputs)] = (inputs, plan)
    return plan


_STRINGS, _BOOLEANS, _INTEGERS, _NUMBERS = frozenset({str}), frozenset({bool}), frozenset({int}), frozenset({float, int})
_EXACT_IN_DOUBLE = 2**53


def _within(values: tuple, lo: int, hi: int) -> bool:
    """Whether every integer among `values` (JSON scalars, floats among them) is within [lo, hi]."""
    try:
        if lo <= min(values) and max(values) <= hi:  # the common case, at C speed (a NaN defeats it)
            return True
    except TypeError:
        return False
    return all(lo <= v <= hi for v in values if type(v) is int)


def _group_check(dtype: tf.DType, numpy: np.dtype):
    """For _scalar_rows: whether a tuple of JSON values are each one scalar that the reader takes
    as it is for `dtype` (a number for a float, an integer within range for int32 and int64, a
    string, a boolean); None for the dtypes it leaves to the exact reader."""
    if dtype == tf.string:
        return lambda vs: _STRINGS.issuperset(map(type, vs))
    if dtype == tf.bool:
        return lambda vs: _BOOLEANS.issuperset(map(type, vs))
    if dtype.is_floating:  # not bool, whose type is its own; integers only where a double holds them exactly,
        # so that converting through float64 rounds once, as the exact reader's int64 array does
        def numbers(vs):
            types = set(map(type, vs))
            return _NUMBERS.issuperset(types) and (int not in types
                                                   or _within(vs, -_EXACT_IN_DOUBLE, _EXACT_IN_DOUBLE))
        return numbers
    if numpy in (np.dtype(np.int32), np.dtype(np.int64)):
        lo, hi = int(np.iinfo(numpy).min), int(np.iinfo(numpy).max)
        return lambda vs: _INTEGERS.issuperset(map(type, vs)) and lo <= min(vs) and max(vs) <= hi
    return None


def _instances(instances: list, inputs: dict[str, tf.DType]) -> dict[str, np.ndarray]:
    if type(instances[0]) is dict:
        fast = _scalar_rows(instances, inputs)
        if fast is not None:
            return fast
    return _exact_instances(instances, inputs)


def _exact_instances(instances: list, inputs: dict[str, tf.DType]) -> dict[str, np.ndarray]:
    """Any 'instances' list, value by value, with TF Serving's error for the first wrong one."""
    def is_object(v):
        return isinstance(v, dict) and not _is_b64(v)

    names = sorted(inputs)
    if not isinstance(instances[0], dict) and len(inputs) > 1:
        raise invalid("instances is a plain list, but expecting list of objects as multiple input tensors "
                      "required as per tensorinfo_map")
    if not is_object(instances[0]):
        name = names[0]
        for i, item in enumerate(instances):
            if is_object(item):
                raise invalid(f"Expecting value/list but got object at item {i} of input list")
        try:
            return {name: _stacked([(i, item) for i, item in enumerate(instances)], inputs[name])}
        except ServingError as e:
            raise invalid(f"Failed to process element: {e.item} of 'instances' list. "
                          f"Error: {_status(e)}") from None
    columns: dict[str, list] = {n: [] for n in names}
    for i, item in enumerate(instances):
        if not is_object(item):
            raise invalid(f"Expecting object but got list at item {i} of input list")
        for key, value in item.items():
            if key not in inputs:
                raise invalid(f"Failed to process element: {i} key: {quoted(key)} of 'instances' list. Error: "
                              f"INVALID_ARGUMENT: JSON object: does not have named input: {quoted(key)}")
            columns[key].append((i, value))
        if set(item) != set(names):
            raise invalid(f"Failed to process element: {i} of 'instances' list. JSON object: {json_debug(item)} "
                          f"keys must be equal to: {','.join(names)}")
    out = {}
    for name in names:
        try:
            out[name] = _stacked(columns[name], inputs[name])
        except ServingError as e:
            raise invalid(f"Failed to process element: {e.item} key: {name} of 'instances' list. Error: "
                          f"{_status(e)}") from None
    return out


def _stacked(items: list[tuple[int, Any]], dtype: tf.DType) -> np.ndarray:
    """One tensor from the instances' values of one input: [instances, *shape of each]."""
    values = [v for _, v in items]
    if not _kind(dtype).string:
        fast = _fast_numeric(values, dtype)
        if fast is not None and fast.ndim >= 1:
            return fast
    elif all(type(v) is str for v in values):  # a string per instance, the common case
        arr = np.empty(len(values), dtype=object)
        arr[:] = [v.encode("utf-8") for v in values]
        return arr
    first_shape = first_size = None
    parts = []
    for i, value in items:
        try:
            shape = _dense_shape(value)
            _check_rank(1 + len(shape))  # the instances' own dimension comes on top of each instance's
            flat: list = []
            _fill(value, 0, shape, dtype, flat)
            if first_shape is None:
                first_shape, first_size = shape, len(flat)
            elif len(flat) != first_size:
                raise invalid(f"Expecting tensor size: {first_size} but got: {len(flat)}")
            elif shape != first_shape:
                raise invalid(f"Expecting shape [{','.join(map(str, first_shape))}] but got: "
                              f"[{','.join(map(str, shape))}]")
        except ServingError as e:
            e.item = i
            raise
        parts.extend(flat)
    return _array_of(parts, [len(items), *first_shape], dtype)


def _columns(value: Any, inputs: dict[str, tf.DType]) -> dict[str, np.ndarray]:
    if not isinstance(value, dict) or _is_b64(value):
        if len(inputs) > 1:
            raise invalid("inputs is a plain value/list, but expecting an object as multiple input tensors "
                          "required as per tensorinfo_map")
        (name, dtype), = inputs.items()
        return {name: json_tensor(value, dtype)}
    out = {}
    for name in sorted(inputs):
        if name not in value:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        out[name] = json_tensor(value[name], inputs[name])
    return out


def json_examples(body: dict) -> list[bytes]:
    """Serialized tf.Examples from a :classify / :regress body ('examples' plus optional
    'context', whose features each example's own override)."""
    ctx = _example(body["context"]) if "context" in body else None
    if "examples" not in body:
        raise invalid(f"JSON Value: {json_debug(body)} When method is classify, key 'examples' is expected and was "
                      "not found")
    examples = body["examples"]
    if not isinstance(examples, list):
        raise invalid(f"JSON Value: {json_debug(body)} Expecting 'examples' value to be an list/array")
    if not examples:
        raise invalid(f"JSON Value: {json_debug(body)} 'examples' value is an empty array")
    out = []
    for e in examples:
        ex = _example(e)
        if ctx is not None:
            merged = example_pb2.Example()
            merged.CopyFrom(ctx)
            merged.MergeFrom(ex)
            ex = merged
        out.append(ex.SerializeToString())
    return out


_KINDS = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def _example(features: Any) -> example_pb2.Example:
    """MakeExampleFromJsonObject: a feature's values (one or a list) are all strings (or
    b64), all numbers with a fraction (floats), or all whole numbers/booleans (int64)."""
    if not isinstance(features, dict):
        raise invalid(f"Example must be JSON object but got JSON {_json_type(features)}")
    ex = example_pb2.Example()
    for name, content in features.items():
        f = ex.features.feature[name]
        for v in content if isinstance(content, list) else [content]:
            if v is None or isinstance(v, list) or (isinstance(v, dict) and not _is_b64(v)):
                raise invalid(f"Feature: {quoted(name)} has element with unexpected JSON type: {_json_type(v)}")
            if isinstance(v, (str, dict)):
                kind, item = "bytes_list", v.encode("utf-8") if isinstance(v, str) else _b64(v)
            elif isinstance(v, float):
                kind, item = "float_list", v
            else:
                kind, item = "int64_list", int(v)
                if item >= 2**63:
                    raise invalid(f"Feature: {quoted(name)} has uint64_t element. Only int64_t is supported.")
                if item < -2**63:
                    raise _type_error(v, tf.int64)
            current = f.WhichOneof("kind")
            if current not in (None, kind):
                raise invalid(f"Unexpected element type in feature: {quoted(name)} expecting type: {_KINDS[current]}")
            getattr(f, kind).value.append(item)
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

        def walk(v):  # tolist()'s nesting, each string encoded (np.vectorize costs more on small answers)
            return [walk(x) for x in v] if type(v) is list else enc(v)

        return walk(value.tolist())
    return value.tolist()


def json_outputs(outputs: dict[str, np.ndarray], row_format: bool) -> dict[str, Any]:
    """A Predict's answer as TF Serving's REST API gives it: 'predictions' (one object, or value,
    per row) for a request in the row format, 'outputs' for the columnar one."""
    if not row_format:
        if len(outputs) == 1:
            (name, value), = outputs.items()
            return {"outputs": _jsonable(name, value)}
        return {"outputs": {k: _jsonable(k, v) for k, v in outputs.items()}}
    n = None
    for name, value in sorted(outputs.items()):
        if value.ndim == 0:
            raise invalid(f"Tensor name: {name} has no shape information ")
        if n is not None and value.shape[0] != n:
            raise invalid(f"Tensor name: {name} has inconsistent batch size: {value.shape[0]} expecting: {n}")
        n = value.shape[0]
    if len(outputs) == 1:
        (name, value), = outputs.items()
        return {"predictions": _jsonable(name, value)}
    columns = {k: _jsonable(k, v) for k, v in outputs.items()}
    return {"predictions": [{k: columns[k][i] for k in columns} for i in range(n)]}


def dumps(value: Any) -> str:
    """JSON text as TF Serving's REST API writes it: NaN and Infinity as bare tokens."""
    return json.dumps(value, allow_nan=True)


def json_output_text(outputs: dict[str, np.ndarray], row_format: bool, rows: int = 1024) -> Iterator[str]:
    """The text of `dumps(json_outputs(outputs, row_format))`, the same characters, in pieces of at
    most `rows` rows each: for a long answer neither one call that holds Python's GIL until it
    returns nor an object for each of its values at once."""
    lengths = {v.shape[0] if v.ndim else -1 for v in outputs.values()}
    if max(lengths, default=0) <= rows or (row_format and len(lengths) > 1):
        yield dumps(json_outputs(outputs, row_format))  # (short; or the error json_outputs words)
        return
    if row_format:
        n, = lengths
        yield '{"predictions": ['
        yield from _joined_pieces(dumps(json_outputs({k: v[i:i + rows] for k, v in outputs.items()}, True))[17:-2]
                                  for i in range(0, n, rows))
        yield "]}"
        return

    def column(name: str, value: np.ndarray) -> Iterator[str]:
        if value.ndim == 0 or value.shape[0] <= rows:
            yield dumps(_jsonable(name, value))
            return
        yield "["
        yield from _joined_pieces(dumps(_jsonable(name, value[i:i + rows]))[1:-1]
                                  for i in range(0, value.shape[0], rows))
        yield "]"

    if len(outputs) == 1:
        (name, value), = outputs.items()
        yield '{"outputs": '
        yield from column(name, value)
        yield "}"
        return
    yield '{"outputs": {'
    for i, (name, value) in enumerate(outputs.items()):
        yield (", " if i else "") + dumps(name) + ": "
        yield from column(name, value)
    yield "}}"


def _joined_pieces(pieces: Iterator[str]) -> Iterator[str]:
    """The pieces with ", " between them, as one list's items."""
    for i, piece in enumerate(pieces):
        yield ", " + piece if i else piece
