"""Compare training choices on the gallery's tables: each table's data dir is made once, then
trained with each choice and seed on the same splits, and the trained model is scored on the test split.

    python benchmarks/bench_scaling.py                                  --scaling auto, log, standard
    python benchmarks/bench_scaling.py --only hitters,ames --seeds 1,2,42
    python benchmarks/bench_scaling.py --choices '{"scaling": "log"}' '{}' '{"dropout": 0.1}'

A choice is a JSON object of `tfpipe train` settings (TrainConfig fields), `{}` for the defaults.
For each table (benchmarks/gallery.py; image folders are left out) it runs the data stage as
`tfpipe run` would (the file and its label, nothing else), then for each choice and seed trains a
model (train.job.run, in this process) and scores model.keras on the test split: accuracy, or
RMSE. Training is not bit-deterministic from run to run unless --deterministic is a choice's
setting, so the seeds say how far a score moves by chance. One line per table and choice:
every seed's score and their mean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gallery  # noqa: E402

DEFAULT_CHOICES = ('{"scaling": "auto"}', '{"scaling": "log"}', '{"scaling": "standard"}')


def data_dir(written: gallery.Written, root: str) -> str:
    from tfpipe.pipeline.config import DataConfig
    from tfpipe.pipeline.job import run

    out = os.path.join(root, "data", written.entry.name)
    return run(DataConfig(input=[written.path], label=written.entry.label, out=out), log=lambda _: None).outputs.path


def test_score(data: str, train_out: str, splits: dict) -> float:
    """model.keras's accuracy (its most probable class) or RMSE on the test split."""
    import keras
    import numpy as np

    from bench_tables import score
    from tfpipe.pipeline.schema import load_schema
    from tfpipe.train.model import numpy_batch

    schema = load_schema(os.path.join(data, "schema.json"))
    model = keras.saving.load_model(os.path.join(train_out, "model.keras"))
    out = np.asarray(model.predict(numpy_batch(schema, splits["test"]), verbose=0))
    truth = [r[splits["label"]] for r in splits["test"]]
    if splits["task"] == "regression":
        return score("regression", truth, out.reshape(-1).tolist())
    index = (out.reshape(-1) > 0.5).astype(int) if splits["task"] == "binary" else out.argmax(-1)
    return score(splits["task"], truth, [str(schema.label.classes[i]) for i in index])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="NAME[,NAME]", help="comma list of gallery tables (default: every table)")
    p.add_argument("--choices", nargs="+", default=list(DEFAULT_CHOICES), metavar="JSON",
                   help="training settings to compare, one JSON object each (default: the three --scaling values)")
    p.add_argument("--seeds", default="1,2", metavar="N,N", help="seeds each choice trains with (default: 1,2)")
    p.add_argument("--workdir-root", metavar="DIR", help="where the gallery files and data dirs go, kept "
                   "afterwards (default: a temporary folder, removed at the end)")
    p.add_argument("--json", metavar="PATH", help="also write every score as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    choices = [json.loads(c) for c in args.choices]
    seeds = [int(s) for s in args.seeds.split(",")]
    entries = [e for e in gallery.select(args.only) if e.task != "images"]
    root = os.path.abspath(args.workdir_root) if args.workdir_root else tempfile.mkdtemp(prefix="bench-scaling-")
    results = []
    try:
        from bench_tables import load_splits
        from tfpipe.train.config import TrainConfig
        from tfpipe.train.job import run as train

        written = gallery.write_gallery(os.path.join(root, "gallery"), ",".join(e.name for e in entries))
        print(f"{'table':<20} {'metric':<8} {'choice':<28} {'seeds ' + args.seeds:<28} mean", flush=True)
        for w in written:
            data = data_dir(w, root)
            splits = load_splits(data)
            metric = "rmse" if splits["task"] == "regression" else "accuracy"
            for choice in choices:
                scores = []
                for seed in seeds:
                    out = os.path.join(root, "train")
                    shutil.rmtree(out, ignore_errors=True)
                    train(TrainConfig(**{"data": data, "out": out, "seed": seed, "force": True, **choice}),
                          log=lambda _: None)
                    scores.append(test_score(data, out, splits))
                mean = sum(scores) / len(scores)
                results.append({"table": w.entry.name, "metric": metric, "choice": choice, "seeds": seeds,
                                "scores": scores, "mean": mean})
                shown = " ".join(f"{s:.4g}" for s in scores)
                print(f"{w.entry.name:<20} {metric:<8} {json.dumps(choice):<28} {shown:<28} {mean:.4g}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        if not args.workdir_root:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
