"""The CLI and the TOML config: every key has a flag, flags override the file, bad keys are
named with what is allowed, and user errors are one line with exit code 2."""

from __future__ import annotations

import json

from conftest import run_cli
from tfpipe.export.config import ExportConfig
from tfpipe.pipeline.config import DataConfig
from tfpipe.train.config import TrainConfig
from tfpipe.cli import build_parser


def test_every_config_key_has_a_flag():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for command, model in (("data", DataConfig), ("train", TrainConfig), ("export", ExportConfig)):
        flags = {opt for action in commands[command]._actions for opt in action.option_strings}
        for name, field in model.model_fields.items():
            if name == "beam_args":
                continue  # Beam's own options are passed through as they are
            assert "--" + (field.alias or name).replace("_", "-") in flags, (command, name)


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
