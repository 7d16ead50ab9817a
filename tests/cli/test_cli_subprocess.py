"""`python -m lightning_rnn` end to end: train -> sample, DDP on 2 CPU processes, Optuna."""
import csv
from pathlib import Path

import pytest
from cli_helpers import run_cli

#: A tiny char LM: 4 optimizer steps, each logged, validation after steps 2 and 4.
TINY = ["model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "model.val_sample_length=0",
        "model.rnn.backend=reference", "data.seq_len=16", "trainer.max_steps=4", "trainer.val_check_interval=2",
        "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", "logger=csv"]


def run_dir(cwd: Path, kind="outputs") -> Path:
    """The single Hydra run directory under ``cwd/outputs`` (or ``multirun``)."""
    (directory,) = (cwd / kind).glob("*/*")
    return directory


def logged_values(directory: Path, metric="val/loss") -> dict[int, float]:
    """logged step -> value of ``metric`` in the run's CSV log."""
    (metrics,) = directory.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        return {int(row["step"]): float(row[metric]) for row in csv.DictReader(f) if row.get(metric)}


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """The default experiment on one process, global batch 8; its run directory."""
    cwd = tmp_path_factory.mktemp("one_process")
    result = run_cli([*TINY, "data.batch_size=8"], cwd)
    (cwd / "cli_output.txt").write_text(result.stdout + result.stderr)
    return run_dir(cwd)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """The ddp_cpu experiment: 2 processes, 4 streams each (the same global batch); its run directory."""
    cwd = tmp_path_factory.mktemp("ddp")
    result = run_cli(["experiment=ddp_cpu", *TINY, "data.batch_size=4", "callbacks=none"], cwd, timeout=180)
    output = result.stdout + result.stderr
    assert output.count("final metrics:") == 1  # rank 0 reports, not every process
    assert output.count("torch threads: 1 per process (OMP_NUM_THREADS=1;") == 1  # once, not once per process
    return run_dir(cwd)


def test_train_writes_checkpoint_and_logs_under_the_hydra_output_dir(one_process_run):
    assert (one_process_run / "checkpoints" / "last.ckpt").is_file()
    assert (one_process_run / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (one_process_run / ".hydra" / "config.yaml").is_file()
    assert len(logged_values(one_process_run)) == 2  # validated twice


def test_the_run_prints_no_deprecation_that_lightning_raises_from_torch(one_process_run):
    """Nor Lightning's warning that workers may repeat an IterableDataset's items: the
    character streams give each worker its own batches."""
    output = (one_process_run.parents[2] / "cli_output.txt").read_text()
    assert "final metrics:" in output  # the run's own report is there
    assert "torch threads: 1 per process (OMP_NUM_THREADS=1; threads=N sets another count)" in output
    assert "LeafSpec" not in output
    assert "IterableDataset" not in output
    assert "Tip:" not in output  # Lightning's suggestions of other services
    assert "Skipping setting a default" not in output  # the configs bring their own model summary


def test_sample_prints_only_the_generated_text(one_process_run, tmp_path):
    ckpt = one_process_run / "checkpoints" / "last.ckpt"
    result = run_cli(["task=sample", f"ckpt_path={ckpt}", "sample.length=30", "sample.start_text=def",
                      "sample.temperature=0.5", "logger=none"], tmp_path)
    assert result.stdout.startswith("def") and len(result.stdout) == 3 + 30 + 1


@pytest.mark.parametrize("metric, logged", [("val/loss", 2), ("train/loss", 4), ("train/ppl", 4)])
def test_ddp_on_two_cpu_processes_matches_one_process(one_process_run, ddp_run, metric, logged):
    """2 processes x 4 streams reproduce 1 process x 8 streams: same val/loss after each update,
    and the same train/loss (and metrics derived from it) at each step: the global batch's, not
    rank 0's 4 streams."""
    two = logged_values(ddp_run, metric)
    one = logged_values(one_process_run, metric)
    assert sorted(two) == sorted(one) and len(one) == logged
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-5)


def test_help_says_what_the_command_does(tmp_path):
    """--help opens with the command's own usage (it said "cli is powered by Hydra."), then
    Hydra's lists of config groups and the config."""
    output = run_cli(["--help"], tmp_path).stdout
    assert output.startswith("python -m lightning_rnn [group=option ...] [key=value ...]\nTrains a recurrent model")
    assert "powered by Hydra" not in output
    assert "experiment: adding_problem, char_python" in output and "== Config ==" in output
    assert not (tmp_path / "outputs").exists()  # help runs nothing
