"""Resident memory of `tfpipe serve` across hot reloads, on the Chicago taxi model, in one run.

    python benchmarks/bench_reload.py [--reloads 20] [--clients 4]

Needs the model bench_export.py writes (.bench/export/models/taxi; bench_serve.py builds it
when missing). For batching off and then on, a server (its own process on 127.0.0.1, polling
its base path every second) serves version 1 while `--clients` REST clients send one real
eval row each, back to back; versions 2..N+1 are published one after another (copied beside
the base path, then renamed into it), each once the previous one has taken over. After every
reload the server's RSS is read five times, 0.1 s apart, and the least kept. Printed per
mode: RSS after the first and the last reload, the growth between them, and one model's
size (the median growth of RSS the server measured while a version loaded; target: growth
within one model's size), requests and failures, and the live-servable count at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the reload helpers the reload test uses

import bench_serve  # noqa: E402
import requests  # noqa: E402
from reloading import metric, metrics_readings, publish_and_wait  # noqa: E402


def run(source: str, bodies: list[str], batching: bool, reloads: int, clients: int, tmp: str) -> dict:
    base = os.path.join(tmp, "taxi")
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(source, os.path.join(base, "1"))
    with open(os.path.join(tmp, "monitoring.config"), "w") as f:
        f.write("prometheus_config { enable: true }\n")
    flags = ["--host=127.0.0.1", "--port=-1", "--rest_api_port=-1", "--model_name=taxi", f"--model_base_path={base}",
             "--file_system_poll_wait_seconds=1", f"--monitoring_config_file={tmp}/monitoring.config"]
    if batching:
        with open(os.path.join(tmp, "batching.config"), "w") as f:
            f.write("max_batch_size { value: 32 }\nbatch_timeout_micros { value: 2000 }\n"
                    "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 1000 }\n")
        flags += ["--enable_batching", f"--batching_parameters_file={tmp}/batching.config"]
    proc, ports = bench_serve.start([sys.executable, "-m", "tfpipe.cli", "serve", *flags], r"at:?\s*[\d.]+:(\d+)", 2)
    url = f"http://127.0.0.1:{ports[1]}"
    stop, done, failed = threading.Event(), [0], [0]

    def client(k: int):
        session = requests.Session()
        i = k
        while not stop.is_set():
            r = session.post(f"{url}/v1/models/taxi:predict", data=bodies[i % len(bodies)], timeout=60)
            done[0] += 1
            failed[0] += r.status_code != 200
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    rss, sizes = [], []
    try:
        for version in range(2, reloads + 2):
            publish_and_wait(source, base, version, url, "taxi", timeout=120)
            texts = metrics_readings(url)
            rss.append(min(metric(t, "process_resident_memory_bytes")[0] for t in texts))
            sizes += metric(texts[-1], "tfpipe_serving_model_load_rss_bytes")
            print(f"  reload {version - 1:2d}: RSS {rss[-1] / 2**20:7.1f} MiB", flush=True)
        live = metric(requests.get(f"{url}/monitoring/prometheus/metrics", timeout=30).text,
                       "tfpipe_serving_live_servables")[0]
    finally:
        stop.set()
        for t in threads:
            t.join()
        proc.terminate()
        proc.wait()
    return {"rss": rss, "model": statistics.median(sizes), "requests": done[0], "failed": failed[0], "live": live}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reloads", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--batching", choices=("off", "on", "both"), default="both")
    args = ap.parse_args()
    source = bench_serve.model_dir()
    bodies = [bench_serve.rest_body(r) for r in bench_serve.payloads(source)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for batching in {"off": (False,), "on": (True,), "both": (False, True)}[args.batching]:
            print(f"batching {'on' if batching else 'off'}: {args.reloads} hot reloads under {args.clients} REST clients")
            results[batching] = run(source, bodies, batching, args.reloads, args.clients, tmp)
    print(f"\nRSS across {args.reloads} hot reloads of the Chicago taxi model ({os.path.basename(source)}), "
          f"{args.clients} REST clients throughout")
    for batching, r in results.items():
        growth = r["rss"][-1] - r["rss"][0]
        print(f"  batching {'on ' if batching else 'off'}: after reload 1 {r['rss'][0] / 2**20:.1f} MiB, after reload "
              f"{len(r['rss'])} {r['rss'][-1] / 2**20:.1f} MiB, growth {growth / 2**20:+.1f} MiB; one model "
              f"{r['model'] / 2**20:.1f} MiB -> growth/model {growth / r['model']:.2f} (target <= 1); "
              f"{r['requests']} requests, {r['failed']} failed; live servables at the end {r['live']:.0f}")


if __name__ == "__main__":
    main()
