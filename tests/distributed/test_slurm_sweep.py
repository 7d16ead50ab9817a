"""A sweep on ``hydra/launcher=slurm``: each trial is a SLURM job of its own (one job array),
each job two nodes of DDP. Run against the SLURM stand-in (slurm_standin.py)."""
from __future__ import annotations

import os

import pytest
import slurm_standin
import torch
from node_launcher import run_cli

#: Two trials (seeds 1 and 2) of a tiny char LM, each on 2 nodes x 1 process, logged to wandb (offline).
SWEEP = ["-m", "hydra/launcher=slurm", "seed=1,2", "trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1",
         "model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "model.val_sample_length=0",
         "model.rnn.backend=reference", "data.batch_size=4", "data.seq_len=16", "trainer.max_steps=2",
         "trainer.val_check_interval=2", "trainer.limit_val_batches=1", "logger=wandb",
         "~callbacks.rich_progress_bar", "~callbacks.rich_model_summary"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("slurm_sweep")
    standin = slurm_standin.install(tmp_path / "slurm")
    run_cli([*SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path,
            env={"PATH": os.pathsep.join([str(standin), os.environ["PATH"]]), "WANDB_MODE": "offline",
                 "WANDB_SILENT": "true"})
    return tmp_path / "sweep"


def test_the_trials_are_one_job_array_of_two_node_jobs(sweep):
    (script,) = (sweep / ".submitit").glob("*/*_submission.sh")
    lines = set(script.read_text().splitlines())
    assert {"#SBATCH --array=0-1%2", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"} <= lines
    array_id = script.parent.name
    for job in (0, 1):  # every task of every job ran to its end
        for task in (0, 1):
            assert (sweep / ".submitit" / f"{array_id}_{job}" / f"{array_id}_{job}_{task}_result.pkl").is_file()


def test_each_trial_keeps_its_own_checkpoints_and_wandb_run(sweep):
    """Per trial: its seed, its checkpoint, one wandb run (rank 0's) with an id of its own that
    logged the trial's own output directory."""
    trials = [sweep / "0", sweep / "1"]
    runs, weights = [], []
    for seed, trial in zip((1, 2), trials):
        assert f"- seed={seed}" in (trial / ".hydra" / "overrides.yaml").read_text()
        checkpoint = torch.load(trial / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert checkpoint["global_step"] == 2
        weights.append(checkpoint["state_dict"]["rnn.weight_hh_l0"])
        (run,) = (trial / "wandb").glob("offline-run-*")
        runs.append(run)
    assert not torch.equal(*weights)  # two trials, two seeds
    ids = [run.name.rsplit("-", 1)[1] for run in runs]
    assert ids[0] != ids[1]
    for trial, run, run_id in zip(trials, runs, ids):
        logged = (run / f"run-{run_id}.wandb").read_bytes()
        assert f'"{trial}"'.encode() in logged  # the resolved config of its own trial
        assert all(f'"{other}"'.encode() not in logged for other in trials if other != trial)
