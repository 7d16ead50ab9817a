"""The saved-for-backward meter, and the activation-memory targets of the layers."""
import pytest
import torch
from torch import nn

from lightning_rnn import FusedGRU, FusedLSTM
from lightning_rnn.bench.baselines import CellLoop
from lightning_rnn.utils.memory import SavedTensorsMeter, saved_tensor_bytes


def test_counts_distinct_storages_once_and_excludes_parameters():
    w = nn.Parameter(torch.randn(4, 4))
    x = torch.randn(8, 4, requires_grad=True)
    with SavedTensorsMeter(exclude=[w]) as meter:
        y = x @ w  # saves x and w
        z = (x[:4] * x[4:]).sum()  # saves two views of x's storage
    assert meter.bytes == x.numel() * 4
    assert y.requires_grad and z.requires_grad


# cell -> (torch.nn class, fused class, target vs torch.nn, target vs the naive cell loop)
TARGETS = {"lstm": (nn.LSTM, FusedLSTM, 0.40, 0.75), "gru": (nn.GRU, FusedGRU, 0.65, None)}


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("cell", list(TARGETS))
def test_activation_memory_targets(cell, layers):
    torch_cls, fused_cls, vs_torch, vs_loop = TARGETS[cell]
    ref = torch_cls(32, 32, layers)
    fused = fused_cls.from_torch(ref, backend="reference")
    x = torch.randn(20, 8, 32, requires_grad=True)
    ours = saved_tensor_bytes(lambda: fused(x)[0], exclude=fused)
    assert ours <= vs_torch * saved_tensor_bytes(lambda: ref(x)[0], exclude=ref)
    if vs_loop is not None:
        loop = CellLoop.like(ref)
        assert ours <= vs_loop * saved_tensor_bytes(lambda: loop(x), exclude=loop)


def test_inter_layer_dropout_costs_one_byte_per_element():
    layer = FusedLSTM(16, 16, num_layers=3, dropout=0.5, backend="reference").train()
    x = torch.randn(10, 4, 16, requires_grad=True)
    with_dropout = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    layer.dropout = 0.0
    without = saved_tensor_bytes(lambda: layer(x)[0], exclude=layer)
    assert with_dropout - without == 2 * 10 * 4 * 16  # two bool masks of (T*B, H)
