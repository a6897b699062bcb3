"""One loaded version of a SavedModel: its signatures, how to call them, and its warmup.

Reads any SavedModel laid out for TF Serving, not only tfpipe's: TF1 graphs saved with
SavedModelBuilder as well as `tf.saved_model.save`; the meta graph is the one whose tags
are --saved_model_tags; calls go through `tf.saved_model.load(...).signatures`.

As in TF Serving, the tensors of a request go to the model as they are: their names and
dtypes are checked against the signature, their shapes are not; the model's own ops accept
or refuse them (a refusal is INVALID_ARGUMENT). When the shapes match the signature, the
call takes a faster path (`_flat_caller`).
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.example import example_pb2
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from tfpipe.serve.core import tf_internals
from tfpipe.serve.errors import ServingError, invalid, precondition, quoted, with_code

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
    call: Any = None  # inputs whose shapes match the signature -> outputs (see _flat_caller)
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


def _shape(info) -> tf.TensorShape:
    if info.tensor_shape.unknown_rank or not info.HasField("tensor_shape"):  # TF 1.0's TensorInfo had none
        return tf.TensorShape(None)
    return tf.TensorShape([d.size if d.size >= 0 else None for d in info.tensor_shape.dim])


def _fed_dtype(fn, name: str, info) -> tf.DType:
    """The dtype the loaded function takes for input `name`: the signature's, unless the graph's
    tensor says otherwise (TF 1.0's saved_model_half_plus_three declares its serialized tf.Examples
    DT_FLOAT; TF Serving feeds what the graph takes)."""
    try:
        spec = fn.structured_input_signature[1].get(name)
    except (AttributeError, IndexError, TypeError):
        spec = None
    return spec.dtype if isinstance(spec, tf.TensorSpec) else tf.as_dtype(info.dtype)


def load_saved_model(path: str, tags: tuple[str, ...], proto: saved_model_pb2.SavedModel) -> tuple[Any, dict[str, str]]:
    """The loaded SavedModel and the signatures that could not be loaded (key -> why).

    A TF2 SavedModel (`proto`, the parsed saved_model.pb, has one meta graph with an object graph,
    TensorFlow's own test) loads with tf.saved_model.load. A TF1 graph loads signature by
    signature, as TF Serving's session only meets a signature's ops when it is called:
    TensorFlow's own loader gives up on the whole model when one signature cannot be pruned from
    the graph. Graphs of TensorFlow 1.0 (TF Serving's saved_model_half_plus_three) also
    need their old meaning kept: a signature tensor without a shape, and a Placeholder whose shape
    is empty, are of unknown shape there; newer TensorFlow reads both as scalars, and then cannot
    feed a scalar to ParseExample."""
    tags = list(tags)
    if len(proto.meta_graphs) == 1 and proto.meta_graphs[0].HasField("object_graph_def"):
        return tf.saved_model.load(path, tags=tags), {}
    broken: dict[str, str] = {}

    class PerSignatureLoader(tf_internals.v1_loader_base()):
        def get_meta_graph_def_from_tags(self, tags):
            graph = meta_graph_pb2.MetaGraphDef()
            graph.CopyFrom(super().get_meta_graph_def_from_tags(tags))
            for sig in graph.signature_def.values():
                for info in list(sig.inputs.values()) + list(sig.outputs.values()):
                    if not info.HasField("tensor_shape"):  # no shape given: any shape, not a scalar
                        info.tensor_shape.unknown_rank = True
            if graph.graph_def.versions.producer < 22:
                # Before GraphDef version 22 a Placeholder's empty shape meant "unknown" (TensorFlow's
                # version.h); TensorFlow imports it so, but pruning copies the op into a new graph,
                # where it would become a scalar.
                for node in graph.graph_def.node:
                    shape = node.attr["shape"].shape if node.op == "Placeholder" and "shape" in node.attr else None
                    if shape is not None and not shape.dim and not shape.unknown_rank:
                        shape.unknown_rank = True
            return graph

        def _extract_signatures(self, wrapped, meta_graph_def):
            functions = {}
            for key, sig in meta_graph_def.signature_def.items():
                one = meta_graph_pb2.MetaGraphDef()
                one.signature_def[key].CopyFrom(sig)
                try:
                    functions.update(super()._extract_signatures(wrapped, one))
                except Exception as e:  # noqa: BLE001 (whatever stops one signature stops only it)
                    broken[key] = _first_line(e)
            return functions

    loaded = PerSignatureLoader(path).load(tags=tags)
    if not loaded.signatures and broken:
        key, why = next(iter(broken.items()))
        raise ValueError(f"no signature of the SavedModel could be loaded ({key}: {why})")
    return loaded, broken


def meta_graph(proto: saved_model_pb2.SavedModel, tags: tuple[str, ...]) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef whose tag set is exactly `tags`, as TensorFlow's loader picks it."""
    for g in proto.meta_graphs:
        if set(g.meta_info_def.tags) == set(tags):
            return g
    found = "; ".join("{ " + " ".join(sorted(g.meta_info_def.tags)) + " }" for g in proto.meta_graphs) or "none"
    raise LookupError(f"Could not find meta graph def matching supplied tags: {{ {' '.join(sorted(tags))} }}. "
                      f"The SavedModel has tag-sets: {found}. To inspect available tag-sets in the SavedModel, "
                      "please use the SavedModel CLI: `saved_model_cli`")


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
            s.inputs = {k: (_fed_dtype(s.function, k, v), _shape(v)) for k, v in sig_def.inputs.items()}
            s.input_dtypes = {k: dtype for k, (dtype, _) in s.inputs.items()}
            s.outputs = {k: tf.as_dtype(v.dtype) for k, v in sig_def.outputs.items()}
            s.numpy_dtypes = {k: np.dtype(object) if d == tf.string else np.dtype(d.as_numpy_dtype)
                              for k, (d, _) in s.inputs.items()}
            s.dims = {k: shape.as_list() if shape.rank is not None else None for k, (_, shape) in s.inputs.items()}
            s.max_ranks = {k: MAX_RANK if dims is None else len(dims) + 1 for k, dims in s.dims.items()}
            s.ranks_known = all(dims is not None for dims in s.dims.values())
            s.defaults = {k: tf.make_ndarray(v) for k, v in getattr(sig_def, "defaults", {}).items()}
            s.call_any = _keyword_caller(s.function, s.inputs)
            s.call = _flat_caller(s.function, s.inputs) or s.call_any
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
            raise invalid(_first_line(e)) from None
        except tf.errors.UnimplementedError as e:
            if matching and sig.ranks_known:
                raise with_code(e.error_code, _first_line(e)) from None
            raise invalid(_first_line(e)) from None
        except tf.errors.OpError as e:
            raise with_code(e.error_code, _first_line(e)) from None
        names = output_filter or list(result)
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

    def classify(self, sig_name: str, serialized: list[bytes], run=None
                 ) -> tuple[Signature, np.ndarray | None, np.ndarray | None]:
        sig = self.classification_signature(sig_name)
        out = self._run_examples(sig, serialized, run or self.run)
        return sig, *classification_outputs(out, len(serialized))

    def regress(self, sig_name: str, serialized: list[bytes], run=None) -> tuple[Signature, np.ndarray]:
        sig = self.regression_signature(sig_name)
        out = self._run_examples(sig, serialized, run or self.run)
        return sig, regression_outputs(out, len(serialized))

    def _run_examples(self, sig: Signature, serialized: list[bytes], run) -> dict[str, np.ndarray]:
        """The signature on the examples. A number sent as the other numeric list is that number
        (as :predict takes either): where the model's ParseExample refuses a feature's int64_list
        for a float, or a float_list of whole numbers for an int64, that feature's values are sent
        again as the list it parses, key by key. (TF Serving refuses the request; REST's JSON
        makes an int64_list of `48` and a float_list of `48.0`.)"""
        if not serialized:
            raise invalid("Input is empty.")
        converted: set[str] = set()
        while True:
            value = np.empty(len(serialized), dtype=object)
            value[:] = serialized
            try:
                return run(sig, self.check_inputs(sig, {"inputs": value}))
            except ServingError as e:
                found = _NUMBER_KIND.search(e.message)
                if found is None or found["key"] in converted:
                    raise
                converted.add(found["key"])
                fixed = as_numbers(serialized, found["key"], found["want"] or found["want2"])
                if fixed is None:  # a value with a fraction for an int64: the model's refusal stands
                    raise
                serialized = fixed


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


def _debug(proto) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(proto, as_one_line=True)


def _keyword_caller(fn, specs: dict[str, tuple[tf.DType, tf.TensorShape]]):
    """The public way, `fn(**tensors)`: loaded signatures take tensors of any shape and leave
    them to the graph's ops, as a TF Serving session run does."""
    def call(inputs: dict[str, np.ndarray]):
        return fn(**{k: tf.constant(v, dtype=specs[k][0]) for k, v in inputs.items()})
    return call


def _flat_caller(fn, specs: dict[str, tuple[tf.DType, tf.TensorShape]]):
    """The signature called the way TF Serving runs a session: few input tensors, no argument
    binding in Python. Two costs of the public `fn(**tensors)` are left out:
      * binding and re-checking the keyword arguments (the callers have checked names and
        dtypes already, and call this only when the shapes match the signature);
      * one tensor per input, a fixed cost each: inputs of shape [None] that share a dtype go
        in as one [batch, k] tensor, split into columns inside the graph.
    (benchmarks/bench_serve.py measures the server; a test checks both calls answer the same, bit for bit.)
    Built when the loaded function exposes what it needs; otherwise None (the public call)."""
    try:
        args, kwargs = fn.structured_input_signature
        # The loaded function's own argument names may differ from the SignatureDef's keys (TF makes
        # 'x.MAML1' the argument x_MAML1): it is called by the keys below, as the public call is,
        # and tracing `graph` fails (the public call stays) if it does not take them.
        if args or len(kwargs) != len(specs):
            return None
        columns: dict[tf.DType, list[str]] = {}
        for k in sorted(specs):
            dtype, shape = specs[k]
            if shape.rank == 1 and shape[0] is None:
                columns.setdefault(dtype, []).append(k)
        packed = [(d, ks) for d, ks in columns.items() if len(ks) > 1]
        in_packs = {k for _, ks in packed for k in ks}
        single = [k for k in sorted(specs) if k not in in_packs]

        def graph(*tensors):
            kw = {}
            for (_, ks), t in zip(packed, tensors, strict=False):
                kw.update(zip(ks, tf.unstack(t, num=len(ks), axis=1), strict=True))
            kw.update(zip(single, tensors[len(packed):], strict=True))
            return fn(**kw)

        in_specs = ([tf.TensorSpec([None, len(ks)], d) for d, ks in packed]
                    + [tf.TensorSpec(specs[k][1], specs[k][0]) for k in single])
        concrete = tf.function(graph, autograph=False).get_concrete_function(*in_specs)
        if len(in_specs) + len(concrete.captured_inputs) != len(concrete.inputs):
            return None
        call_preflattened = tf_internals.preflattened_call(concrete)
    except Exception:  # noqa: BLE001 (any reason this path cannot be built: the public call stays)
        return None
    eager_tensor, device_name = tf_internals.EagerTensor, tf_internals.device_name
    packs = [(operator.itemgetter(*ks), len(ks), d.as_datatype_enum) for d, ks in packed]
    singles = [(k, specs[k][0].as_datatype_enum) for k in single]

    def call(inputs: dict[str, np.ndarray]):
        device = device_name()
        flat = []
        for take, width, e in packs:
            columns = take(inputs)
            rows = len(columns[0])
            if any(len(c) != rows for c in columns):
                rows = {k: len(v) for k, v in inputs.items() if k in in_packs}
                raise invalid(f"inputs have different numbers of rows: {rows}") from None
            # [batch, width], one column per input: the columns end to end, then transposed (one
            # copy; numpy's stack costs a call per column)
            flat.append(eager_tensor(np.ascontiguousarray(np.concatenate(columns).reshape(width, rows).T), device, e))
        flat += [eager_tensor(inputs[k], device, e) for k, e in singles]
        return call_preflattened(flat + concrete.captured_inputs)
    return call


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


_SCAFFOLD = ("Graph execution error", "Detected at node", "<stack traces", "File ", "[[", "Cause:", "To silence")


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


def _first_line(e: Exception) -> str:
    """The op's own words: TensorFlow wraps them in 'Graph execution error:', the node and its
    Python stack, and prefixes them with the function's name."""
    text = getattr(e, "message", None) or str(e)
    for line in text.splitlines():
        line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line.strip())
        if line and not line.startswith(_SCAFFOLD):
            return line
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__
