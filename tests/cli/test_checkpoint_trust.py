"""Nothing lost: a run killed with SIGKILL resumes from its last checkpoint and ends where the
uninterrupted run ends; a requeued job resumes from its run directory by itself (resume=auto);
checkpoints that are truncated, damaged, of another model class or of other data are refused in
one line naming the file."""
import csv
import logging
import os
import re
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from cli_helpers import REPO, compose_config

from lightning_rnn.cli import run
from lightning_rnn.tasks import train
from lightning_rnn.tasks.builders import build_trainer
from lightning_rnn.utils.checkpoint_io import AtomicCheckpointIO

HERE = Path(__file__).resolve().parent

#: A tiny char LM on the default backend (auto: the cpp kernel) in float32, as the command line
#: trains by default: 8 optimizer steps, each logged; validation and last.ckpt every 2 steps.
#: Its batches are 8 streams of the char_python corpus, so step 4 is in the middle of an epoch,
#: and the model is stateful: the checkpoint holds the state carried into the next batch.
TINY = ["model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "model.val_sample_length=0",
        "data.batch_size=8", "data.seq_len=16", "trainer.max_steps=8", "trainer.val_check_interval=2",
        "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", "logger=csv", "~callbacks.rich_progress_bar",
        "~callbacks.rich_model_summary"]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}


def start_cli(args, run_dir: Path) -> subprocess.Popen:
    """``python -m lightning_rnn ARGS`` writing into ``run_dir``, in a session of its own (so
    that a kill reaches whatever it started)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir.parent / f"{run_dir.name}.out").open("a") as log:  # a file: a pipe nobody reads could block
        return subprocess.Popen([sys.executable, "-m", "lightning_rnn", *args, f"hydra.run.dir={run_dir}"],
                                cwd=run_dir.parent, env=cli_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def finish(process: subprocess.Popen, run_dir: Path) -> None:
    process.wait()
    output = (run_dir.parent / f"{run_dir.name}.out").read_text()
    assert process.returncode == 0, f"exit {process.returncode}\n{output[-3000:]}"


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train/loss, from every CSV log of the run directory (a resumed run in the same
    directory writes a version of its own)."""
    losses = {}
    for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with metrics.open() as f:
            losses.update({int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(f)
                           if row.get("train/loss")})
    return losses


def last_checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        assert torch.equal(b["state_dict"][name], value), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    finish(start_cli(TINY, run_dir), run_dir)
    return run_dir


def kill_after_step(run_dir: Path, step: int) -> None:
    """Start the run, SIGKILL it once it has finished optimizer step ``step``."""
    marker = run_dir.parent / "stalled"
    stall = ["+callbacks.stall._target_=stall_callback.StallAfterStep", f"+callbacks.stall.step={step}",
             f"+callbacks.stall.marker={marker}"]
    process = start_cli([*TINY, *stall], run_dir)
    try:
        while not marker.exists():
            assert process.poll() is None, (run_dir.parent / f"{run_dir.name}.out").read_text()[-3000:]
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("how", ["ckpt_path", "requeued"])
def test_a_run_killed_mid_epoch_resumes_and_ends_as_the_uninterrupted_run(tmp_path, uninterrupted, how):
    """Killed after step 5, its last checkpoint is that of step 4 (the validation before). Resumed
    from it (ckpt_path=..., into a new directory; or the same command run again in the killed
    run's directory, resume=auto), steps 5 to 8 log the uninterrupted run's losses and end with
    its weights, bit for bit: float32 on one thread computes the same values in the same order."""
    killed = tmp_path / "killed"
    kill_after_step(killed, 5)
    assert last_checkpoint(killed)["global_step"] == 4
    if how == "ckpt_path":
        resumed = tmp_path / "resumed"
        finish(start_cli([*TINY, f"ckpt_path={killed / 'checkpoints' / 'last.ckpt'}"], resumed), resumed)
    else:
        resumed = killed
        finish(start_cli(TINY, resumed), resumed)
        assert "resuming from" in (tmp_path / "killed.out").read_text()
    whole, again = train_losses(uninterrupted), train_losses(resumed)
    assert sorted(whole) == list(range(8))  # logged at steps 0..7 (after optimizer steps 1..8)
    assert {step: again[step] for step in range(4, 8)} == {step: whole[step] for step in range(4, 8)}
    assert last_checkpoint(resumed)["global_step"] == 8
    assert_same_weights(last_checkpoint(uninterrupted), last_checkpoint(resumed))


