"""The fused layers on the cpp kernels with 2 intra-op threads (the rest of the
suite runs on one; tests/kernels/test_threads.py lists what runs in parallel): torch.nn
parity of deep, bidirectional, projected, packed layers whose batches split into parallel
chunks, with and without gradient checkpointing, and a model fed by DataLoader workers."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from layer_helpers import outputs_and_grads, random_initial_state
from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.data import SequenceClassificationDataModule
from lightning_rnn.modules import SequenceClassifier

CELLS = {"lstm": (FusedLSTM, nn.LSTM), "gru": (FusedGRU, nn.GRU)}
# (cell, proj_size); hidden 64: the pointwise passes split batches of more than 64 rows
CELL_CASES = [("lstm", 0), ("lstm", 5), ("gru", 0)]
CELL_IDS = ["lstm", "lstm_proj", "gru"]
I, H, T, B = 5, 64, 9, 67


def _projection(proj_size):
    return {"proj_size": proj_size} if proj_size else {}  # torch.nn.GRU takes no proj_size


def _packed_input(dtype):
    """(x leaf (T, B, I), a PackedSequence of it): lengths 1..T, unsorted, every step
    with a different number of rows (67 down to 1)."""
    x = torch.randn(T, B, I, dtype=dtype, requires_grad=True)
    lengths = torch.randint(1, T + 1, (B,))
    lengths[:T] = torch.arange(1, T + 1)
    lengths[B // 2] = T
    return x, pack_padded_sequence(x, lengths, enforce_sorted=False)


@pytest.mark.parametrize("threads", [2], indirect=True)  # 4 threads: in the kernel tests
@pytest.mark.parametrize("checkpoint_chunk_size", [None, 3], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("cell, proj_size", CELL_CASES, ids=CELL_IDS)
def test_matches_torch_nn_float64(cell, proj_size, checkpoint_chunk_size, threads):
    """Two bidirectional layers on packed sequences from a given state: outputs, final
    states and every gradient as torch.nn's (float64, the parity tests' tolerances)."""
    fused_class, torch_class = CELLS[cell]
    ref = torch_class(I, H, num_layers=2, bidirectional=True, dtype=torch.float64, **_projection(proj_size))
    fused = fused_class.from_torch(ref, backend="cpp")
    fused.checkpoint_chunk_size = checkpoint_chunk_size
    x, inp = _packed_input(torch.float64)
    hx = random_initial_state(fused, B)
    out_ref, states_ref, grads_ref = outputs_and_grads(ref, x, inp, hx)
    out, states, grads = outputs_and_grads(fused, x, inp, hx)
    torch.testing.assert_close(out, out_ref, rtol=1e-10, atol=1e-12)
    for s, s_ref in zip(states, states_ref, strict=True):
        torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-12)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("threads", [2], indirect=True)
@pytest.mark.parametrize("cell, proj_size", CELL_CASES, ids=CELL_IDS)
def test_checkpointed_float32_close_to_plain(cell, proj_size, threads):
    """float32, chunks of 3 steps (their W_hh and W_ih in panels packed once per pass, in
    parallel): outputs and gradients as without checkpointing, to float32 rounding."""
    fused_class, _ = CELLS[cell]
    layer = fused_class(I, H, num_layers=2, bidirectional=True, backend="cpp", **_projection(proj_size))
    x, inp = _packed_input(torch.float32)
    plain = outputs_and_grads(layer, x, inp, None)
    layer.checkpoint_chunk_size = 3
    chunked = outputs_and_grads(layer, x, inp, None)
    for got, want in zip([chunked[0], *chunked[1], *chunked[2]], [plain[0], *plain[1], *plain[2]], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [2], indirect=True)
def test_dataloader_workers_feed_a_model_on_two_threads(threads):
    """Two epochs of a classifier (2-layer bidirectional cpp LSTM, batches of 64
    variable-length sequences) whose batches DataLoader workers collate: forked at each
    epoch, the second time after the main process has run its kernels on two threads. The
    same parameters, bitwise, as with the batches collated in the main process."""

    def train(num_workers):
        data = SequenceClassificationDataModule(num_samples=160, min_len=2, max_len=12, batch_size=64,
                                                num_workers=num_workers)
        data.setup()
        torch.manual_seed(0)
        rnn = functools.partial(FusedLSTM, hidden_size=H, num_layers=2, bidirectional=True, backend="cpp")
        model = SequenceClassifier(**data.model_kwargs(), rnn=rnn, optimizer=functools.partial(torch.optim.Adam))
        optimizer = model.configure_optimizers()
        loader = data.train_dataloader()
        assert loader.num_workers == num_workers
        batches = 0
        for _ in range(2):
            for batch in loader:
                logits, _ = model(batch["inputs"], lengths=batch["lengths"])
                loss = F.cross_entropy(logits, batch["targets"])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                batches += 1
        assert torch.get_num_threads() == threads
        return batches, model.state_dict()

    batches, in_workers = train(2)
    assert batches == 4  # 128 training sequences, batch 64, 2 epochs
    main_batches, in_main = train(0)
    assert main_batches == batches and in_main.keys() == in_workers.keys()
    for name, value in in_workers.items():
        assert torch.equal(value, in_main[name]), name
