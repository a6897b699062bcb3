"""Small SavedModels for the serving tests, built with plain TensorFlow (not tfpipe's exporter),
so the server is proven on any SavedModel laid out for TF Serving."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from tfpipe.export.signatures import finish_signatures


class Half(tf.Module):
    """TF Serving's half_plus_two: one float input `x`, one output `y`; plus a regress
    signature over tf.Examples with a float feature `x`, as TF Serving's test model has."""

    def __init__(self, b: float):
        super().__init__()
        self.a, self.b = tf.Variable(0.5), tf.Variable(b)
        self.predict = tf.function(lambda x: {"y": self.a * x + self.b},
                                   input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        self.regress = tf.function(self._regress, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    def _regress(self, inputs):
        x = tf.io.parse_example(inputs, {"x": tf.io.FixedLenFeature([], tf.float32)})["x"]
        return {"outputs": self.a * x + self.b}


class Multi(tf.Module):
    """Several named inputs and outputs of several dtypes and shapes."""

    def __init__(self):
        super().__init__()
        self.predict = tf.function(self._predict, input_signature=[{
            "a": tf.TensorSpec([None, 2], tf.float32, name="a"),
            "b": tf.TensorSpec([None], tf.int64, name="b"),
            "tag": tf.TensorSpec([None], tf.string, name="tag")}])

    def _predict(self, inputs):
        return {"sum": tf.reduce_sum(inputs["a"], axis=1) + tf.cast(inputs["b"], tf.float32),
                "double": inputs["a"] * 2.0,
                "tag_bytes": tf.strings.join([inputs["tag"], "!"]),
                "upper": tf.strings.upper(inputs["tag"])}


class Slow(tf.Module):
    """y = x + 1 after `seconds` asleep: a call holds its thread that long, so queues fill, and
    the sleep takes no CPU (a busy loop would be slower on a slower machine and would take a core
    from the server it tests). The sleep is tf.data's, an op a SavedModel keeps."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.predict = tf.function(self._predict, input_signature=[tf.TensorSpec([None], tf.float32, name="x")])

    def _predict(self, x):
        if self.seconds > 0:
            from tensorflow.python.data.experimental.ops.testing import sleep

            # the sleep comes before each element asked for, and reading the one element asks
            # twice (the second finds the end): half the time each
            x = tf.data.Dataset.from_tensors(x).apply(sleep(int(self.seconds * 1e6 / 2))).get_single_element()
        return {"y": x + 1.0}


class Busy(tf.Module):
    """y = x + 1 after a busy loop of `steps`: a call costs CPU (tens of milliseconds for 20,000
    steps), for the tests that measure what a model costs, not only how long it takes."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.predict = tf.function(self._predict, input_signature=[tf.TensorSpec([None], tf.float32, name="x")])

    def _predict(self, x):
        i, acc = tf.while_loop(lambda i, acc: i < self.steps, lambda i, acc: (i + 1, acc + 1e-9),
                               [tf.constant(0), tf.constant(0.0)])
        return {"y": x + 1.0 + acc * 0.0}


class CallRows(tf.Module):
    """A model whose answers tell how it was called: each row's `rows` (Predict) and score
    (Classify) are the number of rows in the model call that answered it; `total` (its
    `total` signature) is one number for the whole call, the sum of `x`."""

    def __init__(self):
        super().__init__()
        self.predict = tf.function(lambda x: {"rows": tf.fill(tf.shape(x), tf.cast(tf.size(x), tf.float32))},
                                   input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        self.total = tf.function(lambda x: {"total": tf.reduce_sum(x)},
                                 input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        self.classify = tf.function(self._classify, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    def _classify(self, serialized):
        n = tf.size(serialized)
        return {"classes": tf.fill([n, 1], "rows"), "scores": tf.fill([n, 1], tf.cast(n, tf.float32))}


def save_call_rows(path: str) -> str:
    m = CallRows()
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict, "total": m.total,
                                             "classification": m.classify})
    return path


class Threshold(tf.Module):
    """A classifier of one float `x`: "big" (id 1) above `t`, else "small" (0). Its predict signature
    also takes a string `island` (passed over: a column to slice by) and answers `classes`,
    `class_ids` and `probability` (sigmoid(x - t)); its `classification` signature takes tf.Examples
    with a float feature `x` and answers both classes and their scores per row."""

    def __init__(self, t: float):
        super().__init__()
        self.t = tf.Variable(t)
        self.predict = tf.function(self._predict, input_signature=[{
            "x": tf.TensorSpec([None], tf.float32, name="x"),
            "island": tf.TensorSpec([None], tf.string, name="island")}])
        self.classify = tf.function(self._classify, input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])

    def _predict(self, inputs):
        x = inputs["x"]
        big = x > self.t
        return {"classes": tf.where(big, "big", "small"), "class_ids": tf.cast(big, tf.int64),
                "probability": tf.sigmoid(x - self.t)}

    def _classify(self, serialized):
        x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([], tf.float32)})["x"]
        p = tf.sigmoid(x - self.t)
        return {"classes": tf.tile(tf.constant([["small", "big"]]), [tf.shape(x)[0], 1]),
                "scores": tf.stack([1.0 - p, p], axis=1)}


