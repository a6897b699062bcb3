"""`tfpipe export`: a versioned SavedModel published atomically, with warmup records.

Everything is written to a non-numeric directory beside the version (TF Serving ignores
it), synced, checked (the SavedModel reloaded from disk must predict what the Keras model
predicts on the test split), then renamed to the version number: a server polling the
base path never sees half a version.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timezone
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from tfpipe.export.baseline import better_than_baseline, metric_format, test_record
from tfpipe.intervals import interval_text
from tfpipe.export.config import ExportConfig
from tfpipe.export.errors import ExportError
from tfpipe.export.inputs import HIGH_WATER, check_inputs, choose_version
from tfpipe.export.judge import decide, gate_lines, judge, keep_test_data
from tfpipe.export.signatures import ServingModule, boolean_spellings, finish_signatures, input_renames
from tfpipe import __version__
from tfpipe import versions
from tfpipe.files import publish_dir, read_json, temp_dir, write_atomic, write_json
from tfpipe.prediction_logs import WARMUP_FILE
from tfpipe.stage import ExportOutputs, StageResult
from tfpipe.train import model as _registers_custom_layers  # noqa: F401  (ImputeNormalize for load_model)
from tfpipe.train.data import make_dataset


def run(config: ExportConfig, log: Callable[[str], None] = print) -> StageResult:
    """Export: a new version published, and its result (the version served after it, and the gate's
    decision; code 1 when the gate held or refused the new version)."""
    return result(_run(config, log))


def _run(config: ExportConfig, log: Callable[[str], None]) -> str:
    """Export; the directory the new version was published to: BASE/NAME/VERSION when it is
    served, BASE/NAME/candidates/VERSION when the gate held or refused it (tfpipe/versions.py)."""
    started = time.time()
    train_dir, data, model_dir = check_inputs(config)
    version = choose_version(model_dir, config.version)
    model = keras.models.load_model(os.path.join(train_dir, "model.keras"))
    baseline = versions.served(model_dir)
    log(f"exporting {config.name} version {version} to {model_dir}"
        + (f" (version {baseline} is served there: the new one is judged against it)" if baseline else ""))
    # A non-numeric sibling (TF Serving passes over it) until it is judged and published.
    tmp = temp_dir(os.path.join(model_dir, str(version)))
    # With a version served, a model no better than the trivial baseline is held by the gate (kept,
    # exit 1) rather than refused outright: the build leaves that check to `_judge`.
    build = config if baseline is None else config.model_copy(update={"allow_weak": None})
    try:
        if data.images:
            from tfpipe.export.images import export_images

            parts = export_images(tmp, model, data, build, log)
        else:
            parts = _export_rows(tmp, model, data, build, log, _served_dtypes(model_dir, baseline))
        check, warm = parts["reload_check"], parts["warmup_records"]
        parts["test_data"] = keep_test_data(tmp, data)
        gate, decision, why = _judge(tmp, model_dir, baseline, data, parts.get("test"), config, log)
        with versions.locked(model_dir):
            if decision in ("promoted", "passed") and versions.served(model_dir) != baseline:
                # a version put in service meanwhile (a rollback by hand): this one was judged against another
                decision, why = "held", (f"version {versions.served(model_dir)} was put in service while this one "
                                         f"was judged against version {baseline}: judge it again")
            manifest = {
                "stage": "export", "tfpipe_version": __version__,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "config": config.model_dump(mode="json"), "name": config.name, "version": version,
                "model_dir": model_dir,  # where it is now: tfpipe.versions.version_path (promotions move it)
                "path": (os.path.join(model_dir, str(version)) if decision in ("published", "promoted")
                         else versions.candidate_path(model_dir, version)),
                "lineage": {"train": train_dir, "train_fingerprint": read_json(os.path.join(train_dir, "train.json"))
                            .get("fingerprint"), "data_fingerprint": data.manifest["fingerprint"]},
                **parts, "baseline": baseline, "gate": gate, "decision": decision, "reason": why,
                "elapsed_s": round(time.time() - started, 2),
            }
            # The manifest is part of the version: written before the rename like everything else.
            os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
            write_json(os.path.join(tmp, "assets.extra", "export.json"), manifest)
            final = _publish(tmp, model_dir, version, baseline, decision, why)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_atomic(os.path.join(model_dir, HIGH_WATER), str(version))
    removed = _prune(model_dir, config.keep)
    log(f"  SavedModel reloaded and checked on {check['rows']} {check['split']} {'images' if data.images else 'rows'} "
        f"(max difference {check['max_abs_diff']:.2e}); {warm} warmup records")
    if removed:
        log(f"  removed old version(s) {', '.join(map(str, removed))} (--keep {config.keep})")
    log(f"wrote {final}")
    return final


def _served_dtypes(model_dir: str, baseline: int | None) -> dict[str, tf.DType] | None:
    """The served version's serving_default input dtypes, by input name (None: no version served)."""
    if baseline is None:
        return None
    from tfpipe.export.signature_diff import signatures

    inputs = signatures(versions.version_path(model_dir, baseline)).get("serving_default")
    return {k: tf.as_dtype(v.dtype) for k, v in inputs.inputs.items()} if inputs is not None else None


