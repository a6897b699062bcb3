"""What a candidate SavedModel would break for the clients of the baseline it replaces.

A retrained model published under the same TF Serving model name must still answer the
requests the served one (the baseline) answers. `breaking_changes` compares the two
SavedModels' SignatureDefs, read from their saved_model.pb (the meta graph tagged "serve",
as TF Serving loads it), and names every difference such a client would meet:

- a signature of the baseline is missing from the candidate, or has another method name
  (Classify / Regress / Predict clients are routed by it);
- an input of the baseline is missing, has another dtype (or encoding: dense, sparse,
  composite), or a shape that refuses what the baseline took: another rank when both ranks are
  known, or a dimension that was unknown (-1) and is now fixed, or a fixed one that changed;
- an input the candidate adds without a default (SignatureDef.defaults): TF Serving's Predict
  refuses a request lacking an input. A new feature of a model reading serialized tf.Examples
  (one DT_STRING input, `examples` or `inputs`) is no input of its own: old clients' Examples
  simply lack it, so such a signature only breaks through that tensor. A tensor added beside it
  is a break all the same (Predict wants it; Classify and Regress take a signature of one input);
- an input whose default the candidate drops: clients that left it out are refused;
- an output of the baseline is missing or has another dtype.

New signatures and new outputs break nothing. Output shapes are not compared. Signatures
whose keys start with "__" (TensorFlow's own `__saved_model_init_op`) are no client's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2

SERVE_TAGS = ("serve",)
KINDS = ("signature removed", "method changed", "input removed", "input added", "input retyped",
         "input reshaped", "input default removed", "output removed", "output retyped")
_ENCODINGS = {"name": "", "coo_sparse": "sparse ", "composite_tensor": "composite "}


@dataclass(frozen=True)
class Break:
    """One difference that would break a client of the baseline. `kind` is one of KINDS;
    `name` is the input's or output's key (None for the signature's own kinds); `detail` says
    what changed, "old -> new" (or the added input's type and shape), or is empty."""
    signature: str
    kind: str
    name: str | None
    detail: str = ""

    def text(self) -> str:
        """One line: "serving_default: input 'bill_length_mm' removed", "classification:
        method changed (tensorflow/serving/classify -> tensorflow/serving/predict)"."""
        what, _, verb = self.kind.partition(" ")
        head = f"{self.signature}: " + (self.kind if self.name is None else f"{what} {self.name!r} {verb}")
        return f"{head} ({self.detail})" if self.detail else head

    def sort_key(self) -> tuple[str, str, str]:
        return self.signature, self.kind, self.name or ""


def read_saved_model(saved_model_dir: str) -> saved_model_pb2.SavedModel:
    """The SavedModel proto of `saved_model_dir` (saved_model.pb, else saved_model.pbtxt, as
    TensorFlow's loader looks); FileNotFoundError if it has neither."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    pb, pbtxt = (os.path.join(saved_model_dir, f"saved_model.{ext}") for ext in ("pb", "pbtxt"))
    if os.path.exists(pb):
        with open(pb, "rb") as f:
            proto.ParseFromString(f.read())
    elif os.path.exists(pbtxt):
        with open(pbtxt) as f:
            text_format.Parse(f.read(), proto)
    else:
        raise FileNotFoundError(f"{saved_model_dir} holds no saved_model.pb")
    return proto


def meta_graph(proto: saved_model_pb2.SavedModel, tags: tuple[str, ...] = SERVE_TAGS) -> meta_graph_pb2.MetaGraphDef:
    """The MetaGraphDef whose tag set is exactly `tags`, as TensorFlow's loader picks it;
    LookupError naming the tag sets there are if none is. (serve/core/saved_model.py's own: the
    export stage may not import the serving one.)"""
    for g in proto.meta_graphs:
        if set(g.meta_info_def.tags) == set(tags):
            return g
    found = "; ".join("{ " + " ".join(sorted(g.meta_info_def.tags)) + " }" for g in proto.meta_graphs) or "none"
    raise LookupError(f"no meta graph tagged {{ {' '.join(sorted(tags))} }}: the SavedModel has tag-sets {found}")


def signatures(saved_model_dir: str, tags: tuple[str, ...] = SERVE_TAGS) -> dict[str, meta_graph_pb2.SignatureDef]:
    """The SignatureDefs clients can call in the SavedModel at `saved_model_dir`, by key: those
    of the meta graph tagged `tags`, without TensorFlow's own "__" ones. Read from the proto
    alone: nothing is loaded."""
    graph = meta_graph(read_saved_model(saved_model_dir), tags)
    return {key: graph.signature_def[key] for key in sorted(graph.signature_def) if not key.startswith("__")}


def breaking_changes(baseline_dir: str, candidate_dir: str) -> list[Break]:
    """Every difference between the two SavedModels' signatures that would break a client of
    the baseline (the module's docstring has the rules); empty if the candidate serves them
    all. Ordered by signature, then kind, then name."""
    old, new = signatures(baseline_dir), signatures(candidate_dir)
    found: list[Break] = []
    for key, sig in old.items():
        if key not in new:
            found.append(Break(key, "signature removed", None))
            continue
        cand = new[key]
        if sig.method_name != cand.method_name:
            found.append(Break(key, "method changed", None, f"{sig.method_name or '(none)'} -> "
                                                             f"{cand.method_name or '(none)'}"))
        found.extend(_input_breaks(key, sig, cand))
        found.extend(_output_breaks(key, sig, cand))
    return sorted(found, key=Break.sort_key)


def describe(breaks: list[Break]) -> str:
    """One sentence for an error message naming every break, in their order: "the candidate
    would break the baseline's clients: serving_default: input 'sex' removed; ..."."""
    if not breaks:
        return "the candidate serves every signature, input and output of the baseline"
    return "the candidate would break the baseline's clients: " + "; ".join(b.text() for b in breaks)


def _input_breaks(key: str, old: meta_graph_pb2.SignatureDef, new: meta_graph_pb2.SignatureDef) -> list[Break]:
    found = []
    for name, info in old.inputs.items():
        if name not in new.inputs:
            found.append(Break(key, "input removed", name))
            continue
        was, now = _type(info), _type(new.inputs[name])
        if was != now:
            found.append(Break(key, "input retyped", name, f"{was} -> {now}"))
        reshaped = _reshaped(info.tensor_shape, new.inputs[name].tensor_shape)
        if reshaped:
            found.append(Break(key, "input reshaped", name, reshaped))
        if name in old.defaults and name not in new.defaults:
            found.append(Break(key, "input default removed", name))
    for name, info in new.inputs.items():
        if name not in old.inputs and name not in new.defaults:
            found.append(Break(key, "input added", name, f"{_type(info)}, shape {_shape(info.tensor_shape)}"))
    return found


def _output_breaks(key: str, old: meta_graph_pb2.SignatureDef, new: meta_graph_pb2.SignatureDef) -> list[Break]:
    found = []
    for name, info in old.outputs.items():
        if name not in new.outputs:
            found.append(Break(key, "output removed", name))
        elif _type(info) != _type(new.outputs[name]):
            found.append(Break(key, "output retyped", name, f"{_type(info)} -> {_type(new.outputs[name])}"))
    return found


def _type(info: meta_graph_pb2.TensorInfo) -> str:
    """A TensorInfo's dtype name ("DT_FLOAT"), led by its encoding unless a dense tensor's."""
    from tensorflow.core.framework import types_pb2

    return _ENCODINGS.get(info.WhichOneof("encoding") or "name", "") + types_pb2.DataType.Name(info.dtype)


def _shape(shape) -> str:
    return "unknown rank" if shape.unknown_rank else "[" + ", ".join(str(d.size) for d in shape.dim) + "]"


def _reshaped(old, new) -> str:
    """Why a TensorShapeProto `new` refuses a tensor `old` took ("rank 1 -> rank 2", "shape
    [-1, 3] -> [-1, 4]"), or "" if it takes them all. An unknown rank on either side is no
    break; a dimension may stay unknown or become unknown, not become or change a size."""
    if old.unknown_rank or new.unknown_rank:
        return ""
    if len(old.dim) != len(new.dim):
        return f"rank {len(old.dim)} -> rank {len(new.dim)}"
    if any(b.size >= 0 and b.size != a.size for a, b in zip(old.dim, new.dim)):
        return f"shape {_shape(old)} -> {_shape(new)}"
    return ""
