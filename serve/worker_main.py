"""One worker of `tfpipe serve --workers N`: the embedded server on the options the supervisor
passes as JSON (see tfpipe.serve.workers).

    python -m tfpipe.serve.worker_main OPTIONS_JSON
"""

from __future__ import annotations

import sys

from tfpipe.serve.server import run_embedded
from tfpipe.serve.workers import options_from_spec

if __name__ == "__main__":
    sys.exit(run_embedded(options_from_spec(sys.argv[1]), log=lambda line: print(line, flush=True)))