def _judge(tmp: str, model_dir: str, baseline: int | None, data, test: dict[str, Any] | None, config: ExportConfig,
           log) -> tuple[dict[str, Any] | None, str, str]:
    """(the gate's record, the decision, why) for the new version built in `tmp`; with no version
    served yet there is nothing to judge against: published, as on the first day. `test`: the new
    version's own test record, against the trivial baseline."""
    if baseline is None:
        return None, "published", "the first version of this model"
    gate = judge(tmp, versions.version_path(model_dir, baseline), data, config, log)
    if test and not config.allow_weak and not better_than_baseline(test, test["baseline"]):
        metric = "rmse" if "rmse" in test else "accuracy"
        gate["passed"] = False
        gate["failed"].append(f"the new {test['split']} split: {metric} {test[metric]:.4g}, no better than "
                              f"{test['baseline']['predicts']} ({test['baseline'][metric]:.4g})")
    decision, why = decide(gate, config)
    for line in gate_lines(gate, baseline):
        log(line)
    log(f"  {decision}: {why}")
    return gate, decision, why


def _publish(tmp: str, model_dir: str, version: int, baseline: int | None, decision: str, why: str) -> str:
    """Publish `tmp` as a candidate, then (published, promoted) serve it, recording the event in the
    model's history; returns where it is. Called holding the model's rollout lock."""
    candidate = versions.candidate_path(model_dir, version)
    os.makedirs(os.path.dirname(candidate), exist_ok=True)
    publish_dir(tmp, candidate)  # synced, then the atomic rename: TF Serving does not look in candidates/
    if decision in ("published", "promoted"):
        versions.serve_version(model_dir, version, decision, why)
        return os.path.join(model_dir, str(version))
    versions.record(model_dir, "passed offline" if decision == "passed" else decision, version, why,
                    served_before=baseline)
    return candidate


def _export_rows(tmp: str, model: keras.Model, data, config: ExportConfig, log,
                 keep: dict[str, tf.DType] | None = None) -> dict[str, Any]:
    """The SavedModel of a tabular model, its warmup records, reload check and TFLite variants;
    `keep`: the served version's input dtypes (signatures.serving_dtype)."""
    from tfpipe.export.tflite import block_model

    # The signatures call the trained layers with every number's normalisation as one block (the
    # reload check below holds its answers to the trained model's).
    module = ServingModule(block_model(model, data.schema) or model, data.schema, keep,
                           boolean_spellings(data.schema, data.train_stats()))
    dtypes = module.dtypes
    tf.saved_model.save(module, tmp, signatures=module.signatures())
    finish_signatures(tmp, module.method_names(), input_renames(data.schema))
    warm = _write_warmup(tmp, config, data, dtypes)
    # Read back once: the reload check and the variants' baseline use the same load and rows.
    split = "test" if data.count("test") else "eval"
    raw, labels = _labelled_rows(data, split)
    loaded = tf.saved_model.load(tmp)
    check, served = _check_reload(loaded, model, data, split, raw, config.tolerance, dtypes)
    test = test_record(data.schema.label, data.train_stats()["label"], split, served, labels, config.allow_weak, log)
    kinds = sorted({c.kind for c in data.schema.features if c.kind})
    variants = config.variants_for(data.schema.label.task)
    if variants and kinds:
        log(f"  TFLite variants not built: the model parses {' and '.join(kinds)} features from strings, and "
            "TFLite's builtin ops have no string parsing (the SavedModel serves them)")
    table = _tflite_variants(tmp, loaded, model, data, split, raw, labels, config, log, dtypes) \
        if variants and not kinds else []
    return {"signatures": ["serving_default", "predict_examples", module.example_signature], "warmup_records": warm,
            "reload_check": check, "test": test, "variants": table}


