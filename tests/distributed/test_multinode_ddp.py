"""``trainer.num_nodes=2``: two single-process "nodes" on this machine (gloo over 127.0.0.1).

Two ways in: a ``python -m lightning_rnn`` per node placed in the run by Lightning's
environment variables, and the command a SLURM user runs (``-m hydra/launcher=slurm``),
submitted by submitit to a stand-in for SLURM whose ``srun`` starts one task per node.
A :class:`~training_recorder.TrainingRecorder` on every process saves what it trained on.
The char LM runs with the reference backend in float64, so that the two nodes can be held to
the one-process run on the same global batch nearly to the last bit, and with the default
backend (``auto``: the cpp kernel) in float32, as the command line trains.
"""
from __future__ import annotations

import os

import pytest
import slurm_standin
import torch
from node_launcher import free_port, lightning_env, run_cli, run_nodes

from lightning_rnn.data import CharCorpusDataModule

RECORDER = ["+callbacks.recorder._target_=training_recorder.TrainingRecorder",
            "+callbacks.recorder.out_dir=${output_dir}/record"]

#: backend -> the precision its char LM trains in: the executable spec in float64, the
#: default as the command line runs it.
PRECISIONS = {"reference": "64-true", "auto": "32-true"}


def char_lm(backend: str) -> list[str]:
    """A tiny char LM: 6 optimizer steps of the global batch of 8 streams x 16 characters."""
    return ["model.rnn.hidden_size=16", "model.rnn.num_layers=1", "model.embedding_dim=8", "model.val_sample_length=0",
            f"model.rnn.backend={backend}", "data.seq_len=16", "trainer.max_steps=6", "trainer.val_check_interval=3",
            "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", f"trainer.precision={PRECISIONS[backend]}",
            "logger=csv", "~callbacks.rich_progress_bar", "~callbacks.rich_model_summary", *RECORDER]


GLOBAL_BATCH, NODES = 8, 2

#: Two nodes of one process each, DDP.
TWO_NODES = ["trainer=ddp", f"trainer.num_nodes={NODES}", "trainer.devices=1"]

#: The classifier on variable-length data with PackedSequences: 64 training sequences,
#: 2 epochs of 8 batches of 4 per node.
CLASSIFIER = ["data=classification", "model=classifier", "data.num_samples=80", "data.batch_size=4",
              "data.max_len=40", "model.rnn.hidden_size=8", "model.rnn.backend=reference", "trainer.max_steps=-1",
              "trainer.max_epochs=2", "trainer.val_check_interval=1.0", "trainer.check_val_every_n_epoch=1",
              "trainer.limit_val_batches=1", "logger=none", "callbacks=packed_sequences", *RECORDER]
EPOCHS, TRAIN_SEQUENCES, BATCH = 2, 64, 4

#: How the nodes are started -> the cluster environment Lightning finds in them.
ENVIRONMENTS = {"lightning": "LightningEnvironment", "submitit_slurm": "SLURMEnvironment"}


def load_records(run_dir, processes: int) -> list[dict]:
    return [torch.load(run_dir / "record" / f"rank{r}.pt", weights_only=False) for r in range(processes)]


