"""The worker-restart test, run again and again while busy loops spin on every core (what `stress
--cpu N` does): it waits on the worker's readiness, not on time, so it passes however slowly the
replacement starts; 20 passes in a row under such load is the bar.

    python benchmarks/repeat_restart.py [--runs 20] [--busy 2]

Each run is a pytest process of its own (`-n 0`), so each starts the two-worker server afresh too.
Prints each run's result and time, then passes/runs and the total time; exit 1 if a run failed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST = "tests/test_serve_workers.py::test_a_killed_worker_is_started_again"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy loops (default: one per core)")
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    times, failed = [], []
    started = time.monotonic()
    try:
        for run in range(1, args.runs + 1):
            t0 = time.monotonic()
            res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", TEST],
                                 cwd=ROOT, capture_output=True, text=True)
            times.append(time.monotonic() - t0)
            print(f"run {run:2d}: {'passed' if res.returncode == 0 else 'FAILED'} in {times[-1]:.1f} s", flush=True)
            if res.returncode != 0:
                failed.append(run)
                print("\n".join((res.stdout + res.stderr).splitlines()[-40:]), flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    total = time.monotonic() - started
    print(f"{args.runs - len(failed)}/{args.runs} passed with {args.busy} busy loop(s) spinning, in {total:.0f} s "
          f"(a run: median {statistics.median(times):.1f} s, longest {max(times):.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