SMALL = ["model.rnn.hidden_size=8", "model.rnn.num_layers=1", "model.embedding_dim=4", "model.val_sample_length=0",
         "model.rnn.backend=reference", "data.batch_size=4", "data.seq_len=8", "trainer.val_check_interval=2",
         "trainer.limit_val_batches=1", "logger=none", "~callbacks.rich_progress_bar", "~callbacks.rich_model_summary",
         "~callbacks.learning_rate_monitor"]


def test_a_run_in_a_directory_with_checkpoints_resumes_unless_resume_never(tmp_path, caplog):
    """resume=auto (the default) takes the directory's last.ckpt up; resume=never starts from
    step 0, and Lightning writes its checkpoints beside the earlier ones (last-v1.ckpt)."""
    train.run(compose_config(tmp_path, [*SMALL, "trainer.max_steps=2"]))
    assert last_checkpoint(tmp_path)["global_step"] == 2
    with caplog.at_level(logging.INFO, logger="lightning_rnn.tasks.checkpoint_checks"):
        train.run(compose_config(tmp_path, [*SMALL, "trainer.max_steps=4"]))
    assert f"resuming from {tmp_path / 'checkpoints' / 'last.ckpt'} (resume=auto" in caplog.text
    assert last_checkpoint(tmp_path)["global_step"] == 4
    assert [p.name for p in (tmp_path / "checkpoints").glob("last*")] == ["last.ckpt"]
    train.run(compose_config(tmp_path, [*SMALL, "trainer.max_steps=2", "resume=never"]))
    assert last_checkpoint(tmp_path)["global_step"] == 4  # a resumed run would have ended at once, saving nothing
    assert torch.load(tmp_path / "checkpoints" / "last-v1.ckpt", weights_only=True)["global_step"] == 2
    with pytest.raises(ValueError, match="resume: expected one of 'auto', 'never', got 'always'"):
        train.run(compose_config(tmp_path, [*SMALL, "resume=always"]))


def test_the_train_task_saves_checkpoints_atomically(tmp_path):
    trainer = build_trainer(compose_config(tmp_path, ["logger=none", "callbacks=none"]))
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


@pytest.fixture(scope="module")
def char_checkpoint(tmp_path_factory) -> Path:
    """A char LM trained 2 steps on the default corpus: its last.ckpt."""
    run_dir = tmp_path_factory.mktemp("char")
    train.run(compose_config(run_dir, [*SMALL, "trainer.max_steps=2"]))
    return run_dir / "checkpoints" / "last.ckpt"


def error_of(cfg, monkeypatch) -> str:
    """What the command line prints for ``cfg``'s run (it must fail with a setting error)."""
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run(cfg)
    message = str(exit_info.value.code)
    error_line, hint = message.split("\n")  # one line, then where the traceback is
    assert error_line.startswith("Error: ckpt_path: ") and hint.startswith("(HYDRA_FULL_ERROR=1")
    return error_line


