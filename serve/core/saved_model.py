"""How a SavedModel is loaded and its signatures called, as TF Serving's session would: any
SavedModel laid out for TF Serving, TF1 graphs saved with SavedModelBuilder as well as
`tf.saved_model.save` (`load_saved_model`, the meta graph of the --saved_model_tags:
`meta_graph`), called by keyword (`keyword_caller`) or, when the shapes match the signature,
through a flat call that skips Python's argument binding (`flat_caller`). servable.py builds a
version's signatures from these."""

from __future__ import annotations

import operator
import re
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

from tfpipe.serve.core import tf_internals
from tfpipe.serve.errors import invalid


def tensor_shape(info) -> tf.TensorShape:
    if info.tensor_shape.unknown_rank or not info.HasField("tensor_shape"):  # TF 1.0's TensorInfo had none
        return tf.TensorShape(None)
    return tf.TensorShape([d.size if d.size >= 0 else None for d in info.tensor_shape.dim])


def fed_dtype(fn, name: str, info) -> tf.DType:
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
                    broken[key] = first_line(e)
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


def keyword_caller(fn, specs: dict[str, tuple[tf.DType, tf.TensorShape]]):
    """The public way, `fn(**tensors)`: loaded signatures take tensors of any shape and leave
    them to the graph's ops, as a TF Serving session run does."""
    def call(inputs: dict[str, np.ndarray]):
        return fn(**{k: tf.constant(v, dtype=specs[k][0]) for k, v in inputs.items()})
    return call


def flat_caller(fn, specs: dict[str, tuple[tf.DType, tf.TensorShape]]):
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


_SCAFFOLD = ("Graph execution error", "Detected at node", "<stack traces", "File ", "[[", "Cause:", "To silence")


def first_line(e: Exception) -> str:
    """The op's own words: TensorFlow wraps them in 'Graph execution error:', the node and its
    Python stack, and prefixes them with the function's name."""
    text = getattr(e, "message", None) or str(e)
    for line in text.splitlines():
        line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line.strip())
        if line and not line.startswith(_SCAFFOLD):
            return line
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__
