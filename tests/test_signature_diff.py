"""tfpipe.export.signature_diff on real SavedModels: tiny tf.Modules saved with
tf.saved_model.save (built once for the module), some of their saved_model.pb rewritten the
way export/signatures.py:finish_signatures rewrites tfpipe's (method names, input keys)."""

from __future__ import annotations

import os

import pytest

from tfpipe.export.signature_diff import Break, breaking_changes, describe, signatures

CLASSIFY = "tensorflow/serving/classify"
PREDICT = "tensorflow/serving/predict"

# A model as its signatures: key -> (inputs: key -> (dtype, shape), outputs: key -> dtype).
# A signature whose one input is `examples` parses them with the spec of EXAMPLE_FEATURES.
BASELINE = {
    "serving_default": ({"bill": ("float32", [None]), "sex": ("string", [None])},
                        {"score": "float32", "label": "string"}),
    "predict_examples": ({"examples": ("string", [None])}, {"score": "float32"}),
    "classification": ({"inputs": ("string", [None])}, {"classes": "string", "scores": "float32"}),
}
EXAMPLE_FEATURES = ("bill",)


def variant(**changes) -> dict:
    """BASELINE with some signatures replaced (None: removed)."""
    out = {k: v for k, v in BASELINE.items() if changes.get(k, v) is not None}
    out.update({k: v for k, v in changes.items() if v is not None})
    return out


def raw(inputs: dict | None = None, outputs: dict | None = None, drop: tuple = ()) -> tuple[dict, dict]:
    """serving_default with some inputs or outputs changed, added or (`drop`) removed."""
    ins, outs = dict(BASELINE["serving_default"][0]), dict(BASELINE["serving_default"][1])
    ins.update(inputs or {})
    outs.update(outputs or {})
    return ({k: v for k, v in ins.items() if k not in drop}, {k: v for k, v in outs.items() if k not in drop})


def _function(inputs: dict, outputs: dict, features: tuple[str, ...]):
    import tensorflow as tf

    spec = {k: tf.TensorSpec(shape, getattr(tf, dtype), name=k) for k, (dtype, shape) in inputs.items()}

    def call(x):
        first = next(iter(x.values()))
        if list(x) == ["examples"]:  # a real tf.Example parser: its features are no inputs
            parsed = tf.io.parse_example(first, {f: tf.io.FixedLenFeature([], tf.float32, 0.0) for f in features})
            first = parsed[features[0]]
        n = tf.shape(first)[:1]
        return {k: tf.fill(n, "x") if dtype == "string" else tf.zeros(n, getattr(tf, dtype))
                for k, dtype in outputs.items()}

    return tf.function(call, input_signature=[spec]).get_concrete_function()


def save(path: str, model: dict, methods: dict[str, str] | None = None, renames: dict[str, str] | None = None,
         features: tuple[str, ...] = EXAMPLE_FEATURES) -> str:
    """`model` saved at `path`, its signatures' method names set (classification: classify, as
    tfpipe's export does) and serving_default's input keys renamed (graph name -> key)."""
    import tensorflow as tf

    module = tf.Module()
    sigs = {key: _function(ins, outs, features) for key, (ins, outs) in model.items()}
    tf.saved_model.save(module, path, signatures=sigs)
    methods = {"classification": CLASSIFY, **(methods or {})}
    rewrite(path, lambda sig_defs: _finish(sig_defs, methods, renames or {}))
    return path


def _finish(sig_defs, methods: dict[str, str], renames: dict[str, str]) -> None:
    for key, method in methods.items():
        if key in sig_defs:
            sig_defs[key].method_name = method
    inputs = sig_defs["serving_default"].inputs
    for old, new in renames.items():
        inputs[new].CopyFrom(inputs[old])
        del inputs[old]


