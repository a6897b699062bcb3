#!/usr/bin/env bash
# The engine tests, after the main suite (which made .venv):  bash tests_engines/run.sh
#
# 1. engines/setup.sh: the engine environments (.venv-engines: Beam 2.62, no TensorFlow;
#    .venv-predict: Beam 2.62 and TensorFlow 2.20) and Beam's Flink and Spark job server jars,
#    from the package registries.
# 2. The inputs, and the reference outputs: FnApiRunner in the main environment (.venv), where a
#    small taxi model is trained and exported (TensorFlow 2.21) for the predict tests.
# 3. pytest in the engine environment, in a network namespace of its own with only loopback up:
#    Beam's Java job servers and Python worker pools listen on every interface, and nothing they
#    start is reachable from beyond this machine there.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
command -v go >/dev/null || PATH="$PATH:/usr/local/go/bin"  # Go's own install puts it there
[ -x .venv/bin/tfpipe ] || { echo "no main environment (.venv): run the main suite first"; exit 1; }
bash engines/setup.sh .venv-engines || { echo "engines/setup.sh failed"; exit 1; }
bash engines/setup.sh --predict .venv-predict || { echo "engines/setup.sh --predict failed"; exit 1; }
.venv-engines/bin/pip install -q "pytest>=8,<9.2" "pytest-timeout>=2.3" || exit 1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
.venv-engines/bin/python tests_engines/make_inputs.py "$work/inputs" || exit 1
# the options of every run, the reference's and the engines' (tests_engines/conftest.py reads them)
export TFPIPE_ENGINE_TAXI_ARGS="--label big_tipper --exclude tips --shards 4"
export TFPIPE_ENGINE_IMAGE_ARGS="--shards 4 --max-bad-fraction 0.2"
.venv/bin/tfpipe data --input "$work/inputs/taxi.csv" $TFPIPE_ENGINE_TAXI_ARGS \
  --out "$work/reference/taxi" >/dev/null || { echo "the reference run (taxi) failed"; exit 1; }
.venv/bin/tfpipe data --input "$work/inputs/images" $TFPIPE_ENGINE_IMAGE_ARGS \
  --out "$work/reference/images" >/dev/null || { echo "the reference run (images) failed"; exit 1; }
export TFPIPE_ENGINE_PREDICT_ARGS="--batch-rows 1024"
.venv/bin/tfpipe train --data "$work/reference/taxi" --out "$work/taxi-train" --epochs 2 >/dev/null \
  && .venv/bin/tfpipe export --model "$work/taxi-train" --data "$work/reference/taxi" --base "$work/models" \
    --name taxi --tflite '' >/dev/null \
  && .venv/bin/tfpipe predict --model "$work/models/taxi" --input "$work/inputs/taxi.csv" $TFPIPE_ENGINE_PREDICT_ARGS \
    --out "$work/reference/predict" >/dev/null || { echo "the reference run (predict) failed"; exit 1; }
# PROCESS workers: Beam's boot program, built from its Go module at the SDK's version (Beam ships
# it only inside its container images; the checksum database is not reachable from here, so the
# module is taken from the proxy unverified), a worker environment with Beam and no tfpipe, and
# the wheel of tfpipe's data code that the job stages for it (engines/worker_wheel.py).
beam_version="$(.venv-engines/bin/python -c 'import apache_beam; print(apache_beam.__version__)')"
GOBIN="$work/boot" GOSUMDB=off GOFLAGS=-buildvcs=false \
  go install "github.com/apache/beam/sdks/v2/python/container@v$beam_version" || { echo "Beam's boot program did not build"; exit 1; }
python3.11 -m venv "$work/worker" && "$work/worker/bin/pip" install -q -r engines/requirements.txt || exit 1
.venv-engines/bin/python engines/worker_wheel.py "$work/wheel" >/dev/null || exit 1
export TFPIPE_ENGINE_BOOT="$work/boot/container" TFPIPE_ENGINE_WORKER_ENV="$work/worker" \
  TFPIPE_ENGINE_WORKER_WHEEL="$(ls "$work"/wheel/tfpipe_data-*.whl)"
echo "setup and reference outputs: $(( $(date +%s) - started )) s"
export TFPIPE_ENGINE_INPUTS="$work/inputs" TFPIPE_ENGINE_REFERENCE="$work/reference" \
  TFPIPE_MAIN_TFPIPE="$PWD/.venv/bin/tfpipe" TFPIPE_ENGINE_MODEL="$work/models/taxi" \
  TFPIPE_ENGINE_PREDICT_ENV="$PWD/.venv-predict"
unshare --net --map-root-user bash -c 'ip link set lo up && exec .venv-engines/bin/python -m pytest -q -p no:cacheprovider tests_engines "$@"' _ "$@"
rc=$?
echo "engine tests: $(( $(date +%s) - started )) s in all"
# pytest exits 5 when it collected no tests: a failure here, as in the main suite
[ "$rc" -eq 5 ] && { echo "no engine tests were collected"; exit 1; }
exit "$rc"