def _write_warmup(tmp: str, config: ExportConfig, data, dtypes: dict[str, tf.DType]) -> int:
    """assets.extra/tf_serving_warmup_requests: PredictionLogs of real eval rows, one row each."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    if not config.warmup_records:
        return 0
    split = "eval" if data.count("eval") else "train"
    rows = _serving_rows(_labelled_rows(data, split, config.warmup_records)[0], data.schema, dtypes)
    path = os.path.join(tmp, WARMUP_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    n = 0
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(len(next(iter(rows.values())))):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=config.name, signature_name="serving_default"))
            for c in data.schema.features:
                value = rows[c.name][i:i + 1]
                request.inputs[c.name].CopyFrom(tf.make_tensor_proto(value, dtype=dtypes[c.name]))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
            n += 1
    return n


def _check_reload(loaded, model: keras.Model, data, split: str, raw: dict[str, np.ndarray],
                  tolerance: float, dtypes: dict[str, tf.DType]) -> tuple[dict[str, Any], np.ndarray]:
    """The SavedModel read back from disk must give the Keras model's predictions: the check's
    record, and the SavedModel's answers (probabilities; binary: the second class's)."""
    rows = _serving_rows(raw, data.schema, dtypes)
    served = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in rows.items()})
    keras_inputs = {c.name: (rows[c.name].astype(np.float64) if c.type == "int" else rows[c.name])
                    for c in data.schema.features}
    expected = np.asarray(model(keras_inputs, training=False))
    key = "predictions" if data.schema.label.task == "regression" else "probabilities"
    got = served[key].numpy()
    if data.schema.label.task == "binary":
        got = got[:, 1]
    if len(got) != len(expected):
        raise ExportError(f"the reloaded SavedModel gave {len(got)} answers for {len(expected)} rows")
    diff = float(np.max(np.abs(got - expected))) if len(got) else 0.0
    scale = output_scale(data)
    if not diff <= tolerance * scale:
        raise ExportError(f"the reloaded SavedModel differs from the Keras model by {diff:.3g} "
                          f"(> {tolerance:g}" + (f" x the label's scale {scale:.6g}" if scale != 1.0 else "")
                          + f") on the {split} split; nothing was published")
    return {"split": split, "rows": int(len(got)), "max_abs_diff": diff, "scale": scale}, got


def output_scale(data) -> float:
    """What --tolerance is relative to: 1 for class probabilities; for a regression, the size
    of the label's values in training (float32 carries 7 digits, so a price of 500,000 is
    exact to 0.03 at best)."""
    if data.schema.label.task != "regression":
        return 1.0
    label = data.train_stats()["label"]
    return max(1.0, abs(label.get("min") or 0.0), abs(label.get("max") or 0.0))


def _tflite_variants(tmp: str, loaded, model: keras.Model, data, split: str, raw: dict[str, np.ndarray],
                     labels: np.ndarray, config: ExportConfig, log,
                     dtypes: dict[str, tf.DType]) -> list[dict[str, Any]]:
    """Build each TFLite variant, measure it beside the SavedModel, enforce the accuracy drop."""
    from tfpipe.export.tflite import (CALIBRATION_ROWS, convert_all, device_inputs, device_model, litert_runner,
                                      measure, record_variants)

    train_raw, _ = _labelled_rows(data, "train", limit=CALIBRATION_ROWS)
    lite_model, vocabularies = device_model(model, data.schema)
    inputs = device_inputs(raw, data.schema, vocabularies)
    task = data.schema.label.task
    metric = "rmse" if task == "regression" else "accuracy"

    serve, by_example = loaded.signatures["serving_default"], loaded.signatures["predict_examples"]
    key = "predictions" if task == "regression" else "probabilities"
    examples = tf.constant(_serialized(data, split))

    def saved_all(_):
        out = by_example(examples=examples)[key].numpy()
        return out[:, 1:] if task == "binary" else out

    served_rows = _serving_rows(raw, data.schema, dtypes)
    saved = measure(lambda row: serve(**row), saved_all,
                    {k: tf.constant(v) for k, v in served_rows.items()}, labels, task)
    size_saved = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(tmp) for f in fs
                     if "assets.extra" not in r)
    table = [{"variant": "savedmodel", "bytes": size_saved, **saved, "drop": 0.0}]
    folder = os.path.join(tmp, "assets.extra", "tflite")
    os.makedirs(folder, exist_ok=True)
    write_json(os.path.join(folder, "vocabularies.json"),
               {"index": "position in the list + 1; 0 for any other value", "vocabularies": vocabularies})
    converted = convert_all(lite_model, config.variants_for(task), device_inputs(train_raw, data.schema, vocabularies),
                            input_renames(data.schema))

    def quality(blob: bytes) -> dict[str, Any]:
        one, every = litert_runner(blob)
        return measure(one, every, inputs, labels, task)

    return record_variants(table, converted, quality, metric, folder, config, log)


def _labelled_rows(data, split: str, limit: int = 100000) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Raw features (ints as float64, NaN = missing) and encoded labels of a split."""
    ds = make_dataset(data.files(split), data.schema, limit, shuffle=False, seed=0, deterministic=True).take(1)
    features, labels = next(iter(ds))
    return {k: v.numpy() for k, v in features.items()}, labels.numpy()


