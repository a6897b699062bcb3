"""One worker of `tfpipe serve --workers N`: the embedded server on the options the supervisor
passes as JSON (`ServeOptions.to_json`; the group: tfpipe.serve.worker_group).

    python -m tfpipe.serve.worker_main OPTIONS_JSON

TensorFlow's import chatter is silenced as in a single process, unless the supervisor runs
with --debug (DEBUG_ENV).
"""

from __future__ import annotations

import os
import sys

from tfpipe import quiet_native_stderr
from tfpipe.serve.worker_group import DEBUG_ENV, options_from_spec

if __name__ == "__main__":
    with quiet_native_stderr(os.environ.get(DEBUG_ENV) != "1"):
        from tfpipe.serve.server import run_embedded
    sys.exit(run_embedded(options_from_spec(sys.argv[1]), log=lambda line: print(line, flush=True)))
