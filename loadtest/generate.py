"""The load generator's entry point: `python -m tfpipe.loadtest.generate step SPEC RESULT` runs
one step (a StepSpec as JSON, the result written as JSON); `... worker HOST:PORT [--once]` is
a locust worker for a master on another machine. gevent's monkey-patching must come before
locust and the socket modules are imported, so it happens here, in the generator's own
process, and the generator module is imported only after it; so does loading TF Serving's
messages without TensorFlow's runtime (serving_protos.py), which this process never uses."""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tfpipe.loadtest.generate", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    step = commands.add_parser("step", help="run one load step")
    step.add_argument("spec", help="the step's StepSpec, a JSON file")
    step.add_argument("result", help="where the result goes (JSON)")
    worker = commands.add_parser("worker", help="a locust worker for a tfpipe loadtest master")
    worker.add_argument("master", metavar="HOST:PORT")
    worker.add_argument("--once", action="store_true", help="stop after one step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from gevent import monkey

    monkey.patch_all()
    from tfpipe.loadtest.serving_protos import without_tensorflow_runtime

    without_tensorflow_runtime()  # the gRPC users need TF Serving's messages, never TensorFlow itself
    from tfpipe.loadtest import generator
    from tfpipe.loadtest.protocol import StepSpec

    from tfpipe.files import write_json
    from tfpipe.loadtest.errors import LoadtestError

    try:
        if args.command == "worker":
            return generator.worker(args.master, once=args.once)
        with open(args.spec) as f:
            spec = StepSpec.from_json(json.load(f))
        result = generator.run(spec)
    except LoadtestError as e:  # its last line is what the parent shows
        print(e, file=sys.stderr, flush=True)
        return 1
    write_json(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