def _serving_rows(raw: dict[str, np.ndarray], schema, dtypes: dict[str, tf.DType]) -> dict[str, np.ndarray]:
    """Raw features (ints as float64, NaN = missing) as serving_default takes them (`dtypes`: its
    input dtypes): only the int64 inputs are converted."""
    return {c.name: (np.nan_to_num(raw[c.name]).astype(np.int64) if dtypes[c.name] == tf.int64 else raw[c.name])
            for c in schema.features}


def _serialized(data, split: str) -> list[bytes]:
    files = data.files(split)
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


def _prune(model_dir: str, keep: int | None) -> list[int]:
    """Remove old versions beyond --keep, never the one served nor the one a rollback returns to."""
    if not keep:
        return []
    with versions.locked(model_dir):
        removed = versions.prune(model_dir, keep)
        for v in removed:
            shutil.rmtree(versions.version_path(model_dir, v), ignore_errors=True)
    return removed


def quality_text(test: dict[str, Any] | None) -> str:
    """'; test accuracy 0.973 against 0.442 for the majority class' for a summary line (': NO BETTER'
    after it for a model that is not); '' without a record."""
    if not test:
        return ""
    metric = "rmse" if "rmse" in test else "accuracy"
    baseline = test["baseline"]
    trivial = "the majority class" if metric == "accuracy" else "predicting the mean"
    weak = "" if better_than_baseline(test, baseline) else ": NO BETTER"
    number = metric_format(metric)
    return (f"; {test['split']} {metric} {number(test[metric])}{interval_text(test.get('interval'), number)} on "
            f"{test['rows']:,} rows against {number(baseline[metric])} for {trivial}{weak}")


def result(final: str) -> StageResult:
    """A published version for `tfpipe run`: its name and version, the TFLite variants kept or dropped,
    and the gate's decision. A version held or refused leaves the baseline served: the outputs name
    the baseline (what the later steps serve and load-test), the stage's exit code is 1."""
    path = os.path.join(final, "assets.extra", "export.json")
    with open(path) as f:
        m = json.load(f)
    variants = [v for v in m["variants"] if v["variant"] != "savedmodel"]
    kept = [v["variant"] for v in variants if not v.get("dropped")]
    dropped = [f"{v['variant']} dropped, {v['drop']:.1%} less accurate" for v in variants if v.get("dropped")]
    summary = (f"{m['name']} version {m['version']}: SavedModel" + (f" + TFLite {', '.join(kept)}" if kept else "")
               + (f" ({'; '.join(dropped)})" if dropped else "") + quality_text(m.get("test")))
    decision, baseline = m.get("decision", "published"), m.get("baseline")
    if decision in ("held", "refused", "passed"):
        served = os.path.join(os.path.dirname(os.path.dirname(final)), str(baseline))
        summary += (f"; passed the offline gate against version {baseline}, kept as a candidate for the serving gate"
                    if decision == "passed" else f"; {decision.upper()}, version {baseline} still served: {m['reason']}")
        return StageResult(path, summary, ExportOutputs(served, m["name"], baseline, candidate=m["version"],
                                                        decision=decision), code=0 if decision == "passed" else 1)
    if decision == "promoted":
        summary += f"; promoted over version {baseline}: {m['reason']}"
    return StageResult(path, summary, ExportOutputs(final, m["name"], m["version"], candidate=m["version"],
                                                    decision=decision))