def save_threshold(path: str, t: float) -> str:
    m = Threshold(t)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict, "classification": m.classify})
    return path


def save_predict(path: str, fn) -> str:
    """A SavedModel whose serving_default is `fn(x)` on one float input `x` of shape [None]."""
    m = tf.Module()
    m.f = tf.function(fn, input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    tf.saved_model.save(m, path, signatures={"serving_default": m.f})
    return path


def save_half(path: str, b: float = 2.0, warmup: int = 0) -> str:
    m = Half(b)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict, "regress_x": m.regress})
    finish_signatures(path, {"regress_x": "tensorflow/serving/regress"}, {})
    if warmup:
        os.makedirs(os.path.join(path, "assets.extra"), exist_ok=True)
        with tf.io.TFRecordWriter(os.path.join(path, "assets.extra", "tf_serving_warmup_requests")) as w:
            for i in range(warmup):
                req = predict_pb2.PredictRequest()
                req.model_spec.name = "half"
                req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([float(i)], np.float32)))
                w.write(prediction_log_pb2.PredictionLog(
                    predict_log=prediction_log_pb2.PredictLog(request=req)).SerializeToString())
    return path


def save_multi(path: str) -> str:
    m = Multi()
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict})
    return path


def save_slow(path: str, seconds: float = 0.05) -> str:
    m = Slow(seconds)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict})
    return path


def save_busy(path: str, steps: int = 20000) -> str:
    m = Busy(steps)
    tf.saved_model.save(m, path, signatures={"serving_default": m.predict})
    return path


def publish(tmp_dir: str, final: str) -> None:
    """What an exporter does: write beside, then rename into the polled base path."""
    os.rename(tmp_dir, final)


# ---- TF Serving's own test models, built the way its testdata generator builds them ------
# (tensorflow_serving/servables/tensorflow/testdata/saved_model_half_plus_two.py): y = a*x + b
# with a=0.5, b=2 (half_plus_two) or b=3 (half_plus_three), y2 = a*x + c, y3 = a*x2 + c with
# c=3; x and x2 are parsed from tf.Examples; an asset file rides along. Versions are laid out
# as TF Serving's are: BASE/00000123/.

HALF_SIGNATURES = ("regress_x_to_y", "regress_x_to_y2", "regress_x2_to_y3", "classify_x_to_y",
                   "classify_x2_to_y3", "serving_default")


