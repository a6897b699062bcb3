"""Batching tuned by measurement against the batching guide's starting point, in one run.

    python benchmarks/bench_tune.py [--models taxi,digits] [--trials 20] [--clients 32]

Runs `tfpipe tune` on the Chicago taxi model (gRPC, p99<50ms) and the digits CNN (REST,
p99<100ms), as `tfpipe run --config examples/chicago_taxi.toml` and examples/digits.toml
leave them in runs/ (run those first). Prints, per model, the start (TF Serving's batching
guide CPU starting point: max_batch_size 32, batch_timeout_micros 0, num_batch_threads =
cores) and the best candidate's throughput within the SLO, each the mean of its trials, their
ratio (target >= 1.3x) and the trial count (target <= 20). Every trial is in runs/tune-NAME/.
The load generator shares the machine's cores with the server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "taxi": {"name": "chicago_taxi", "workdir": "runs/chicago_taxi", "protocol": "grpc", "slo": "p99<50ms"},
    "digits": {"name": "digits", "workdir": "runs/digits", "protocol": "rest", "slo": "p99<100ms"},
}


def tune(key: str, trials: int, clients: int) -> dict:
    m = MODELS[key]
    work = os.path.join(ROOT, m["workdir"])
    base = os.path.join(work, "export", "models", m["name"])
    if not os.path.isdir(base):
        sys.exit(f"{base} is missing: run tfpipe run --config examples/{m['name']}.toml first")
    out = os.path.join(ROOT, "runs", f"tune-{key}")
    cmd = [sys.executable, "-m", "tfpipe.cli", "tune", "--model_name", m["name"], "--model_base_path", base,
           "--data", os.path.join(work, "data"), "--protocol", m["protocol"], "--slo", m["slo"],
           "--clients", str(clients), "--trials", str(trials), "--out", out]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT)
    with open(os.path.join(out, "tune.json")) as f:
        return json.load(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="taxi,digits")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--clients", type=int, default=32)
    args = ap.parse_args()
    results = {key: tune(key, args.trials, args.clients) for key in args.models.split(",")}
    print(f"\n{'model':<8} {'SLO':<10} {'start req/s':>11} {'best req/s':>10} {'ratio':>6} {'trials':>6}  best")
    for key, r in results.items():
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "n/a"
        print(f"{key:<8} {r['config']['slo']:<10} {r['start']['score_rps']:>11.0f} {r['best']['score_rps']:>10.0f} "
              f"{ratio:>6} {len(r['trials']):>6}  {r['best']['label']} (target >= 1.3x in <= 20 trials)")


if __name__ == "__main__":
    main()
