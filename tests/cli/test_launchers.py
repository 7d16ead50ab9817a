"""Hydra's launchers: SLURM through submitit (composed only: no cluster here) and a sweep
whose trials run in parallel processes (joblib)."""
import csv
import math
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import CONF, run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"

#: What a user adds to a recipe to train it on 2 nodes x 4 processes.
TWO_NODES = ["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=4"]


def test_the_slurm_launcher_prints_with_a_recipe_and_two_nodes(tmp_path):
    """``--cfg hydra`` of the command a SLURM user runs: it composes with a recipe (no
    sbatch is called, nothing runs)."""
    output = run_cli(["hydra/launcher=slurm", "experiment=char_shakespeare_large", *TWO_NODES,
                      "--cfg", "hydra"], tmp_path).stdout
    launcher = yaml.safe_load(output)["hydra"]["launcher"]
    assert launcher["_target_"] == SLURM_LAUNCHER
    assert launcher["nodes"] == "${trainer.num_nodes}" and launcher["tasks_per_node"] == "${trainer.devices}"
    assert launcher["gpus_per_node"] is None and launcher["max_num_timeout"] == 0
    assert not (tmp_path / "multirun").exists()


def launcher_for(tmp_path, overrides):
    """The launcher that ``-m OVERRIDES`` instantiates (as Hydra does, against the whole
    config), not started; and the composed config."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra.sweep.dir={tmp_path}/sweep", *overrides],
                      return_hydra_config=True)
    return instantiate(cfg.hydra.launcher), cfg


@pytest.mark.parametrize("launcher, sizes", [("slurm", (2, 4, None)), ("slurm_gpu", (2, 4, 4)),
                                             ("submitit_slurm", (1, 1, None))])  # the plugin's: sizes by hand
def test_a_slurm_job_has_a_task_per_device_on_each_node(tmp_path, launcher, sizes):
    slurm, cfg = launcher_for(tmp_path, [f"hydra/launcher={launcher}", "experiment=char_shakespeare_large",
                                         *TWO_NODES])
    assert type(slurm).__module__ + "." + type(slurm).__name__ == SLURM_LAUNCHER
    assert (slurm.params["nodes"], slurm.params["tasks_per_node"], slurm.params["gpus_per_node"]) == sizes
    assert slurm.params["submitit_folder"] == f"{tmp_path}/sweep/.submitit/%j"
    assert cfg.model.rnn.hidden_size == 512  # the recipe's model
    assert (cfg.trainer.strategy, cfg.trainer.num_nodes, cfg.trainer.devices) == ("ddp", 2, 4)


def test_the_slurm_launcher_runs_the_trials_of_an_optuna_sweep(tmp_path):
    slurm, cfg = launcher_for(tmp_path, ["hydra/launcher=slurm", "experiment=optuna_sweep", *TWO_NODES])
    assert type(slurm).__name__ == "SlurmLauncher" and slurm.params["nodes"] == 2
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.mode.name == "MULTIRUN"


#: An Optuna sweep of 3 tiny trials, 2 at a time in 2 processes, each logging to wandb (offline)
#: and a CSV file.
PARALLEL_SWEEP = ["experiment=optuna_sweep", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                  "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=2", "logger=[csv,wandb]", "data.batch_size=4",
                  "data.seq_len=16", "trainer.max_steps=2", "trainer.val_check_interval=2",
                  "trainer.limit_val_batches=1", "model.rnn.backend=reference", "~callbacks.rich_progress_bar",
                  "~callbacks.rich_model_summary"]


@pytest.fixture(scope="module")
def parallel_sweep(tmp_path_factory) -> tuple[Path, str]:
    """The sweep directory of PARALLEL_SWEEP, and what the command printed."""
    cwd = tmp_path_factory.mktemp("parallel_sweep")
    result = run_cli(["-m", *PARALLEL_SWEEP, f"hydra.sweep.dir={cwd}/sweep"], cwd, timeout=None,
                     env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    return cwd / "sweep", result.stdout + result.stderr


def trial_dirs(sweep: Path) -> list[Path]:
    return sorted((p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")), key=lambda p: p.name)


def test_parallel_trials_each_write_their_own_output_dir(parallel_sweep):
    sweep, output = parallel_sweep
    assert output.count("Joblib.Parallel(") == 2 and "is launching 2 jobs" in output  # 2 trials at once, then 1
    trials = trial_dirs(sweep)
    assert [t.name for t in trials] == ["0", "1", "2"]
    for trial in trials:
        config = yaml.safe_load((trial / ".hydra" / "config.yaml").read_text())
        hydra = yaml.safe_load((trial / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert Path(hydra["runtime"]["output_dir"]) == trial  # where output_dir (checkpoints, logs) points
        checkpoint = torch.load(trial / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert checkpoint["global_step"] == 2
        # the trial's own model: the width it was given, in its own checkpoint
        hidden = checkpoint["state_dict"]["rnn.weight_hh_l0"].shape[1]
        assert hidden == config["model"]["rnn"]["hidden_size"]
        assert f"model.rnn.hidden_size={hidden}" in (trial / ".hydra" / "overrides.yaml").read_text()


def test_parallel_trials_each_log_a_wandb_run_of_their_own(parallel_sweep):
    """One offline run per trial, in the trial's directory, with an id of its own, holding the
    config of that trial (its output_dir) and of no other."""
    sweep, _ = parallel_sweep
    trials = trial_dirs(sweep)
    runs = [list((trial / "wandb").glob("offline-run-*")) for trial in trials]
    assert [len(r) for r in runs] == [1, 1, 1]
    ids = [r[0].name.rsplit("-", 1)[1] for r in runs]
    assert len(set(ids)) == 3
    for trial, (run,), run_id in zip(trials, runs, ids):
        logged = (run / f"run-{run_id}.wandb").read_bytes()
        for other in trials:
            assert (f'"{other}"'.encode() in logged) == (other == trial), (run, other)


def final_val_loss(trial: Path) -> float:
    (metrics,) = trial.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        return [float(row["val/loss"]) for row in csv.DictReader(f) if row.get("val/loss")][-1]


def test_a_parallel_sweep_reports_the_best_of_its_trials(parallel_sweep):
    """The sweep's result is the best trial's val/loss and parameters, as each trial logged them."""
    sweep, _ = parallel_sweep
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    losses = {trial: final_val_loss(trial) for trial in trial_dirs(sweep)}
    best = min(losses, key=losses.get)
    assert results["name"] == "optuna" and 0 < results["best_value"] < math.log(256)  # a val/loss in nats
    assert results["best_value"] == pytest.approx(losses[best], rel=1e-6)
    overrides = yaml.safe_load((best / ".hydra" / "overrides.yaml").read_text())
    assert {f"{k}={v}" for k, v in results["best_params"].items()} <= set(overrides)