def save_half_plus_two_tf1(export_dir: str, b: float = 2.0, c: float = 3.0, classify_x2: bool = False) -> str:
    """A TF1 graph saved with SavedModelBuilder: `x` is [None, 1]; predict, classify and
    regress signatures with their method names; the tag set {serve}. `classify_x2` adds the
    classify_x2_to_y3 signature that TF Serving's two-version test model has."""
    tf1 = tf.compat.v1
    info = tf1.saved_model.utils.build_tensor_info
    build = tf1.saved_model.signature_def_utils.build_signature_def
    names = tf1.saved_model.signature_constants
    asset_file = os.path.join(tempfile.mkdtemp(prefix="half-assets-"), "foo.txt")
    with open(asset_file, "w") as f:
        f.write("asset-file-contents")
    builder = tf1.saved_model.builder.SavedModelBuilder(export_dir)
    with tf.Graph().as_default(), tf1.Session() as sess:
        a, bv, cv = tf1.Variable(0.5, name="a"), tf1.Variable(b, name="b"), tf1.Variable(c, name="c")
        serialized = tf1.placeholder(tf.string, name="tf_example")  # of unknown rank, as TF Serving's
        parsed = tf1.parse_example(serialized, {
            "x": tf1.FixedLenFeature([1], tf.float32),
            "x2": tf1.FixedLenFeature([1], tf.float32, default_value=[0.0])})
        for feature in parsed.values():  # [None, 1], as TF Serving's checked-in model has them
            feature.set_shape([None, 1])
        x = tf.identity(parsed["x"], name="x")
        y = tf.identity(a * x + bv, name="y")
        y2 = tf.identity(a * x + cv, name="y2")
        x2 = tf.identity(parsed["x2"], name="x2")
        a2, c2 = tf1.Variable(0.5, name="a2"), tf1.Variable(c, name="c2")
        y3 = tf.identity(a2 * x2 + c2, name="y3")
        filename = tf1.Variable("foo.txt", name="filename_tensor", trainable=False, collections=[])
        tf1.add_to_collection(tf1.GraphKeys.ASSET_FILEPATHS, tf.constant(asset_file))

        def regress(i, o):
            return build({names.REGRESS_INPUTS: info(i)}, {names.REGRESS_OUTPUTS: info(o)}, names.REGRESS_METHOD_NAME)

        def classify(i, o):
            return build({names.CLASSIFY_INPUTS: info(i)}, {names.CLASSIFY_OUTPUT_SCORES: info(o)},
                         names.CLASSIFY_METHOD_NAME)

        signatures = {
            "regress_x_to_y": regress(serialized, y), "regress_x_to_y2": regress(serialized, y2),
            "regress_x2_to_y3": regress(x2, y3), "classify_x_to_y": classify(serialized, y),
            "serving_default": build({"x": info(x)}, {"y": info(y)}, names.PREDICT_METHOD_NAME)}
        if classify_x2:
            signatures["classify_x2_to_y3"] = classify(x2, y3)
        sess.run(tf1.global_variables_initializer())
        builder.add_meta_graph_and_variables(
            sess, [tf1.saved_model.tag_constants.SERVING], signature_def_map=signatures,
            assets_collection=tf1.get_collection(tf1.GraphKeys.ASSET_FILEPATHS),
            main_op=tf.group(filename.assign("foo.txt")))
    builder.save()
    return export_dir


