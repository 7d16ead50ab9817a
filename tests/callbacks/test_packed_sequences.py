"""PackedSequences: bucketed batches, packed inputs, Lightning's batch size, what it logs."""
import pytest
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import RandomSampler

from lightning_rnn.callbacks import LengthBucketBatchSampler, PackedSequences

from callback_helpers import TinyClassifier, loader, make_trainer


def _fit(callbacks, data, max_steps=6):
    torch.manual_seed(0)
    model = TinyClassifier()
    trainer, logger = make_trainer(callbacks, max_steps=max_steps)
    trainer.fit(model, data)
    return model, logger


def test_bucketed_packed_batches_and_padding_efficiency():
    model, logger = _fit([PackedSequences(bucket_size=64)], loader(n=64, batch_size=8, min_len=2, max_len=40))
    assert all(s["packed"] for s in model.seen)
    spreads = [int(s["lengths"].max() - s["lengths"].min()) for s in model.seen]
    assert max(spreads) <= 12  # similar lengths in every batch (lengths span 2..40)
    bucketed = logger.values("packed/padding_efficiency")
    assert len(bucketed) == 6 and sum(bucketed) / 6 >= 0.8  # the shortest batches pad most
    assert all(v > 0 for v in logger.values("packed/tokens_per_sec"))

    plain, plain_logger = _fit([PackedSequences(bucketing=False)], loader(n=64, batch_size=8, min_len=2, max_len=40))
    assert all(s["packed"] for s in plain.seen)
    assert sum(plain_logger.values("packed/padding_efficiency")) < 0.8 * sum(bucketed)


class BatchSizeProbe(TinyClassifier):
    """Logs without batch_size=..., so Lightning must infer the batch size itself."""

    def training_step(self, batch, batch_idx):
        self.log("probe", float(len(batch["lengths"])), on_step=False, on_epoch=True)
        return super().training_step(batch, batch_idx)


class Data(LightningDataModule):
    def train_dataloader(self):
        return loader(n=20, batch_size=8)  # batches of 8, 8 and 4


def test_lightning_sees_the_number_of_sequences_as_batch_size():
    model = BatchSizeProbe()
    trainer, logger = make_trainer([PackedSequences()], max_steps=3)
    trainer.fit(model, datamodule=Data())
    sizes = [len(s["lengths"]) for s in model.seen]
    assert sorted(sizes) == [4, 8, 8]
    # epoch mean weighted by the batch size Lightning used: sum(B * B) / sum(B)
    assert logger.values("probe") == [pytest.approx(sum(b * b for b in sizes) / sum(sizes))]
    assert trainer.datamodule.train_dataloader().batch_sampler.__class__.__name__ == "BatchSampler"  # restored


def test_sampler_yields_every_index_once_in_length_sorted_batches():
    lengths = torch.randint(1, 100, (103,))
    sampler = LengthBucketBatchSampler(RandomSampler(range(103)), batch_size=10, drop_last=False, lengths=lengths, bucket_size=50)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 11
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert sum(len(b) < 10 for b in batches) == 1
    for b in batches:
        assert lengths[b].tolist() == sorted(lengths[b].tolist(), reverse=True)
    dropped = LengthBucketBatchSampler(RandomSampler(range(103)), 10, drop_last=True, lengths=lengths, bucket_size=50)
    assert len(list(dropped)) == len(dropped) == 10


@pytest.mark.parametrize("bucket_size", [50, 140])
def test_drop_last_leaves_out_other_sequences_each_epoch_not_the_shortest(bucket_size):
    """Like BatchSampler: the sampler's last N % batch_size indices, random under shuffling,
    not the buckets' leftovers (their shortest sequences, the same ones every epoch)."""
    torch.manual_seed(0)
    lengths = torch.randperm(103) + 1
    sampler = LengthBucketBatchSampler(RandomSampler(range(103)), 10, drop_last=True, lengths=lengths,
                                       bucket_size=bucket_size)
    shortest = {int(i) for i in lengths.argsort()[:3]}
    ever_dropped, shortest_dropped = set(), 0
    for _ in range(30):
        batches = list(sampler)
        assert len(batches) == 10 and all(len(b) == 10 for b in batches)
        seen = {i for b in batches for i in b}
        assert len(seen) == 100
        dropped = set(range(103)) - seen
        ever_dropped |= dropped
        shortest_dropped += dropped == shortest
    assert shortest_dropped < 3 and len(ever_dropped) > 30  # different sequences, not the 3 shortest


def test_bad_arguments_and_batches():
    with pytest.raises(ValueError, match="bucket_size: expected None or an int >= 1, got 0"):
        PackedSequences(bucket_size=0)
    with pytest.raises(TypeError, match="bucket_size: expected None or an int >= 1, got '8'"):
        PackedSequences(bucket_size="8")
    with pytest.raises(ValueError, match=r"bucket_size: expected None or an int >= 10, got 5"):  # the batch size
        LengthBucketBatchSampler(range(20), 10, False, lengths=torch.ones(20), bucket_size=5)
    with pytest.raises(ValueError, match=r"lengths: expected one length per item of the dataset \(12 given\), but the "
                                         r"sampler draws indices 0..19"):  # not an IndexError from the sort
        list(LengthBucketBatchSampler(range(20), 10, False, lengths=torch.ones(12)))
    with pytest.raises(TypeError, match="PackedSequences: expected dict batches with 'inputs'"):
        PackedSequences().pack(None, (torch.zeros(2, 3, 1), torch.tensor([3, 2])))
    with pytest.raises(TypeError,
                       match=r"expected dict batches with 'inputs' .* got dict with keys \['lengths', 'x'\]"):
        PackedSequences().pack(None, {"x": torch.zeros(2, 3, 1), "lengths": torch.tensor([3, 2])})  # not a KeyError


def test_the_bucketed_loader_keeps_the_loader_s_settings():
    from torch.utils.data import DataLoader

    items = [{"inputs": torch.zeros(n, 1), "lengths": n} for n in range(1, 9)]
    settings = dict(num_workers=2, pin_memory=True, pin_memory_device="cpu", in_order=False, timeout=5.0,
                    prefetch_factor=3, persistent_workers=True)
    settings = {k: v for k, v in settings.items() if k in DataLoader.__init__.__code__.co_varnames}
    original = DataLoader(items, batch_size=4, shuffle=True, **settings)
    copy = PackedSequences().bucketed(original)
    assert {k: getattr(copy, k) for k in settings} == settings
