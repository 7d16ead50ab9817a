"""A per-step model (one label per real step) on packed variable-length batches: the loss,
the metrics and the epoch means see the real steps only."""
import pytest
import torch
import torch.nn.functional as F
from modules_helpers import adam, batches_loader, rnn_factory, tiny_trainer
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_sequence
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from lightning_rnn import TemporalAdapter
from lightning_rnn.callbacks import PackedSequences
from lightning_rnn.modules import RNNModule, pack_like

PAD = -100


class Tagger(RNNModule):
    """Token ids -> one of ``num_tags`` per step, as RNNModule's extension points say."""

    derived_arguments = ("input_size",)

    def __init__(self, num_tags: int = 3, **kwargs):
        super().__init__(input_size=4, **kwargs)
        self.input_layer = nn.Embedding(5, 4)
        self.output_layer = TemporalAdapter(nn.Linear(self.rnn_output_size, num_tags))

    def head(self, features):
        return self.output_layer(features)

    def compute_loss(self, predictions, batch):
        targets = batch["targets"]
        if isinstance(predictions, PackedSequence):
            targets = targets if isinstance(targets, PackedSequence) else pack_like(targets, predictions)
            return F.cross_entropy(predictions.data, targets.data)
        return F.cross_entropy(predictions.flatten(0, 1), targets.flatten(), ignore_index=PAD)

    def build_metrics(self):
        return MetricCollection({"acc": MulticlassAccuracy(num_classes=self.hparams.num_tags, average="micro")})


def tag_batches(num_batches, lengths=(5, 2, 7, 2)):
    """Padded batches: ``inputs`` ids (B, T), ``targets`` (B, T) padded with PAD, ``lengths``."""
    batches = []
    for _ in range(num_batches):
        inputs = [torch.randint(0, 5, (n,)) for n in lengths]
        batches.append({"inputs": pad_sequence(inputs, batch_first=True),
                        "targets": pad_sequence([x % 3 for x in inputs], batch_first=True, padding_value=PAD),
                        "lengths": torch.tensor(lengths)})
    return batches


def test_pack_like_packs_padded_rows_as_the_predictions_were_packed():
    lengths = torch.tensor([3, 5, 3, 1, 5])  # unsorted, with ties
    padded = torch.randn(5, 6, 2)
    packed = pack_padded_sequence(padded, lengths, batch_first=True, enforce_sorted=False)
    aligned = pack_like(padded, packed)
    torch.testing.assert_close(aligned.data, packed.data, rtol=0, atol=0)
    assert torch.equal(aligned.batch_sizes, packed.batch_sizes)
    assert torch.equal(aligned.sorted_indices, packed.sorted_indices)
    positions = pack_like(torch.arange(30).view(5, 6), packed).data  # which padded entry each row is
    torch.testing.assert_close(padded.flatten(0, 1)[positions], packed.data, rtol=0, atol=0)
    with torch.device("meta"):  # another default device (set for a GPU, say) changes nothing
        torch.testing.assert_close(pack_like(padded, packed).data, packed.data, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"padded: expected a batch-first tensor of 5 sequences of at least 5"):
        pack_like(torch.zeros(4, 6), packed)
    with pytest.raises(TypeError, match="like: expected a PackedSequence"):
        pack_like(padded, padded)


def test_per_step_metrics_score_the_real_steps_of_packed_predictions():
    """lengths pack the inputs, so the head predicts a PackedSequence: the metrics get its
    rows and the targets of those rows (they got ``predictions.detach()``, which a
    PackedSequence does not have)."""
    model = Tagger(rnn=rnn_factory(bidirectional=True), optimizer=adam())
    batches = tag_batches(2)
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(batches))
    trainer.validate(model, batches_loader(batches))
    with torch.no_grad():
        correct = total = 0
        for batch in batches:
            predictions, _ = model(batch["inputs"], lengths=batch["lengths"])
            real = batch["targets"] != PAD
            padded = torch.nn.utils.rnn.pad_packed_sequence(predictions, batch_first=True)[0]
            correct += (padded.argmax(-1)[real] == batch["targets"][real]).sum().item()
            total += real.sum().item()
    assert total == 2 * 16
    assert trainer.callback_metrics["val/acc"].item() == pytest.approx(correct / total)


def test_packed_targets_weigh_the_epoch_loss_by_their_real_steps():
    """``PackedSequences(pack_keys=["inputs", "targets"])``: the default loss_weight counts
    the packed targets' rows (it called ``.dim()`` on the PackedSequence), so the epoch
    loss is the mean over real steps."""
    model = Tagger(rnn=rnn_factory(), optimizer=adam(lr=0.0))
    batches = tag_batches(1, lengths=(6, 1)) + tag_batches(1, lengths=(2, 2))
    trainer = tiny_trainer(max_epochs=1, callbacks=[PackedSequences(pack_keys=["inputs", "targets"],
                                                                    bucketing=False)])
    trainer.fit(model, batches_loader([dict(b) for b in batches]), batches_loader([dict(b) for b in batches]))
    with torch.no_grad():
        losses = [model.shared_step(dict(b), "test")[0].item() for b in batches]
    expected = (7 * losses[0] + 4 * losses[1]) / 11
    assert trainer.callback_metrics["val/loss"].item() == pytest.approx(expected, rel=1e-5)
    assert trainer.callback_metrics["val/loss"].item() != pytest.approx(sum(losses) / 2, rel=1e-3)
