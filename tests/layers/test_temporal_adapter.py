import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence

from lightning_rnn import TemporalAdapter


def test_applies_to_every_timestep_with_one_call():
    linear = nn.Linear(3, 5)
    calls = []
    linear.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    x = torch.randn(2, 7, 3)
    y = TemporalAdapter(linear)(x)
    assert y.shape == (2, 7, 5) and calls == [(14, 3)]
    torch.testing.assert_close(y[1, 4], linear(x[1, 4]))


def test_packed_sequence_keeps_batch_sizes_and_order():
    packed = pack_sequence([torch.randn(2, 3), torch.randn(4, 3)], enforce_sorted=False)
    out = TemporalAdapter(nn.Linear(3, 6))(packed)
    assert out.data.shape == (6, 6)
    assert torch.equal(out.batch_sizes, packed.batch_sizes)
    assert torch.equal(out.unsorted_indices, packed.unsorted_indices)


def test_token_ids_with_item_dims_zero():
    emb = nn.Embedding(10, 4)
    ids = torch.randint(0, 10, (3, 5))
    assert TemporalAdapter(emb, item_dims=0)(ids).shape == (3, 5, 4)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module"):
        TemporalAdapter(lambda x: x)
    with pytest.raises(ValueError, match="x: expected at least 2 dimensions"):
        TemporalAdapter(nn.Linear(3, 3))(torch.randn(3))
