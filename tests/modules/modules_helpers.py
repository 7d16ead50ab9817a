"""Tiny models and Trainers for the module tests."""
import functools

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_rnn.layers import FusedGRU, FusedLSTM

CELLS = {"lstm": FusedLSTM, "gru": FusedGRU}


def rnn_factory(cell="lstm", hidden_size=8, num_layers=1, backend="reference", **kwargs):
    """A fused layer factory; the reference backend unless told (no kernel build needed)."""
    return functools.partial(CELLS[cell], hidden_size=hidden_size, num_layers=num_layers, backend=backend, **kwargs)


def adam(lr=1e-2):
    return functools.partial(torch.optim.Adam, lr=lr)


def batches_loader(batches):
    """A DataLoader yielding the given (already batched) dicts in order."""
    return DataLoader(batches, batch_size=None)


def tiny_trainer(**kwargs):
    defaults = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)
    return pl.Trainer(**{**defaults, **kwargs})


def char_lm(**kwargs):
    """A tiny CharLanguageModel over the vocabulary "abc" (kwargs override its arguments)."""
    from lightning_rnn.modules import CharLanguageModel

    args = dict(vocab="abc", embedding_dim=4, rnn=rnn_factory(), optimizer=adam(), val_sample_length=0)
    return CharLanguageModel(**{**args, **kwargs})


def token_batches(num_batches, rows=2, steps=8, chunk_ids=None):
    """Batches of ids in {0, 1, 2}; with ``chunk_ids``, inputs are id ``chunk_ids[c]`` throughout
    time chunk ``c`` (of 4 steps)."""
    batches = []
    for _ in range(num_batches):
        if chunk_ids is None:
            inputs = torch.randint(0, 3, (rows, steps))
        else:
            inputs = torch.tensor(chunk_ids).repeat_interleave(4).expand(rows, -1).clone()
        batches.append({"inputs": inputs, "targets": torch.randint(0, 3, (rows, steps))})
    return batches