def save_half_plus_three_tf1_0(export_dir: str) -> str:
    """TF Serving's checked-in saved_model_half_plus_three as TensorFlow 1.0.0-rc2 wrote it, read
    off that file: x = Identity(ParseExample(tf_example)) with the v1 ParseExample op, y = 0.5*x + 3;
    serving_default feeds x, tensorflow/serving/regress feeds tf_example and fetches Identity(y).
    Its quirks, which newer TensorFlow reads otherwise, are put back after saving: no GraphDef
    version (producer 0: an empty Placeholder shape means unknown), TensorInfos without shapes,
    and the regress input declared DT_FLOAT though it takes serialized tf.Examples."""
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    tf1 = tf.compat.v1
    info = tf1.saved_model.utils.build_tensor_info
    build = tf1.saved_model.signature_def_utils.build_signature_def
    builder = tf1.saved_model.builder.SavedModelBuilder(export_dir)
    with tf.Graph().as_default(), tf1.Session() as sess:
        a, b, _ = tf1.Variable(0.5, name="a"), tf1.Variable(3.0, name="b"), tf1.Variable(3.0, name="c")
        serialized = tf1.placeholder(tf.string, name="tf_example")
        parsed = tf.raw_ops.ParseExample(serialized=serialized, names=tf.constant([], tf.string), sparse_keys=[],
                                         dense_keys=[tf.constant("x")], dense_defaults=[tf.constant([], tf.float32)],
                                         sparse_types=[], dense_shapes=[[1]])
        x = tf.identity(parsed.dense_values[0], name="x")
        y = tf.add(a * x, b, name="y")
        out = tf.identity(y, name="Identity")
        sess.run(tf1.global_variables_initializer())
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": build({"x": info(x)}, {"y": info(y)}, "tensorflow/serving/predict"),
            "tensorflow/serving/regress": build({"inputs": info(serialized)}, {"outputs": info(out)},
                                                "tensorflow/serving/regress")})
    builder.save()
    pb = os.path.join(export_dir, "saved_model.pb")
    model = saved_model_pb2.SavedModel.FromString(open(pb, "rb").read())
    graph = model.meta_graphs[0]
    graph.graph_def.ClearField("versions")
    for node in graph.graph_def.node:
        if node.name == "tf_example":
            node.attr["shape"].shape.Clear()
    for sig in graph.signature_def.values():
        for t in list(sig.inputs.values()) + list(sig.outputs.values()):
            t.ClearField("tensor_shape")
    graph.signature_def["tensorflow/serving/regress"].inputs["inputs"].dtype = types_pb2.DT_FLOAT
    with open(pb, "wb") as f:
        f.write(model.SerializeToString())
    return export_dir


def save_one_broken_signature(export_dir: str) -> str:
    """A TF1 graph with a good signature (x -> 2x) and one whose output needs a placeholder it does
    not take as an input, which TensorFlow cannot prune into a function."""
    tf1 = tf.compat.v1
    info = tf1.saved_model.utils.build_tensor_info
    build = tf1.saved_model.signature_def_utils.build_signature_def
    builder = tf1.saved_model.builder.SavedModelBuilder(export_dir)
    with tf.Graph().as_default(), tf1.Session() as sess:
        x = tf1.placeholder(tf.float32, [None], name="x")
        hidden = tf1.placeholder(tf.float32, [None], name="hidden")
        builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
            "serving_default": build({"x": info(x)}, {"y": info(tf.multiply(x, 2.0, name="y"))},
                                     "tensorflow/serving/predict"),
            "needs_hidden": build({"x": info(x)}, {"z": info(tf.add(x, hidden, name="z"))},
                                  "tensorflow/serving/predict")})
    builder.save()
    return export_dir


class HalfPlusTwoTF2(tf.Module):
    """The same model with native TF2 APIs: every signature's method is `predict`, `x` is [1]."""

    def __init__(self, asset_file: str):
        super().__init__()
        self.a, self.b, self.c = tf.Variable(0.5, name="a"), tf.Variable(2.0, name="b"), tf.Variable(3.0, name="c")
        self.asset = tf.saved_model.Asset(asset_file)

    def signatures(self) -> dict:
        return {"regress_x_to_y": self.regress_xy, "regress_x_to_y2": self.regress_xy2,
                "regress_x2_to_y3": self.regress_x2y3, "classify_x_to_y": self.classify_xy,
                "classify_x2_to_y3": self.classify_x2y3, "serving_default": self.predict}

    def _x(self, serialized):
        return tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32)])
    def predict(self, x):
        return {"y": self.a * x + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_xy(self, serialized):
        return {"outputs": self.a * self._x(serialized) + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def regress_xy2(self, serialized):
        return {"outputs": self.a * self._x(serialized) + self.c}

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="inputs")])
    def regress_x2y3(self, x2):
        return {"outputs": self.a * x2 + self.c}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
    def classify_xy(self, serialized):
        return {"scores": self.a * self._x(serialized) + self.b}

    @tf.function(input_signature=[tf.TensorSpec([1], tf.float32, name="inputs")])
    def classify_x2y3(self, x2):
        return {"scores": self.a * x2 + self.c}


