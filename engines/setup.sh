#!/usr/bin/env bash
# An engine environment, in one command (from the repository root):
#
#   bash engines/setup.sh [VENV]              the data stage's (default VENV: .venv-engines)
#   bash engines/setup.sh --predict [VENV]    tfpipe predict's (default VENV: .venv-predict)
#
# 1. VENV: Beam at the release whose Flink and Spark runners the package registry serves, the few
#    packages tfpipe.pipeline imports (engines/requirements.txt), and tfpipe itself without its
#    own dependencies (pip --no-deps): `tfpipe data` runs there, nothing that trains. With
#    --predict, TensorFlow 2.20 too (engines/requirements-predict.txt), the newest that installs
#    beside that Beam: `tfpipe predict` runs there, and its Beam workers score with it.
# 2. Beam's Flink and Spark job servers for that SDK's version, resolved with Maven and shaded
#    into runnable jars (engines/pom.xml), in $TFPIPE_ENGINE_JARS or ~/.cache/tfpipe/jars, where
#    `tfpipe data --runner FlinkRunner|SparkRunner` finds them. An existing jar is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=engines/requirements.txt
venv=.venv-engines
if [ "${1:-}" = "--predict" ]; then
  requirements=engines/requirements-predict.txt venv=.venv-predict
  shift
fi
venv="${1:-$venv}"
python3.11 -m venv "$venv"
"$venv/bin/pip" install -q -r "$requirements"
"$venv/bin/pip" install -q --no-deps -e .
beam_version="$("$venv/bin/python" -c 'import apache_beam; print(apache_beam.__version__)')"
jars="$("$venv/bin/python" -c 'from tfpipe.pipeline.runner import jars_dir; print(jars_dir())')"
mkdir -p "$jars"
for engine in flink spark; do
  jar="$jars/beam-$engine-job-server-$beam_version.jar"
  if [ -s "$jar" ]; then
    echo "kept $jar"
  else
    mvn -B -q -Dstyle.color=never -f engines/pom.xml -P "$engine" -Dbeam.version="$beam_version" -Djars.dir="$jars" package
    rm -rf engines/target
    echo "built $jar"
  fi
done
if [ "$requirements" = engines/requirements.txt ]; then
  echo "engine environment ready: . $venv/bin/activate && tfpipe data ... --runner FlinkRunner --flink_master=[local]"
else
  echo "engine environment ready: . $venv/bin/activate && tfpipe predict ... --runner FlinkRunner --flink_master=[local]"
fi
