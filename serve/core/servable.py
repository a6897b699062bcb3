"""One loaded version of a SavedModel: its signatures, their inputs checked and their calls
(loading and calling: saved_model.py; Classify and Regress's rules: examples.py).

As in TF Serving, the tensors of a request go to the model as they are: their names and
dtypes are checked against the signature, their shapes are not; the model's own ops accept
or refuse them (a refusal is INVALID_ARGUMENT). When the shapes match the signature, the
call takes a faster path (`saved_model.flat_caller`).
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from tfpipe.serve.core.examples import classification_outputs, regression_outputs, run_examples
from tfpipe.serve.core.saved_model import (fed_dtype, first_line, flat_caller, keyword_caller, load_saved_model,
                                           meta_graph, tensor_shape)
from tfpipe.serve.errors import invalid, precondition, quoted, with_code

DEFAULT_SIGNATURE = "serving_default"
PREDICT, CLASSIFY, REGRESS = ("tensorflow/serving/predict", "tensorflow/serving/classify",
                              "tensorflow/serving/regress")
BATCHING_PARAMS_FILE = "batching_params.pbtxt"  # --enable_per_model_batching_parameters
MAX_RANK = 64  # numpy's limit on dimensions, so the most any request's tensor can have

_uids = itertools.count(1)
LIVE: weakref.WeakSet = weakref.WeakSet()  # every Servable not yet freed (the metrics report its size)


@dataclass(frozen=True)
class ServableSettings:
    """How versions load and answer: the parts of TF Serving's SessionBundleConfig and flags
    that concern one servable."""
    tags: tuple[str, ...] = ("serve",)
    method_name_check: bool = False  # --enable_signature_method_name_check
    warmup: bool = True
    warmup_iterations: int = 1  # --num_request_iterations_for_warmup
    per_model_batching: bool = False  # read BASE/VERSION/batching_params.pbtxt


_NDIM, _ONE_DIMENSION = operator.attrgetter("ndim"), frozenset({1})


@dataclass
class Signature:
    name: str
    proto: meta_graph_pb2.SignatureDef
    function: Any
    inputs: dict[str, tuple[tf.DType, tf.TensorShape]] = field(default_factory=dict)
    input_dtypes: dict[str, tf.DType] = field(default_factory=dict)  # inputs' dtypes alone (REST reads by them)
    outputs: dict[str, tf.DType] = field(default_factory=dict)
    numpy_dtypes: dict[str, np.dtype] = field(default_factory=dict)
    dims: dict[str, list[int | None] | None] = field(default_factory=dict)
    max_ranks: dict[str, int] = field(default_factory=dict)  # the most dimensions each input may have
    ranks_known: bool = True  # every input's shape has a rank in the signature
    defaults: dict[str, np.ndarray] = field(default_factory=dict)
    call: Any = None  # inputs whose shapes match the signature -> outputs (see saved_model.flat_caller)
    call_any: Any = None  # inputs of any shape -> outputs (the public call)
    splits: bool = True  # its outputs have one row per input row, so a call can be cut by rows (Inference)
    _vectors: Any = None  # shapes_match's getter of the inputs of shape [None], built at its first call
    _others: list[str] = field(default_factory=list)  # shapes_match's other inputs of a known rank

    @property
    def method(self) -> str:
        return self.proto.method_name

    def shapes_match(self, inputs: dict[str, np.ndarray]) -> bool:
        if self._vectors is None:
            vectors = [k for k, dims in self.dims.items() if dims == [None]]
            self._others = [k for k, dims in self.dims.items() if dims is not None and dims != [None]]
            self._vectors = operator.itemgetter(*vectors) if len(vectors) > 1 else (
                (lambda d, k=vectors[0]: (d[k],)) if vectors else (lambda d: ()))
        # inputs of shape [None] (a table's columns): one look at all their ranks
        if not _ONE_DIMENSION.issuperset(map(_NDIM, self._vectors(inputs))):
            return False
        for name in self._others:
            dims, value = self.dims[name], inputs[name]
            if len(dims) != value.ndim or any(d is not None and d != n for d, n in zip(dims, value.shape)):
                return False
        return True


class Servable:
    """A SavedModel version ready to answer; thread-safe (TF functions are)."""

    def __init__(self, name: str, version: int, path: str, settings: ServableSettings = ServableSettings()):
        self.name, self.version, self.path, self.settings = name, version, path, settings
        self.uid = next(_uids)  # never reused, unlike id(): batch queues are keyed by it
        proto = saved_model_pb2.SavedModel()
        pb = os.path.join(path, "saved_model.pb")
        if not os.path.exists(pb):
            raise FileNotFoundError(f"{path} holds no saved_model.pb")
        with open(pb, "rb") as f:
            proto.ParseFromString(f.read())
        self.signature_defs = meta_graph(proto, settings.tags).signature_def
        self.batching_params = self._batching_params() if settings.per_model_batching else None
        loaded, self.broken = load_saved_model(path, settings.tags, proto)
        del proto  # only the signature defs are kept (as remove_unused_fields_from_bundle_metagraph)
        self._loaded = loaded  # keeps the variables the functions read alive
        self.signatures: dict[str, Signature] = {}
        for key, sig_def in self.signature_defs.items():
            if key.startswith("__") or key not in loaded.signatures:
                continue
            s = Signature(key, sig_def, loaded.signatures[key])
            s.inputs = {k: (fed_dtype(s.function, k, v), tensor_shape(v)) for k, v in sig_def.inputs.items()}
            s.input_dtypes = {k: dtype for k, (dtype, _) in s.inputs.items()}
            s.outputs = {k: tf.as_dtype(v.dtype) for k, v in sig_def.outputs.items()}
            s.numpy_dtypes = {k: np.dtype(object) if d == tf.string else np.dtype(d.as_numpy_dtype)
                              for k, (d, _) in s.inputs.items()}
            s.dims = {k: shape.as_list() if shape.rank is not None else None for k, (_, shape) in s.inputs.items()}
            s.max_ranks = {k: MAX_RANK if dims is None else len(dims) + 1 for k, dims in s.dims.items()}
            s.ranks_known = all(dims is not None for dims in s.dims.values())
            s.defaults = {k: tf.make_ndarray(v) for k, v in getattr(sig_def, "defaults", {}).items()}
            s.call_any = keyword_caller(s.function, s.inputs)
            s.call = flat_caller(s.function, s.inputs) or s.call_any
            self.signatures[key] = s
        LIVE.add(self)

    def _batching_params(self):
        """BASE/VERSION/batching_params.pbtxt, or None: with per-model batching parameters a
        version without the file is served unbatched, as in TF Serving."""
        from tfpipe.serve.tfserving.configs import read_text_proto
        from tfpipe.serve.tfserving.protos import BatchingParameters

        path = os.path.join(self.path, BATCHING_PARAMS_FILE)
        if not os.path.exists(path):
            return None
        return read_text_proto(path, BatchingParameters(), "per-model batching parameters")

    def functions(self) -> list:
        """The TensorFlow functions the signatures run (every call path holds one of them)."""
        return [f for s in self.signatures.values()
                if (f := getattr(s.function, "_inference_function", None)) is not None]

    def signature(self, name: str) -> Signature:
        key = name or DEFAULT_SIGNATURE
        if key in self.broken:
            raise precondition(f'Serving signature "{key}" could not be loaded: {self.broken[key]}')
        if key not in self.signatures:
            raise precondition(f'Serving signature key "{quoted(key)}" not found.')
        return self.signatures[key]

    def check_inputs(self, sig: Signature, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Names against the signature (missing ones filled from its defaults) and dtypes, with
        TF Serving's wording, and ranks: an input may have at most one dimension more than the
        signature gives it (a client's `[[x], [y]]` for `[None]`, which TF Serving's session takes);
        more is INVALID_ARGUMENT here, before TensorFlow (whose kernels refuse broadcasts over more
        than a few dimensions with UnimplementedError). Fewer dimensions, and the sizes of the
        dimensions, are the model's ops' to judge, as in TF Serving."""
        sent, wanted = set(inputs), set(sig.inputs)
        if sent != wanted:
            missing = wanted - sent
            if sent - wanted or not missing <= set(sig.defaults):
                raise invalid(f"input size does not match signature: {len(sent)}!={len(wanted)} "
                              f"len({{{quoted(','.join(sorted(sent)))}}}) != len({{{','.join(sorted(wanted))}}}). "
                              f"Sent extra: {{{quoted(','.join(sorted(sent - wanted)))}}}. "
                              f"Missing but required: {{{','.join(sorted(missing - set(sig.defaults)))}}}.")
            inputs = {**inputs, **{k: sig.defaults[k] for k in missing}}
        out = {}
        max_ranks = sig.max_ranks
        for name, value in inputs.items():
            if value.ndim > max_ranks[name]:
                raise invalid(f"input '{name}' has {value.ndim} dimensions; the signature's shape "
                              f"{_shape_text(sig.dims[name])} takes at most {max_ranks[name]}")
            if value.dtype != sig.numpy_dtypes[name]:  # the common case needs no conversion
                value = coerce(value, sig.inputs[name][0], name)
            out[name] = value
        return out

    def run(self, sig: Signature, inputs: dict[str, np.ndarray],
            output_filter: list[str] | None = None) -> dict[str, np.ndarray]:
        """Call the signature on checked inputs. An op that refuses them is INVALID_ARGUMENT; any
        other error of TensorFlow's keeps its status code, as TF Serving answers with the session's,
        except an UnimplementedError on inputs whose shapes the signature does not declare (other
        dimensions than its shapes', or any where it gives no rank): that is the caller's shape (a
        broadcast over more dimensions than the kernel takes), INVALID_ARGUMENT."""
        matching = sig.shapes_match(inputs)
        call = sig.call if matching else sig.call_any
        try:
            result = call(inputs)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            raise invalid(first_line(e)) from None
        except tf.errors.UnimplementedError as e:
            if matching and sig.ranks_known:
                raise with_code(e.error_code, first_line(e)) from None
            raise invalid(first_line(e)) from None
        except tf.errors.OpError as e:
            raise with_code(e.error_code, first_line(e)) from None
        names = output_filter or sorted(result)  # one order in every process (a map's order can differ)
        out = {k: result[k].numpy() for k in names}
        for k, v in out.items():
            if type(v) is bytes:  # a scalar string comes out of numpy() as bytes, not as an array
                out[k] = np.array(v, dtype=object)
        return out

    def output_filter(self, sig: Signature, names) -> list[str] | None:
        names = list(names)
        seen = set()
        for n in names:
            if n not in sig.outputs:
                raise invalid(f"output tensor alias not found in signature: {quoted(n)} Outputs expected to be in "
                              f"the set {{{','.join(sorted(sig.outputs))}}}.")
            if n in seen:
                raise invalid(f"duplicate output tensor alias: {quoted(n)}")
            seen.add(n)
        return names or None

    # Classify and Regress take tf.Examples (tensorflow.serving.Input) through a signature with
    # one input named `inputs`. Its method must be classify / regress only with
    # --enable_signature_method_name_check; otherwise (TF Serving's default, which native TF2
    # models need) any signature of that shape will do. `run` is how the signature gets called:
    # Servable.run by default, the batcher's queue when batching is on.
    def classification_signature(self, name: str) -> Signature:
        sig = self._example_signature(name, CLASSIFY, "classification")
        if len(sig.outputs) not in (1, 2):
            raise invalid(f"Expected one or two output Tensors, found {len(sig.outputs)}")
        if "classes" not in sig.outputs and "scores" not in sig.outputs:
            raise invalid('Expected classification signature outputs to contain at least one of "classes" or '
                          f'"scores". Signature was: {_debug(sig.proto)}')
        return sig

    def regression_signature(self, name: str) -> Signature:
        sig = self._example_signature(name, REGRESS, "regression")
        if len(sig.outputs) != 1:
            raise invalid("Expected one output Tensor.")
        if "outputs" not in sig.outputs:
            raise invalid(f"No regression outputs found in SignatureDef: {_debug(sig.proto)}")
        return sig

    def _example_signature(self, name: str, method: str, kind: str) -> Signature:
        key = name or DEFAULT_SIGNATURE
        if key in self.broken:
            raise precondition(f'Serving signature "{key}" could not be loaded: {self.broken[key]}')
        if key not in self.signatures:
            raise invalid(f"No signature was found with the name: {quoted(key)}")
        sig = self.signatures[key]
        if self.settings.method_name_check and sig.method != method:
            raise invalid(f"Expected {kind} signature method_name to be {method}. Was: {sig.method}")
        if len(sig.inputs) != 1:
            raise invalid("Expected one input Tensor.")
        if "inputs" not in sig.inputs:
            raise invalid(f"No {kind} inputs found in SignatureDef: {_debug(sig.proto)}")
        return sig

    async def classify(self, sig_name: str, serialized: list[bytes], run=None, off_loop=None
                       ) -> tuple[Signature, np.ndarray | None, np.ndarray | None]:
        """A Classify of `serialized` examples: (signature, classes, scores). `await run(sig,
        checked)` calls the signature (the batch queue, a worker thread); when None, the model is
        called on this thread and the call never waits (examples.finished gives its value).
        `off_loop`: see examples.run_examples."""
        sig = self.classification_signature(sig_name)
        return sig, *classification_outputs(await self._examples(sig, serialized, run, off_loop), len(serialized))

    async def regress(self, sig_name: str, serialized: list[bytes], run=None, off_loop=None
                      ) -> tuple[Signature, np.ndarray]:
        """A Regress, as `classify`: (signature, values)."""
        sig = self.regression_signature(sig_name)
        return sig, regression_outputs(await self._examples(sig, serialized, run, off_loop), len(serialized))

    async def _examples(self, sig: Signature, serialized: list[bytes], run, off_loop) -> dict[str, np.ndarray]:
        async def call(checked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return self.run(sig, checked) if run is None else await run(sig, checked)
        return await run_examples(serialized, lambda inputs: self.check_inputs(sig, inputs), call, off_loop)


def _debug(proto) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(proto, as_one_line=True)


def coerce(value: np.ndarray, dtype: tf.DType, name: str) -> np.ndarray:
    """A numpy value as the signature's dtype, refusing lossy or nonsensical conversions."""
    kind = value.dtype.kind
    if dtype == tf.string:
        if kind in "OSU":
            return value
        raise invalid(f"input '{name}' expects strings, got {value.dtype.name} values")
    target = np.dtype(dtype.as_numpy_dtype)
    if kind not in "biuf":
        raise invalid(f"input '{name}' expects {dtype.name} values, got {'strings' if kind in 'OSU' else value.dtype.name}")
    if target.kind in "iu" and kind == "f":
        if value.size and not (np.all(np.isfinite(value)) and np.all(np.floor(value) == value)):
            raise invalid(f"input '{name}' expects {dtype.name} values, got non-integral numbers")
    if target.kind in "iu" and value.size and kind in "iuf":
        info = np.iinfo(target)
        if value.min() < info.min or value.max() > info.max:
            raise invalid(f"input '{name}' has values out of range for {dtype.name}")
    if target.kind == "b" and kind != "b":
        raise invalid(f"input '{name}' expects booleans")
    converted = value.astype(target, copy=False)
    if target.kind == "f" and kind in "iu" and value.size:
        inexact = _inexact_integers(value, converted)
        if inexact is not None:
            held = float(converted.flat[np.flatnonzero(value == inexact)[0]])
            raise invalid(f"input '{name}' has integers that {dtype.name} cannot hold exactly ({inexact} would be "
                          f"{int(held) if math.isfinite(held) else held}): send them as {dtype.name}")
    return converted


def _inexact_integers(value: np.ndarray, converted: np.ndarray) -> int | None:
    """The first integer of `value` that its float conversion does not hold exactly, or None."""
    big = (value > 2**53) | (value < -(2**53))  # float64 holds every integer within 2**53 exactly
    small = ~big
    exact = value[small].astype(np.float64) == converted[small].astype(np.float64)
    if not exact.all():
        return int(value[small][~exact][0])
    for v, c in zip(value[big].tolist(), converted[big].tolist()):
        if not math.isfinite(c) or int(c) != v:
            return v
    return None


def _shape_text(dims: list[int | None] | None) -> str:
    """A signature's shape as TF Serving's metadata gives it: -1 for a dimension of any size."""
    return "unknown" if dims is None else "[" + ",".join("-1" if d is None else str(d) for d in dims) + "]"


