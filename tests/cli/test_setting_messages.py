"""What a user is told about a mistyped key, a key added with + that its class does not take,
a checkpoint path that is not a file; and that a run refused for a bad setting leaves no
run directory behind."""
import os
import subprocess
import sys

import pytest
from cli_helpers import CONF, QUICK, REPO, compose_config

from lightning_rnn.cli import remove_run_directory, run
from lightning_rnn.tasks import sample, train
from lightning_rnn.tasks.unknown_keys import accepted_arguments, unknown_override_error


def test_a_mistyped_key_names_the_closest_key_and_the_keys_there():
    message = unknown_override_error(CONF, ["model.rnn.hiden_size=64"])
    assert message.startswith("Error: model.rnn.hiden_size: no such key; did you mean model.rnn.hidden_size? "
                              "The keys of model.rnn: _target_, _partial_, hidden_size, num_layers,")
    assert "+model" not in message  # not Hydra's advice to add the key


def test_every_mistyped_key_is_named_at_once():
    message = unknown_override_error(CONF, ["trainer.max_step=3", "seed=1", "seeed=2", "--cfg", "job"])
    first, second = message.splitlines()
    assert first.startswith("Error: trainer.max_step: no such key; did you mean trainer.max_steps?")
    assert second.startswith("Error: seeed: no such key; did you mean seed? The config's keys: seed, threads,")


@pytest.mark.parametrize("override, expected", [
    ("model.rnnn.hidden_size=8", "model.rnnn.hidden_size: model has no key rnnn; did you mean model.rnn? The keys "
                                 "of model: "),
    ("seed.value=3", "seed.value: seed is a value, not a group of keys"),
    ("model.rnn.qqq=3", "model.rnn.qqq: no such key. The keys of model.rnn: "),  # nothing close
])
def test_a_key_under_a_missing_or_plain_key(override, expected):
    assert unknown_override_error(CONF, [override]).startswith(f"Error: {expected}")


@pytest.mark.parametrize("args", [
    ["model.rnn.hidden_size=64", "experiment=classification", "data.num_samples=40"],  # keys that exist
    ["+model.rnn.extra=1"],  # an added key: the class decides
    ["-m", "trainer.max_step=3,4"],  # a sweep: Hydra composes each job
    ["--version"],
    ["model=no_such_model"],  # not a key: Hydra lists the options
])
def test_nothing_to_say_where_the_keys_exist_or_hydra_answers(args):
    assert unknown_override_error(CONF, args) is None


def test_a_key_added_with_plus_that_the_class_does_not_take_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = compose_config(tmp_path, ["+model.rnn.hiden_size=64", "data.batch_size=4", "data.seq_len=16", *QUICK])
    with pytest.raises(SystemExit) as exit_info:
        run(cfg)
    message = str(exit_info.value.code)
    assert message.startswith("Error: model.rnn.hiden_size: FusedLSTM takes no argument hiden_size; did you mean "
                              "model.rnn.hidden_size? It takes: input_size, hidden_size, num_layers,")
    cfg = compose_config(tmp_path, ["+model.embeding_dim=8", "data.batch_size=4", "data.seq_len=16", *QUICK])
    with pytest.raises(SystemExit, match="model.embeding_dim: CharLanguageModel takes no argument embeding_dim; "
                                         "did you mean model.embedding_dim?"):
        run(cfg)


def test_the_arguments_of_a_module_include_those_it_passes_on():
    """CharLanguageModel(**kwargs) passes them to RNNModule: both are what it takes."""
    accepted = accepted_arguments("lightning_rnn.modules.CharLanguageModel")
    assert {"vocab", "embedding_dim", "optimizer", "tbptt_steps"} <= set(accepted) and "kwargs" not in accepted
    assert accepted_arguments("no.such.Class") == []


def test_a_checkpoint_path_that_does_not_exist_says_so_and_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose_config(tmp_path, ["ckpt_path=missing.ckpt", *QUICK])
    with pytest.raises(ValueError, match=rf"ckpt_path: missing.ckpt does not exist \(relative to {tmp_path}, "):
        train.run(cfg)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "last.ckpt").touch()
    cfg = compose_config(tmp_path, ["task=sample", f"ckpt_path={tmp_path}/run/checkpoints", *QUICK])
    with pytest.raises(ValueError, match=r"checkpoints is a directory, not a checkpoint file; it holds last.ckpt$"):
        sample.run(cfg)


def cli(args, cwd):
    """``python -m lightning_rnn ARGS`` in ``cwd``, as a user runs it (no HYDRA_FULL_ERROR)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", "lightning_rnn", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def test_the_command_refuses_a_mistyped_key_and_leaves_nothing_behind(tmp_path):
    result = cli(["model.rnn.hiden_size=64"], tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: model.rnn.hiden_size: no such key; did you mean model.rnn.hidden_size?")
    assert "To append to your config" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_run_refused_for_a_bad_setting_leaves_no_run_directory(tmp_path):
    result = cli(["model.rnn.hidden_size=-3", "model.rnn.backend=reference", "logger=none"], tmp_path)
    assert result.returncode == 1 and "Error: hidden_size: expected an int >= 1, got -3" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/DATE/TIME with only .hydra and cli.log


def test_a_run_directory_that_holds_what_the_run_wrote_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "2026-01-01" / "12-00-00"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "cli.log").touch()
    (tmp_path / "outputs" / "2026-01-01" / "11-00-00").mkdir()  # an earlier run of the day
    untouched = (run_dir, {".hydra", "cli.log"})
    (run_dir / "checkpoints").mkdir()
    remove_run_directory(untouched)
    assert run_dir.is_dir()  # the run wrote a checkpoint directory: kept
    (run_dir / "checkpoints").rmdir()
    remove_run_directory(untouched)
    assert not run_dir.exists() and (tmp_path / "outputs" / "2026-01-01").is_dir()  # its day holds another run