def save_half_plus_two_tf2(export_dir: str) -> str:
    asset_file = os.path.join(tempfile.mkdtemp(prefix="half-assets-"), "foo.txt")
    with open(asset_file, "w") as f:
        f.write("asset-file-contents")
    m = HalfPlusTwoTF2(asset_file)
    tf.saved_model.save(m, export_dir, signatures=m.signatures())
    return export_dir


def build_tf_serving_testdata(root: str) -> None:
    """Every SavedModel the ported TF Serving suite serves, under `root`; run in a process of
    its own (`python tests/serving_models.py testdata ROOT`): the tf.distribute case needs two
    virtual CPUs, settled before TensorFlow's runtime starts, as in TF Serving's test. The Keras 2
    cases use tf_keras (tf.keras under TF_USE_LEGACY_KERAS=1), the Keras 3 case `keras` itself."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    j = os.path.join
    save_half_plus_two_tf1(j(root, "saved_model_half_plus_two_cpu", "00000123"))
    save_half_plus_three_tf1_0(j(root, "saved_model_half_plus_three", "00000123"))
    save_one_broken_signature(j(root, "one_broken_signature", "00000001"))
    for v in ("00000123", "00000124"):
        save_half_plus_two_tf1(j(root, "saved_model_half_plus_two_2_versions", v), classify_x2=True)
    save_half_plus_two_tf2(j(root, "saved_model_half_plus_two_tf2_cpu", "00000123"))

    # test_tf_saved_model_save: y = v1 * v2 * x with an input of unknown shape
    root_ckpt = tf.train.Checkpoint()
    root_ckpt.v1, root_ckpt.v2 = tf.Variable(3.0), tf.Variable(2.0)
    root_ckpt.f = tf.function(lambda x: {"y": root_ckpt.v1 * root_ckpt.v2 * x})
    tf.saved_model.save(root_ckpt, j(root, "tf_saved_model_save", "00000123"),
                        root_ckpt.f.get_concrete_function(tf.TensorSpec(None, tf.float32)))
    # test_tf_saved_model_save_multiple_signatures
    multi = tf.train.Checkpoint()
    multi.f = tf.function(lambda x: {"y": 1.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    multi.g = tf.function(lambda x: {"y": 2.0}, input_signature=[tf.TensorSpec(None, tf.float32)])
    tf.saved_model.save(multi, j(root, "tf_saved_model_save_multiple_signatures", "00000123"),
                        signatures={"serving_default": multi.f, "custom_signature_key": multi.g})

    # the Keras cases: an identity model named x -> y; with tf.distribute, Dense(ones) first
    import tf_keras as keras2  # what tf.keras is under TF_USE_LEGACY_KERAS=1
    model = keras2.models.Sequential([keras2.layers.Input(dtype="float32", shape=(1,), name="x"),
                                      keras2.layers.Lambda(lambda x: x, name="y")])
    tf.saved_model.save(model, j(root, "keras_sequential_saved_model_save", "00000123"))
    with tf.distribute.MirroredStrategy(devices=("/cpu:0", "/cpu:1")).scope():
        model = keras2.models.Sequential([
            keras2.layers.Input(dtype="float32", shape=(1,), name="x"),
            keras2.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros"),
            keras2.layers.Lambda(lambda x: x, name="y")])
    tf.saved_model.save(model, j(root, "keras_distrat_sequential_saved_model_save", "00000123"))
    import keras  # Keras 3: its SavedModel names the input `inputs` and the output `output_0`

    model = keras.Sequential([keras.Input(dtype="float32", shape=(1,), name="x"),
                              keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")])
    tf.saved_model.save(model, j(root, "keras3_sequential_saved_model_save", "00000123"))


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["testdata"]:
        build_tf_serving_testdata(sys.argv[2])
