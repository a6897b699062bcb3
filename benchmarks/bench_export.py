"""Benchmark the TFLite variants of a Chicago taxi model against float32 TFLite and the
SavedModel called in-process, in one run.

    python benchmarks/bench_export.py [--hidden 256,128]
    python benchmarks/bench_export.py --images 4000 [--image-size 64] [--filters 32,64,128]

Runs tfpipe data (if needed), tfpipe train and tfpipe export with every variant, then
prints per variant: size ratio against float32 (target int8 <= 0.3x), accuracy drop
against the SavedModel (target <= 1 point), and single-example latency ratios against
float32 TFLite and against the SavedModel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--images", type=int, help="an image CNN on this many generated images instead of taxi rows")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--filters", default="32,64,128", help="the image CNN's filters per block (--images)")
    ap.add_argument("--time-limit", type=float, default=90, help="seconds of training for the image CNN (--images)")
    args = ap.parse_args()
    from tfpipe.export.config import ExportConfig
    from tfpipe.export.job import run as export
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run as data
    from tfpipe.train.config import TrainConfig, parse_int_list
    from tfpipe.train.job import run as train

    work = os.path.join(ROOT, ".bench", "export")
    if args.images:
        sys.path.insert(0, HERE)
        from bench_data import image_data_dir

        d = image_data_dir(args.images, args.image_size)
        t = train(TrainConfig(data=d, out=os.path.join(work, f"train-images-{args.images}-{args.filters}"),
                              filters=parse_int_list(args.filters), batch_size=64, time_limit=args.time_limit),
                  log=lambda _: None).outputs.path
        name, what = "images", f"image CNN {args.filters}, {args.image_size}x{args.image_size} pixels"
    else:
        csv = os.path.join(ROOT, "examples", "data", "chicago_taxi", "data.csv")
        d = data(DataConfig(input=[csv], label="big_tipper", exclude=["tips"], out=os.path.join(work, "data")),
                 log=lambda _: None).outputs.path
        t = train(TrainConfig(data=d, out=os.path.join(work, f"train-{args.hidden}"),
                              hidden=parse_int_list(args.hidden), time_limit=60), log=lambda _: None).outputs.path
        name, what = "taxi", f"Chicago taxi, hidden {args.hidden}"
    shutil.rmtree(os.path.join(work, "models", name), ignore_errors=True)
    done = export(ExportConfig(model=t, data=d, base=os.path.join(work, "models"), name=name,
                               max_accuracy_drop=1.0), log=lambda _: None)
    rows = {r["variant"]: r for r in json.load(open(done.manifest))["variants"]}
    f32, sm = rows["float32"], rows["savedmodel"]
    from tfpipe.train.devices import cpu_features

    cpu = cpu_features()
    print(f"CPU: {cpu['model']}; instruction sets: {', '.join(cpu['features']) or 'none listed'}")
    print(f"{what}; test accuracy of the SavedModel {sm['accuracy']:.4f}\n"
          f"(drop: accuracy points lost against the SavedModel; targets: int8 size <= 0.3x "
          f"float32, drop <= 1 point)\n")
    print(f"{'variant':11s} {'size':>9s} {'vs f32':>7s} {'accuracy':>9s} {'drop':>7s} "
          f"{'p50 ms':>8s} {'p99 ms':>8s} {'p50 vs f32':>10s} {'p50 vs SavedModel':>17s}")
    for name in ("savedmodel", "float32", "float16", "dynamic", "int8"):
        r = rows[name]
        print(f"{name:11s} {r['bytes'] / 1024:>7.1f}KB {r['bytes'] / f32['bytes']:>6.3f}x {r['accuracy']:>9.4f} "
              f"{r['drop'] * 100:>+6.2f}p {r['latency_ms_p50']:>8.3f} {r['latency_ms_p99']:>8.3f} "
              f"{r['latency_ms_p50'] / f32['latency_ms_p50']:>9.2f}x {r['latency_ms_p50'] / sm['latency_ms_p50']:>16.3f}x")


if __name__ == "__main__":
    main()
