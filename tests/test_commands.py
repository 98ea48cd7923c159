"""What every command shares: console scripts, --version, --config FILE.toml, one name per flag."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pydtnn_lite import calibrate, predict, scalability, trace, train, validate
from pydtnn_lite.cli import parse_command_line

COMMANDS = {"train": train, "trace": trace, "calibrate": calibrate, "predict": predict, "validate": validate,
            "scalability": scalability}
BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_console_script_says_its_version(name):
    result = subprocess.run([os.path.join(BIN, f"pydtnn-{name}"), "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"pydtnn-{name} ") and result.stdout.split()[1][0].isdigit()


def test_python_m_keeps_working():
    result = subprocess.run([sys.executable, "-m", "pydtnn_lite.predict", "--version"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("pydtnn-predict ")


def write(tmp_path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_a_config_file_sets_flags_and_the_command_line_overrides_it(tmp_path):
    config = write(tmp_path, 'model = "lenet"\nbatch-size = 128\nrandom-flip = true\nlr-decay-epochs = [30, 60]\n'
                             'lr = 0.1\nresume = "auto"\ncheckpoint_dir = "ckpt"\n')
    args = parse_command_line(train.build_parser(), ["--config", config, "--batch-size", "32"])
    assert args.model == "lenet" and args.batch_size == 32 and args.random_flip
    assert args.lr_decay_epochs == [30, 60] and args.lr == 0.1 and args.resume == "auto"
    assert args.checkpoint_dir == "ckpt"  # a key may spell the flag with underscores


def test_a_config_file_reaches_a_subcommand_s_flags(tmp_path):
    config = write(tmp_path, "top = 3\n")
    for words in (["--config", config, "summarize", "DIR"], ["summarize", "DIR", "--config", config]):
        args = parse_command_line(trace.build_parser(), words)
        assert (args.directory, args.top) == ("DIR", 3)


@pytest.mark.parametrize("text,message", [
    ("bogus = 1\n", "'bogus' is not a flag of pydtnn-train: see pydtnn-train --help"),
    ("random-flip = 1\n", "random-flip takes true or false, got 1"),
    ("lr = true\n", "lr takes a value, not true or false"),
    ("lr = [1, 2]\n", "lr takes one value, got the list"),
    ("batch-size = \"many\"\n", "argument --batch-size: must be an integer at least 1, got 'many'"),
    ("optimizer = \"lbfgs\"\n", "invalid choice: 'lbfgs'"),
    ("model = [\n", "is not valid TOML"),
    ("config = \"other.toml\"\n", "'config' is not a flag"),
])
def test_a_bad_config_file_ends_the_command_with_one_line(tmp_path, capsys, text, message):
    with pytest.raises(SystemExit) as stop:
        parse_command_line(train.build_parser(), ["--config", write(tmp_path, text)])
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert message in error and error.count("error:") == 1


def test_a_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_command_line(predict.build_parser(), ["--config", str(tmp_path / "none.toml")])
    assert f"cannot read --config {tmp_path / 'none.toml'}" in capsys.readouterr().err


def test_a_flag_has_one_name_in_every_command():
    def flags(module) -> set[str]:
        parser = module.build_parser()
        return {option for action in parser._actions for option in action.option_strings}

    for module in (calibrate, predict):
        assert "--blas-threads" in flags(module)
        assert parse_command_line(module.build_parser(), ["--threads", "3"]).blas_threads == 3  # the old name
    assert "--blas-threads" in flags(train) and "--threads" not in flags(train)


def test_a_summary_of_a_model_that_does_not_fit_is_one_error_line_on_every_rank(tmp_path):
    from mpi import assert_one_line_error, train_cli

    result = train_cli(2, "--model", "vgg11", "--dataset", "digits", "--summary", cwd=str(tmp_path))
    assert_one_line_error(result, "vgg11 does not fit digits's (8, 8, 1) images")