def rewrite(path: str, edit) -> None:
    """Calls `edit` with the signature_def map of the saved_model.pb at `path`, writes it back."""
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(path, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        proto.ParseFromString(f.read())
    edit(proto.meta_graphs[0].signature_def)
    with open(pb, "wb") as f:
        f.write(proto.SerializeToString())


CANDIDATES = {  # name -> (model, save's keywords)
    "identical": (BASELINE, {}),
    "input removed": (variant(serving_default=raw(drop=("sex",))), {}),
    "input renamed": (variant(serving_default=raw(drop=("sex",), inputs={"gender": ("string", [None])})), {}),
    "input retyped": (variant(serving_default=raw(inputs={"bill": ("string", [None])})), {}),
    "input rank changed": (variant(serving_default=raw(inputs={"bill": ("float32", [None, 1])})), {}),
    "input dim fixed": (variant(serving_default=raw(inputs={"bill": ("float32", [8])})), {}),
    "output removed": (variant(serving_default=raw(drop=("label",))), {}),
    "output retyped": (variant(serving_default=raw(outputs={"score": "float64"})), {}),
    "signature removed": (variant(classification=None), {}),
    "method changed": (BASELINE, {"methods": {"classification": PREDICT}}),
    "raw input added": (variant(serving_default=raw(inputs={"island": ("string", [None])})), {}),
    "example feature added": (BASELINE, {"features": ("bill", "island")}),
    "tensor beside examples": (variant(predict_examples=({"examples": ("string", [None]), "k": ("int64", [None])},
                                                         {"score": "float32"})), {}),
    "new signature and output": (variant(serving_default=raw(outputs={"extra": "int64"}),
                                         regression=({"inputs": ("string", [None])}, {"outputs": "float32"})),
                                 {"methods": {"regression": "tensorflow/serving/regress"}}),
    "many": (variant(serving_default=raw(drop=("sex", "score")), classification=None), {}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Every model of the module saved once: "baseline", each of CANDIDATES, and the two of the
    key test (serving_default's inputs under columns' own names, as tfpipe's exports have them)."""
    root = tmp_path_factory.mktemp("signature_diff")
    paths = {"baseline": save(str(root / "baseline"), BASELINE)}
    for i, (name, (model, kw)) in enumerate(CANDIDATES.items()):
        paths[name] = save(str(root / f"candidate{i}"), model, **kw)
    columns = {"bill": "Sepal.Length", "sex": "wind speed"}
    paths["columns"] = save(str(root / "columns"), BASELINE, renames=columns)
    paths["columns, one lost"] = save(str(root / "columns1"), variant(serving_default=raw(drop=("sex",))),
                                      renames={"bill": "Sepal.Length"})
    return paths


@pytest.mark.parametrize("candidate, expected", [
    ("identical", []),
    ("input removed", [Break("serving_default", "input removed", "sex")]),
    ("input renamed", [Break("serving_default", "input added", "gender", "DT_STRING, shape [-1]"),
                       Break("serving_default", "input removed", "sex")]),
    ("input retyped", [Break("serving_default", "input retyped", "bill", "DT_FLOAT -> DT_STRING")]),
    ("input rank changed", [Break("serving_default", "input reshaped", "bill", "rank 1 -> rank 2")]),
    ("input dim fixed", [Break("serving_default", "input reshaped", "bill", "shape [-1] -> [8]")]),
    ("output removed", [Break("serving_default", "output removed", "label")]),
    ("output retyped", [Break("serving_default", "output retyped", "score", "DT_FLOAT -> DT_DOUBLE")]),
    ("signature removed", [Break("classification", "signature removed", None)]),
    ("method changed", [Break("classification", "method changed", None, f"{CLASSIFY} -> {PREDICT}")]),
    ("raw input added", [Break("serving_default", "input added", "island", "DT_STRING, shape [-1]")]),
    ("example feature added", []),
    ("tensor beside examples", [Break("predict_examples", "input added", "k", "DT_INT64, shape [-1]")]),
    ("new signature and output", []),
    ("many", [Break("classification", "signature removed", None),
              Break("serving_default", "input removed", "sex"),
              Break("serving_default", "output removed", "score")]),
])
def test_breaking_changes(models, candidate, expected):
    assert breaking_changes(models["baseline"], models[candidate]) == expected


def test_the_models_are_what_the_cases_say(models):
    """The cases that find nothing differ from the baseline all the same: the new feature is in
    the candidate's graph (not its signature), the new signature and output are there."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(models["example feature added"], "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    assert b"island" in proto.SerializeToString()
    assert list(signatures(models["example feature added"])["predict_examples"].inputs) == ["examples"]
    sigs = signatures(models["new signature and output"])
    assert set(sigs) == {"serving_default", "predict_examples", "classification", "regression"}
    assert "extra" in sigs["serving_default"].outputs
    assert sigs["classification"].method_name == CLASSIFY  # as tfpipe's export leaves it


def test_the_other_way_round_what_was_new_is_missing(models):
    """Swapped, the cases that broke nothing do: the candidate lacks what was new."""
    assert [b.text() for b in breaking_changes(models["new signature and output"], models["baseline"])] == [
        "regression: signature removed", "serving_default: output 'extra' removed"]
    assert breaking_changes(models["raw input added"], models["baseline"]) == [
        Break("serving_default", "input removed", "island")]


def test_keys_with_dots_and_spaces_come_through(models):
    sigs = signatures(models["columns"])
    assert set(sigs["serving_default"].inputs) == {"Sepal.Length", "wind speed"}
    assert "__saved_model_init_op" not in sigs  # TensorFlow's own, no client's
    assert breaking_changes(models["columns"], models["columns"]) == []
    breaks = breaking_changes(models["columns"], models["columns, one lost"])
    assert [b.text() for b in breaks] == ["serving_default: input 'wind speed' removed"]
    # against the model whose keys are the graph names, each column shows as removed and added
    assert [(b.kind, b.name) for b in breaking_changes(models["columns"], models["baseline"])] == [
        ("input added", "bill"), ("input added", "sex"),
        ("input removed", "Sepal.Length"), ("input removed", "wind speed")]


def test_an_input_with_a_default_is_optional(models, tmp_path):
    """An added input the SignatureDef gives a default is no break (requests may leave it out);
    dropping the default of an input the baseline had one for is."""
    import shutil

    import tensorflow as tf

    def give_default(name):
        return lambda sig_defs: sig_defs["serving_default"].defaults[name].CopyFrom(tf.make_tensor_proto([""]))

    added = str(tmp_path / "added")
    shutil.copytree(models["raw input added"], added)
    rewrite(added, give_default("island"))
    assert breaking_changes(models["baseline"], added) == []
    baseline = str(tmp_path / "baseline")
    shutil.copytree(models["baseline"], baseline)
    rewrite(baseline, give_default("sex"))
    assert breaking_changes(baseline, models["baseline"]) == [
        Break("serving_default", "input default removed", "sex")]


def test_texts_and_the_sentence(models):
    breaks = breaking_changes(models["baseline"], models["many"]) + breaking_changes(
        models["baseline"], models["input retyped"]) + breaking_changes(models["baseline"], models["method changed"])
    assert [b.text() for b in breaks] == [
        "classification: signature removed",
        "serving_default: input 'sex' removed",
        "serving_default: output 'score' removed",
        "serving_default: input 'bill' retyped (DT_FLOAT -> DT_STRING)",
        f"classification: method changed ({CLASSIFY} -> {PREDICT})"]
    assert describe(breaks[:2]) == ("the candidate would break the baseline's clients: "
                                    "classification: signature removed; serving_default: input 'sex' removed")
    assert "would break" not in describe([])


def _shape(dims):
    from tensorflow.core.framework import tensor_shape_pb2

    if dims is None:
        return tensor_shape_pb2.TensorShapeProto(unknown_rank=True)
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])


@pytest.mark.parametrize("old, new, detail", [
    ([-1], [-1], ""),
    ([3], [-1], ""),  # a size that became unknown takes what it took
    ([-1, 3], [-1, 3], ""),
    ([-1], [4], "shape [-1] -> [4]"),  # clients sent batches of any size
    ([-1, 3], [-1, 4], "shape [-1, 3] -> [-1, 4]"),
    ([-1], [-1, 1], "rank 1 -> rank 2"),
    ([], [-1], "rank 0 -> rank 1"),
    (None, [-1], ""),  # an unknown rank on either side is no break
    ([-1, 2], None, ""),
])
def test_shape_rules(old, new, detail):
    from tfpipe.export.signature_diff import _reshaped

    assert _reshaped(_shape(old), _shape(new)) == detail


def test_no_saved_model_or_no_serve_graph(models, tmp_path):
    import shutil

    with pytest.raises(FileNotFoundError, match="holds no saved_model.pb"):
        signatures(str(tmp_path))
    other = str(tmp_path / "other")
    shutil.copytree(models["baseline"], other)
    from tensorflow.core.protobuf import saved_model_pb2

    pb = os.path.join(other, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(pb, "rb") as f:
        proto.ParseFromString(f.read())
    proto.meta_graphs[0].meta_info_def.tags[:] = ["train"]
    with open(pb, "wb") as f:
        f.write(proto.SerializeToString())
    with pytest.raises(LookupError, match=r"no meta graph tagged \{ serve \}.*\{ train \}"):
        breaking_changes(models["baseline"], other)
