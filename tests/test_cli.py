"""The CLI and the TOML config: every key has a flag, flags override the file, bad keys are
named with what is allowed, and user errors are one line with exit code 2."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli
from tfpipe.cli import build_parser

# The flags each stage command takes besides --help, --config and --debug, written out by hand
# rather than generated from the config models, so that a config key renamed or lost (or a flag
# that appears unasked) fails here. tune also takes TF Serving's underscore spelling.
FLAGS = {
    "data": "--classes --compression-level --delimiter --environment --exclude --force --format --image-column "
            "--infer-rows --input --keep-column --key --label --max-bad-fraction --min-size --na-values --out --resize "
            "--runner --schema --shards --split --stratify --task --top-k",
    "train": "--augment --batch-size --cache-mb --data --deterministic --dropout --ensemble --epochs --filters "
             "--force --grad-accum-steps --hidden --image-size --learning-rate --log-device-placement --min-epochs --model --out "
             "--patience "
             "--precision --profile --scaling --seed --shuffle-buffer --strategy --target --time-limit --xla",
    "export": "--allow-drop --allow-weak --base --breaking-change --data --drop-confidence --gate-confidence --keep "
              "--max-accuracy-drop --max-rmse-rise --model --name --promote --serving-gate --slice --slice-min-rows --tflite "
              "--thresholds --tolerance --version --warmup-records",
    "loadtest": "--batch-size --data --duration --expect-workers --grpc-target --label --master --master-bind "
                "--max-requests --model --model-path --out --payload --rate --replay --signature --slo --speed --sweep "
                "--target --users --version --warmup --warmup-records --web --web-port --worker --workers",
    "skew": "--confidence --data --logs --max-records --model --out --threshold",
    "tune": "--backend --batch-size --batch_size --clients --cores --data --duration --levels --model-base-path "
            "--model-name --model_base_path --model_name --out --payload --protocol --rate --serve-args --serve_args "
            "--skip-workers --skip_workers --slo --start-timeout --start_timeout --trials --warmup --warmup-records "
            "--warmup_records",
}
# tfpipe run's [serve] section (no command of its own: `tfpipe run --set serve.KEY=VALUE`)
SERVE_KEYS = ("allowed_batch_sizes batch_timeout_micros batching check_rows drain_seconds enable_batching "
              "enable_large_batch_splitting host max_batch_size max_enqueued_batches max_execution_batch_size "
              "num_batch_threads port protocol rest_api_port")


@pytest.mark.parametrize("command", sorted(FLAGS))
def test_each_stage_command_takes_its_flags(command):
    parser = build_parser()
    actions = parser._subparsers._group_actions[0].choices[command]._actions
    flags = {o for a in actions for o in a.option_strings if o not in ("-h", "--help", "--config", "--debug")}
    assert sorted(flags) == FLAGS[command].split()


def test_run_takes_each_serve_key():
    from tfpipe.config import load_config

    cfg = load_config(None)
    assert sorted(type(cfg.serve).model_fields) == SERVE_KEYS.split()


@pytest.mark.parametrize("argv, section, want", [
    # each kind of flag, read as its TOML key would be
    (["data", "--split", "train=8,eval=1,test=1", "--exclude", "a", "b", "--max-bad-fraction", "0.5"], "data",
     {"split": {"train": 8, "eval": 1, "test": 1}, "exclude": ["a", "b"], "max_bad_fraction": 0.5}),
    (["train", "--hidden", "64,32", "--precision", "float32", "--deterministic", "--epochs", "3"], "train",
     {"hidden": [64, 32], "precision": "float32", "deterministic": True, "epochs": 3}),
    (["export", "--tflite", "int8", "--allow-drop"], "export", {"tflite": "int8", "allow_drop": True}),
    (["loadtest", "--sweep", "1,2", "--slo", "p99<5ms", "--web-port", "9000"], "loadtest",
     {"sweep": "1,2", "slo": "p99<5ms", "web_port": 9000}),
    (["skew", "--threshold", "0.1", "x=0.2", "--confidence", "0.9"], "skew",
     {"threshold": ["0.1", "x=0.2"], "confidence": 0.9}),
    (["tune", "--model_base_path", "m", "--skip-workers", "--clients", "4"], "tune",
     {"model_base_path": "m", "skip_workers": True, "clients": 4}),
])
def test_flags_give_the_config_values(argv, section, want):
    from tfpipe.cli import _section
    from tfpipe.config import load_config

    args = build_parser().parse_args(argv)
    model = type(getattr(load_config(None), section))
    got = _section(args, load_config(None), section, model)
    assert {k: getattr(got, k) for k in want} == want


def test_help_on_each_command():
    res = run_cli("--help")
    assert res.returncode == 0 and "data" in res.stdout
    res = run_cli("data", "--help")
    assert res.returncode == 0
    for flag in ("--input", "--label", "--out", "--exclude", "--key", "--split", "--schema",
                 "--max-bad-fraction", "--shards", "--force", "--config", "FnApiRunner"):
        assert flag in res.stdout, flag
    # Every command's help renders (a '%' in a flag's text once broke loadtest's).
    helps = {}
    for command, flag in [("run", "--from"), ("train", "--precision"), ("export", "--tflite"),
                          ("serve", "--rest_api_port"), ("loadtest", "--expect-workers"), ("show", "--json")]:
        helps[command] = res = run_cli(command, "--help")
        assert res.returncode == 0 and flag in res.stdout, (command, res.stderr[-300:])
    assert 'errors<0.1%"' in helps["loadtest"].stdout


def test_config_file_and_flag_override(tmp_path, penguins_csv):
    cfg = tmp_path / "tfpipe.toml"
    out = tmp_path / "from_config"
    cfg.write_text(f'[data]\ninput = ["{penguins_csv}"]\nlabel = "species"\nout = "{out}"\n'
                   'split = {train = 70, eval = 30}\nmax_bad_fraction = 0.05\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    manifest = json.load(open(out / "data.json"))
    assert set(manifest["counts"]["splits"]) == {"train", "eval"}
    assert manifest["config"]["max_bad_fraction"] == 0.05

    # A flag beats the file's key.
    out2 = tmp_path / "from_flag"
    res = run_cli("data", "--config", str(cfg), "--out", str(out2), "--split", "train=1,test=1")
    assert res.returncode == 0, res.stderr
    manifest = json.load(open(out2 / "data.json"))
    assert set(manifest["counts"]["splits"]) == {"train", "test"}
    assert manifest["config"]["max_bad_fraction"] == 0.05


def test_unknown_or_mistyped_keys_are_named(tmp_path):
    cfg = tmp_path / "tfpipe.toml"
    cfg.write_text('[data]\nlabel = "species"\nshard = 4\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 2
    assert "unknown key 'data.shard' (did you mean 'shards'?); allowed: input, label, out" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1

    cfg.write_text('[dat]\nlabel = "species"\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 2 and "unknown key 'dat' (did you mean 'data'?); allowed: run, data, train, export, serve, loadtest" in res.stderr

    cfg.write_text('[data]\nformat = "xlsx"\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 2 and "'data.format'" in res.stderr and "'csv'" in res.stderr

    cfg.write_text('[data]\nmax_bad_fraction = 2\n')
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 2 and "'data.max_bad_fraction'" in res.stderr and "less than or equal to 1" in res.stderr

    cfg.write_text("[data\n")
    res = run_cli("data", "--config", str(cfg))
    assert res.returncode == 2 and "is not valid TOML" in res.stderr

    res = run_cli("data", "--config", str(tmp_path / "none.toml"))
    assert res.returncode == 2 and "does not exist" in res.stderr

    res = run_cli("data", "--input", "x.csv", "--label", "y", "--out", str(tmp_path / "o"), "--max-bad-fraction", "-1")
    assert res.returncode == 2 and "'data.max_bad_fraction'" in res.stderr


def test_missing_required_options(tmp_path):
    res = run_cli("data", "--label", "y", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "no input given" in res.stderr
    res = run_cli("data", "--input", "x.csv", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "no label column" in res.stderr


def test_version():
    res = run_cli("--version", fresh=True)  # `python -m tfpipe.cli` from nothing, not forked from the host
    assert res.returncode == 0 and res.stdout.startswith("tfpipe ")
