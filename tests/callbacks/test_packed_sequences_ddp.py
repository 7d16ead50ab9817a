"""PackedSequences under real 2-process DDP on CPU (gloo): sharded, bucketed, synchronised.

One launch of ddp_packed_sequences.py (Lightning's strategy="ddp", devices=2) trains twice: with
the dataloader from a DataModule hook and passed to ``fit`` directly.
"""
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from callback_helpers import VariableLengthDataset
from ddp_packed_sequences import BATCH, EPOCHS, MAX_LEN, MIN_LEN, N

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCES = ("hook", "loader")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """source -> what rank 0 and rank 1 saved."""
    out = tmp_path_factory.mktemp("ddp_packed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("MASTER_PORT", None)  # Lightning picks a free port
    # A session of its own, so that a hang (rank 1 is Lightning's child, not ours) is killed as a whole.
    process = subprocess.Popen([sys.executable, str(HERE / "ddp_packed_sequences.py"), str(out)], cwd=out, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"DDP run timed out\n{output[-3000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # a rank left behind after a failure
        except ProcessLookupError:
            pass
    assert process.returncode == 0, f"exit {process.returncode}\n{output[-3000:]}"
    return {s: [torch.load(out / f"{s}.rank{r}.pt", weights_only=False) for r in (0, 1)] for s in SOURCES}


def padding_efficiency(lengths) -> float:
    """Real / padded tokens of batches given by their lengths."""
    return sum(int(b.sum()) for b in lengths) / sum(len(b) * int(b.max()) for b in lengths)


@pytest.mark.parametrize("source", SOURCES)
def test_ranks_split_the_dataset_and_bucket_their_shards(ranks, source):
    lengths = VariableLengthDataset(N, min_len=MIN_LEN, max_len=MAX_LEN).lengths
    per_epoch = N // 2 // BATCH
    shards = []
    for saved in ranks[source]:
        assert saved["world_size"] == 2
        assert saved["samplers"] == ("LengthBucketBatchSampler", "DistributedSampler")
        assert len(saved["seen"]) == EPOCHS * per_epoch
        assert all(s["packed"] for s in saved["seen"])
        for s in saved["seen"]:
            assert s["lengths"].tolist() == lengths[s["index"]].tolist()
        shards.append([[s for s in saved["seen"] if s["epoch"] == e] for e in range(EPOCHS)])
    g = torch.Generator().manual_seed(0)
    for epoch in range(EPOCHS):
        rank0, rank1 = ([i for s in shard[epoch] for i in s["index"]] for shard in shards)
        assert len(set(rank0)) == len(rank0) == N // 2 and len(set(rank1)) == len(rank1) == N // 2
        assert not set(rank0) & set(rank1)  # disjoint ...
        assert sorted(rank0 + rank1) == list(range(N))  # ... and together the whole dataset, once
        for shard in shards:
            batches = [s["lengths"] for s in shard[epoch]]
            assert all(len(b) == BATCH for b in batches) and len(batches) == per_epoch
            assert all(b.tolist() == sorted(b.tolist(), reverse=True) for b in batches)
            # the same shard in random batches (what a plain sampler gives): about 0.65 here
            indices = torch.tensor([i for s in shard[epoch] for i in s["index"]])
            shuffled = (indices[torch.randperm(len(indices), generator=g)] for _ in range(100))
            plain = sum(padding_efficiency(lengths[i].split(BATCH)) for i in shuffled) / 100
            bucketed = padding_efficiency(batches)
            assert bucketed >= 0.85 and bucketed >= plain + 0.15, (bucketed, plain)
    for shard in shards:  # the DistributedSampler reshuffles every epoch
        assert {i for s in shard[0] for i in s["index"]} != {i for s in shard[1] for i in s["index"]}


@pytest.mark.parametrize("source", SOURCES)
def test_training_finishes_with_identical_parameters_on_both_ranks(ranks, source):
    rank0, rank1 = ranks[source]
    assert rank0["global_step"] == rank1["global_step"] == EPOCHS * (N // 2 // BATCH)
    assert all(math.isfinite(s["loss"]) for saved in (rank0, rank1) for s in saved["seen"])
    assert rank0["final"].keys() == rank1["final"].keys()
    for name, value in rank0["final"].items():
        assert torch.equal(value, rank1["final"][name]), name  # different data, same gradients: DDP averaged them
    assert any(not torch.equal(value, rank0["initial"][name]) for name, value in rank0["final"].items())  # it trained