def damaged(source: Path, target: Path, how: str) -> Path:
    """A copy of ``source``: its first half, nothing, or 16 bytes flipped in its largest tensor."""
    data = bytearray(source.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = bytearray()
    else:
        with zipfile.ZipFile(source) as archive:
            largest = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        # a zip record: a 30-byte local header, its name and extra field, then its bytes
        name_length, extra_length = struct.unpack("<HH", data[largest.header_offset + 26: largest.header_offset + 30])
        start = largest.header_offset + 30 + name_length + extra_length
        for i in range(start, start + 16):
            data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


@pytest.mark.parametrize("how, message", [
    ("truncated", "is not a readable torch checkpoint, truncated or not one at all"),
    ("empty", r"is not a readable torch checkpoint, truncated or not one at all \(it is empty\)"),
    ("flipped", r"is damaged: its record .*/data/\d+ does not match its checksum"),
])
@pytest.mark.parametrize("task", ["train", "test", "sample"])
def test_a_truncated_or_damaged_checkpoint_is_one_error_naming_the_file(tmp_path, monkeypatch, char_checkpoint, how,
                                                                      message, task):
    bad = damaged(char_checkpoint, tmp_path / f"{how}.ckpt", how)
    cfg = compose_config(tmp_path, [*SMALL, f"task={task}", f"ckpt_path={bad}"])
    assert re.match(f"Error: ckpt_path: {re.escape(str(bad))} {message}", error_of(cfg, monkeypatch))


@pytest.fixture(scope="module")
def classifier_checkpoint(tmp_path_factory) -> Path:
    """A SequenceClassifier trained one epoch on the synthetic classification data: its last.ckpt."""
    run_dir = tmp_path_factory.mktemp("classifier")
    train.run(compose_config(run_dir, ["experiment=classification", "data.num_samples=40", "data.batch_size=8",
                                       "model.rnn.hidden_size=8", "model.rnn.backend=reference", "logger=none",
                                       "trainer.max_epochs=1", "~callbacks.rich_progress_bar",
                                       "~callbacks.rich_model_summary", "~callbacks.learning_rate_monitor"]))
    return run_dir / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize("task, message", [
    ("train", "holds a SequenceClassifier, and the config's model builds a CharLanguageModel; pass the model and "
              "data it was trained with (an experiment=... recipe picks both)"),
    ("test", "holds a SequenceClassifier, which takes no vocab from the data; pass the model and data it was trained "
             "with (an experiment=... recipe picks both)"),
    ("sample", "holds a SequenceClassifier, which has no sample(); sampling needs a CharLanguageModel"),
])
def test_a_checkpoint_of_another_model_class_is_one_error_naming_the_file(tmp_path, monkeypatch, classifier_checkpoint,
                                                                        task, message):
    """The default config's model and data are the char LM's."""
    cfg = compose_config(tmp_path, [*SMALL, f"task={task}", f"ckpt_path={classifier_checkpoint}"])
    assert error_of(cfg, monkeypatch) == f"Error: ckpt_path: {classifier_checkpoint} {message}"


@pytest.mark.parametrize("task", ["train", "test"])
def test_a_checkpoint_of_another_vocabulary_is_one_error_naming_the_file(tmp_path, monkeypatch, char_checkpoint,
                                                                       small_text, task):
    """The char LM of the Python corpus on a text of other characters: refused before a step
    (its ids would mean other characters), with how the vocabularies differ."""
    cfg = compose_config(tmp_path, [*SMALL, f"task={task}", f"ckpt_path={char_checkpoint}", "data=char_file",
                                    f"data.path={small_text}"])
    assert re.match(rf"Error: ckpt_path: {re.escape(str(char_checkpoint))} was trained on other data \(another "
                    r"vocab: \d+ characters against the data's \d+, \d+ not in the data's \(.*\)\); pass the data "
                    "settings it was trained with$", error_of(cfg, monkeypatch))


def test_a_vocabulary_of_the_same_size_is_refused_too(tmp_path, char_checkpoint):
    """The shapes fit, so only the vocabulary itself tells: the same characters in another order."""
    from lightning_rnn.tasks.checkpoint_checks import check_checkpoint_data

    with pytest.raises(ValueError, match=r"another vocab: 3 characters against the data's 3, the same characters "
                                         r"in another order: other ids"):
        check_checkpoint_data(char_checkpoint, {"vocab": "abc"}, "CharLanguageModel", {"vocab": "cab"})
    check_checkpoint_data(char_checkpoint, {"vocab": "abc"}, "CharLanguageModel", {"vocab": "abc"})


def test_a_weights_only_checkpoint_is_not_resumed(tmp_path, monkeypatch, char_checkpoint):
    checkpoint = torch.load(char_checkpoint, weights_only=True)
    del checkpoint["optimizer_states"], checkpoint["loops"]
    weights = tmp_path / "weights.ckpt"
    torch.save(checkpoint, weights)
    cfg = compose_config(tmp_path, [*SMALL, f"ckpt_path={weights}"])
    assert error_of(cfg, monkeypatch).startswith(f"Error: ckpt_path: {weights} holds no optimizer_states or loops "
                                                 "(saved with save_weights_only=True?)")
