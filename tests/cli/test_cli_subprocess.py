"""`python -m lightning_rnn` end to end: train -> sample, DDP on 2 CPU processes, Optuna."""
import csv
from pathlib import Path

import pytest
from cli_helpers import run_cli

#: A tiny char LM: 4 optimizer steps, validation after steps 2 and 4.
TINY = ["model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "model.val_sample_length=0",
        "model.rnn.backend=reference", "data.seq_len=16", "trainer.max_steps=4", "trainer.val_check_interval=2",
        "trainer.limit_val_batches=2", "logger=csv"]


def run_dir(cwd: Path, kind="outputs") -> Path:
    """The single Hydra run directory under ``cwd/outputs`` (or ``multirun``)."""
    (directory,) = (cwd / kind).glob("*/*")
    return directory


def val_losses(directory: Path) -> dict[int, float]:
    """logged step -> val/loss from the run's CSV log."""
    (metrics,) = directory.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        return {int(row["step"]): float(row["val/loss"]) for row in csv.DictReader(f) if row.get("val/loss")}


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """The default experiment on one process, global batch 8; its run directory."""
    cwd = tmp_path_factory.mktemp("one_process")
    run_cli([*TINY, "data.batch_size=8"], cwd)
    return run_dir(cwd)


def test_train_writes_checkpoint_and_logs_under_the_hydra_output_dir(one_process_run):
    assert (one_process_run / "checkpoints" / "last.ckpt").is_file()
    assert (one_process_run / ".hydra" / "config.yaml").is_file()
    assert len(val_losses(one_process_run)) == 2  # validated twice


def test_sample_prints_only_the_generated_text(one_process_run, tmp_path):
    ckpt = one_process_run / "checkpoints" / "last.ckpt"
    result = run_cli(["task=sample", f"ckpt_path={ckpt}", "sample.length=30", "sample.start_text=def",
                      "sample.temperature=0.5", "logger=none"], tmp_path)
    assert result.stdout.startswith("def") and len(result.stdout) == 3 + 30 + 1


def test_ddp_on_two_cpu_processes_matches_one_process(one_process_run, tmp_path):
    """2 processes x 4 streams reproduce 1 process x 8 streams: same val/loss after each update."""
    result = run_cli(["experiment=ddp_cpu", *TINY, "data.batch_size=4", "callbacks=none"], tmp_path, timeout=180)
    assert (result.stdout + result.stderr).count("final metrics:") == 1  # rank 0 reports, not every process
    two = val_losses(run_dir(tmp_path))
    one = val_losses(one_process_run)
    assert sorted(two) == sorted(one) and len(one) == 2
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5)
