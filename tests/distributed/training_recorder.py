"""A callback that records, on every process of a run, what it trained on and where it ended.

Added to a CLI run as ``+callbacks.recorder._target_=training_recorder.TrainingRecorder
+callbacks.recorder.out_dir=DIR`` (this folder on PYTHONPATH); each process writes
``DIR/rank{global_rank}.pt``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from lightning_rnn.data.streams import ContiguousStreams
from lightning_rnn.kernels import dispatch
from lightning_rnn.layers import FusedRNNBase


def item_key(inputs: torch.Tensor) -> bytes:
    """An item's identity: the bytes of its unpadded inputs (the synthetic sequences are all distinct)."""
    return inputs.contiguous().numpy().tobytes()


class TrainingRecorder(Callback):
    """Saves, per process: its ranks and cluster environment, the kernel backend its fused
    layers resolved to, its shard of the training data
    (the char streams it owns, or the dataset indices of every batch it trained on), every
    batch, and its weights at the start and the end of training."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir)
        self.record: dict = {}
        self._index_of: dict[bytes, int] = {}

    def on_train_start(self, trainer, pl_module):
        loader = trainer.train_dataloader
        self.record = {
            "initial": {k: v.detach().clone() for k, v in pl_module.state_dict().items()},
            "global_rank": trainer.global_rank, "node_rank": trainer.node_rank, "local_rank": trainer.local_rank,
            "world_size": trainer.world_size, "num_nodes": trainer.num_nodes,
            # a single-device strategy has none
            "environment": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
            "batches": [],
            "backends": sorted({dispatch.resolve(m.backend, pl_module.device) for m in pl_module.modules()
                                if isinstance(m, FusedRNNBase)}),
        }
        if isinstance(loader.dataset, ContiguousStreams):
            self.record["streams"] = loader.dataset.inputs.clone()  # (B, num_batches * seq_len)
        else:
            dataset = loader.dataset
            self.record["dataset_size"] = len(dataset)
            self.record["samplers"] = (type(loader.batch_sampler).__name__, type(loader.batch_sampler.sampler).__name__)
            self._index_of = {item_key(dataset[i]["inputs"]): i for i in range(len(dataset))}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        inputs, lengths = batch["inputs"], batch.get("lengths")
        entry = {"epoch": trainer.current_epoch}
        if isinstance(inputs, PackedSequence):  # PackedSequences packed it already
            inputs, _ = pad_packed_sequence(inputs, batch_first=True)  # (B, T_max, F), the batch's order
        if lengths is None:
            entry["inputs"] = inputs.clone()  # (B, seq_len) character ids
        else:
            entry["indices"] = [self._index_of[item_key(x[:n])] for x, n in zip(inputs, lengths.tolist())]
            entry["lengths"] = lengths.tolist()
        self.record["batches"].append(entry)

    def on_train_end(self, trainer, pl_module):
        self.record["global_step"] = trainer.global_step
        self.record["final"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(self.record, self.out_dir / f"rank{trainer.global_rank}.pt")