def launch_nodes(tmp_path, overrides, environment: str):
    """Both nodes of a run in one directory (as on a shared filesystem): the directory and
    what each process recorded."""
    if environment == "lightning":
        run_dir, port = tmp_path / "run", free_port()
        run_dir.mkdir()
        node_envs = [lightning_env(rank, port) for rank in range(NODES)]
        run_nodes([*overrides, f"hydra.run.dir={run_dir}"], run_dir, node_envs)
    else:  # one SLURM job of NODES nodes x 1 task: the sweep's job 0
        standin = slurm_standin.install(tmp_path / "slurm")
        run_cli(["-m", "hydra/launcher=slurm", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path,
                env={"PATH": os.pathsep.join([str(standin), os.environ["PATH"]])})
        run_dir = tmp_path / "sweep" / "0"
    return run_dir, load_records(run_dir, NODES)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """``one_process(backend)``: what the char LM's one process recorded on the global batch
    (each backend's run once per module)."""
    records = {}

    def record(backend: str) -> dict:
        if backend not in records:
            run_dir = tmp_path_factory.mktemp(f"one_process_{backend}")
            run_cli([*char_lm(backend), f"data.batch_size={GLOBAL_BATCH}", f"hydra.run.dir={run_dir}"], run_dir)
            (records[backend],) = load_records(run_dir, 1)
        return records[backend]
    return record


#: (how the nodes are started, backend): both ways with the reference, Lightning's with the default.
NODE_RUNS = [("lightning", "reference"), ("submitit_slurm", "reference"), ("lightning", "auto")]


@pytest.fixture(scope="module", params=NODE_RUNS, ids=["-".join(run) for run in NODE_RUNS])
def char_lm_nodes(request, tmp_path_factory) -> tuple[str, list[dict], object, str]:
    """How the nodes were started, what each recorded, the run directory and the backend.
    Each node owns GLOBAL_BATCH / NODES streams."""
    environment, backend = request.param
    overrides = [*char_lm(backend), *TWO_NODES, f"data.batch_size={GLOBAL_BATCH // NODES}"]
    run_dir, records = launch_nodes(tmp_path_factory.mktemp(f"{environment}_{backend}"), overrides, environment)
    return environment, records, run_dir, backend


def test_each_node_knows_its_place(char_lm_nodes):
    environment, nodes, run_dir, backend = char_lm_nodes
    if environment == "submitit_slurm":  # the job asked SLURM for NODES nodes x 1 task (trainer.devices)
        (script,) = (run_dir.parent / ".submitit").glob("*/*_submission.sh")
        assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1"} <= set(script.read_text().splitlines())
    for rank, node in enumerate(nodes):
        assert node["backends"] == ["cpp" if backend == "auto" else backend]
        assert node["environment"] == ENVIRONMENTS[environment]
        assert (node["world_size"], node["num_nodes"]) == (NODES, NODES)
        assert node["global_rank"] == node["node_rank"] == rank and node["local_rank"] == 0


def test_the_nodes_own_disjoint_streams_that_together_are_the_training_text(char_lm_nodes, one_process):
    """Node r owns streams r*4 ... r*4+3 of the 8 the one-process run cuts the text into."""
    _, nodes, _, backend = char_lm_nodes
    one_process = one_process(backend)
    streams = [node["streams"] for node in nodes]
    assert all(s.shape == (GLOBAL_BATCH // NODES, one_process["streams"].shape[1]) for s in streams)
    assert torch.equal(torch.cat(streams), one_process["streams"])
    data = CharCorpusDataModule(batch_size=GLOBAL_BATCH, seq_len=16)  # the config's corpus and split
    data.setup("fit")
    text = data.datasets["train"]
    assert torch.equal(one_process["streams"].flatten(), text[: one_process["streams"].numel()])
    assert one_process["streams"].numel() > len(text) - GLOBAL_BATCH * 16 - 1  # all of it, up to one batch's worth


def test_every_step_trains_on_the_one_process_global_batch(char_lm_nodes, one_process):
    _, nodes, _, backend = char_lm_nodes
    one_process = one_process(backend)
    assert len(one_process["batches"]) == 6 and all(len(node["batches"]) == 6 for node in nodes)
    for step, batch in enumerate(one_process["batches"]):
        assert torch.equal(torch.cat([node["batches"][step]["inputs"] for node in nodes]), batch["inputs"]), step


def test_two_nodes_end_with_the_weights_of_one_process(char_lm_nodes, one_process):
    """Same weights on both nodes (DDP averaged their gradients), and those of one process on
    the global batch up to rounding: the only difference is the order of summation (a mean
    over 8 rows against the mean of two means over 4). A node on the wrong streams would
    change a gradient wholesale and a weight by about the learning rate (2e-3) in one step.
    The tolerance sits between the two: in float64 (rounding about 1e-16 per step) 1e-12. In
    float32 each of the six steps rounds a weight of order 1 by up to 6e-8 (half an ulp) and
    perturbs its Adam update by about the learning rate x 1e-7 (the gradient's rounding,
    relative): 1e-6 allows a few ulps a step, and is 2000 times below a wrong stream's 2e-3."""
    _, (first, second), _, backend = char_lm_nodes
    one_process = one_process(backend)
    dtype, atol = (torch.float64, 1e-12) if backend == "reference" else (torch.float32, 1e-6)
    assert first["global_step"] == second["global_step"] == one_process["global_step"] == 6
    for name, weight in one_process["final"].items():
        assert weight.dtype == dtype
        assert torch.equal(first["final"][name], second["final"][name]), name
        torch.testing.assert_close(first["final"][name], weight, rtol=0, atol=atol, msg=name)
    moved = max((w - one_process["initial"][k]).abs().max().item() for k, w in one_process["final"].items())
    assert moved > 1e-3  # it trained: the tolerance is far below what the weights moved


def test_only_the_first_node_writes_logs_and_checkpoints(char_lm_nodes):
    _, _, run_dir, _ = char_lm_nodes
    assert [p.name for p in (run_dir / "csv").iterdir()] == ["version_0"]
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and checkpoints[0] == "last.ckpt" and checkpoints[1].startswith("step")  # the best
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6


@pytest.fixture(scope="module")
def classifier_nodes(tmp_path_factory) -> list[dict]:
    _, records = launch_nodes(tmp_path_factory.mktemp("packed"), [*CLASSIFIER, *TWO_NODES], "lightning")
    return records


def test_packed_sequences_bucket_disjoint_shards_that_cover_the_data_each_epoch(classifier_nodes):
    """Lightning's DistributedSampler splits the data by global rank; PackedSequences buckets
    each node's shard by length."""
    per_node = TRAIN_SEQUENCES // NODES // BATCH
    for node in classifier_nodes:
        assert node["dataset_size"] == TRAIN_SEQUENCES
        assert node["samplers"] == ("LengthBucketBatchSampler", "DistributedSampler")
        assert len(node["batches"]) == EPOCHS * per_node == node["global_step"]
        assert all(b["lengths"] == sorted(b["lengths"], reverse=True) for b in node["batches"])  # bucketed
    for epoch in range(EPOCHS):
        shards = [[i for b in node["batches"] if b["epoch"] == epoch for i in b["indices"]]
                  for node in classifier_nodes]
        assert [len(set(s)) for s in shards] == [TRAIN_SEQUENCES // NODES] * NODES
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(TRAIN_SEQUENCES))


def test_packed_sequences_nodes_end_with_the_same_weights(classifier_nodes):
    first, second = classifier_nodes
    for name, weight in first["final"].items():
        assert torch.equal(weight, second["final"][name]), name
    assert any(not torch.equal(w, first["initial"][k]) for k, w in first["final"].items())
