"""SequenceClassifier and SequenceRegressor: packing, pooling, shapes, learning."""
import pytest
import torch
from modules_helpers import adam, batches_loader, rnn_factory, tiny_trainer
from torch.nn.utils.rnn import pack_padded_sequence

from lightning_rnn.data import pad_batch
from lightning_rnn.modules import SequenceClassifier, SequenceRegressor


def classifier(pooling="last", bidirectional=False, cell="lstm"):
    rnn = rnn_factory(cell, hidden_size=6, num_layers=2, bidirectional=bidirectional)
    return SequenceClassifier(input_size=3, num_classes=4, pooling=pooling, rnn=rnn, optimizer=adam()).eval()


def variable_batch(lengths=(5, 2, 7)):
    items = [{"inputs": torch.randn(n, 3), "targets": torch.tensor(i % 4)} for i, n in enumerate(lengths)]
    return items, pad_batch(items)


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_padding_does_not_change_a_sequences_logits(pooling, bidirectional, cell):
    model = classifier(pooling, bidirectional, cell)
    items, batch = variable_batch()
    with torch.no_grad():
        batched, _ = model(batch["inputs"], lengths=batch["lengths"])
        alone = torch.cat([model(item["inputs"].unsqueeze(0))[0] for item in items])
    assert batched.shape == (3, 4)
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


def test_classifier_accepts_already_packed_inputs():
    model = classifier()
    _, batch = variable_batch()
    packed = pack_padded_sequence(batch["inputs"], batch["lengths"], batch_first=True, enforce_sorted=False)
    with torch.no_grad():
        from_packed, _ = model(packed)
        from_padded, _ = model(batch["inputs"], lengths=batch["lengths"])
    torch.testing.assert_close(from_packed, from_padded)


def test_classifier_logs_accuracy():
    model = classifier()
    _, batch = variable_batch()
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader([batch]), batches_loader([batch]))
    with torch.no_grad():
        logits, _ = model(batch["inputs"], lengths=batch["lengths"])
    expected = (logits.argmax(-1) == batch["targets"]).float().mean().item()
    assert trainer.callback_metrics["val/acc"].item() == pytest.approx(expected)


def test_predict_gives_each_batch_its_predictions(tmp_path):
    model = classifier()
    _, batch = variable_batch()
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader([batch]))
    predicted = trainer.predict(model, batches_loader([batch, batch]))
    with torch.no_grad():
        expected, _ = model(batch["inputs"], lengths=batch["lengths"])
    assert len(predicted) == 2 and predicted[0].shape == (3, 4)
    torch.testing.assert_close(predicted[1], expected)
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    restored = SequenceClassifier.load_from_checkpoint(tmp_path / "model.ckpt").eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(batch["inputs"], lengths=batch["lengths"])[0], expected)


def test_regressor_learns_a_linear_readout():
    """Target: the sum of each sequence's first feature; a small GRU fits it quickly."""
    torch.manual_seed(0)
    inputs = torch.rand(64, 5, 2)
    batch = {"inputs": inputs, "targets": inputs[..., :1].sum(1, keepdim=True).repeat(1, 2, 1)}
    model = SequenceRegressor(input_size=2, output_size=1, horizon=2, rnn=rnn_factory("gru", hidden_size=16),
                              optimizer=adam(2e-2))
    with torch.no_grad():
        predictions, _ = model(inputs)
    assert predictions.shape == (64, 2, 1)
    initial = model.compute_loss(predictions, batch).item()
    trainer = tiny_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(model, batches_loader([batch] * 150))
    with torch.no_grad():
        final = model.compute_loss(model(inputs)[0], batch).item()
    assert final < 0.05 * initial


@pytest.mark.parametrize("build, message", [
    (lambda: SequenceClassifier(input_size=3, num_classes=1, rnn=rnn_factory(), optimizer=adam()), "num_classes"),
    (lambda: SequenceClassifier(input_size=3, num_classes=3, pooling="max", rnn=rnn_factory(), optimizer=adam()),
     "pooling"),
    (lambda: SequenceRegressor(input_size=3, output_size=1, loss="huber", rnn=rnn_factory(), optimizer=adam()),
     "loss"),
    (lambda: SequenceRegressor(input_size=3, output_size=0, rnn=rnn_factory(), optimizer=adam()), "output_size"),
    (lambda: SequenceClassifier(input_size=3, num_classes=3, tbptt_steps=4, rnn=rnn_factory(), optimizer=adam()),
     "tbptt_steps: SequenceClassifier predicts one label per sequence"),
    (lambda: SequenceRegressor(input_size=3, output_size=1, tbptt_steps=4, rnn=rnn_factory(), optimizer=adam()),
     "tbptt_steps: SequenceRegressor predicts one forecast per sequence"),
])
def test_bad_arguments_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build()


class MeanPooledClassifier(SequenceClassifier):
    """A user's subclass the obvious way: its own names, base arguments computed or fixed."""

    def __init__(self, n_in: int, n_out: int, **kwargs):
        super().__init__(input_size=n_in, num_classes=n_out, pooling="mean", **kwargs)


def test_subclass_computing_base_arguments_restores_from_its_checkpoint(tmp_path):
    model = MeanPooledClassifier(3, 4, rnn=rnn_factory(hidden_size=6), optimizer=adam()).eval()
    _, batch = variable_batch()
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader([batch]))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    saved = torch.load(tmp_path / "model.ckpt", weights_only=False)["hyper_parameters"]
    assert set(saved) == {"n_in", "n_out", "rnn", "optimizer"}  # not input_size, num_classes, pooling
    restored = MeanPooledClassifier.load_from_checkpoint(tmp_path / "model.ckpt").eval()
    assert restored.hparams.pooling == "mean" and restored.hparams.input_size == 3
    with torch.no_grad():
        torch.testing.assert_close(restored(batch["inputs"], lengths=batch["lengths"])[0],
                                   model.eval()(batch["inputs"], lengths=batch["lengths"])[0])


class ForwardingClassifier(SequenceClassifier):
    """A subclass forwarding everything, positional arguments included."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


def test_subclass_forwarding_positional_arguments_restores_from_its_checkpoint(tmp_path):
    """input_size and num_classes came in through *args: the checkpoint must keep them."""
    model = ForwardingClassifier(3, 4, "mean", rnn=rnn_factory(hidden_size=6), optimizer=adam()).eval()
    _, batch = variable_batch()
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader([batch]))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    saved = torch.load(tmp_path / "model.ckpt", weights_only=True)["hyper_parameters"]
    assert {"input_size", "num_classes", "pooling", "rnn", "optimizer"} <= set(saved)
    restored = ForwardingClassifier.load_from_checkpoint(tmp_path / "model.ckpt").eval()
    assert restored.hparams.pooling == "mean" and restored.hparams.num_classes == 4
    with torch.no_grad():
        torch.testing.assert_close(restored(batch["inputs"], lengths=batch["lengths"])[0],
                                   model(batch["inputs"], lengths=batch["lengths"])[0])


@pytest.mark.parametrize("change, message", [
    (lambda b: {**b, "targets": b["targets"].float()}, r"targets: expected integer class ids of shape \(3,\), got "
                                                       r"torch.float32 of shape \(3,\)"),
    (lambda b: {**b, "targets": b["targets"].unsqueeze(1)}, r"targets: .* got torch.int64 of shape \(3, 1\)"),
    (lambda b: {**b, "lengths": b["lengths"] + 1}, r"lengths: expected lengths in \[1, 7\] .* got 3..8"),
    (lambda b: {**b, "lengths": b["lengths"][:2]}, r"lengths: expected one length per sequence \(3\), got 2"),
    (lambda b: {**b, "inputs": b["inputs"][..., 0]}, r"inputs: expected floats of shape \(B, T, 3\) or a "
                                                     r"PackedSequence, got torch.float32 of shape \(3, 7\)"),
])
def test_bad_batches_are_named(change, message):
    model = classifier()
    _, batch = variable_batch()
    with pytest.raises(ValueError, match=message):
        model.shared_step(change(batch), "val")


class PairFeatureClassifier(SequenceClassifier):
    """Base arguments computed and fixed, listed in derived_arguments (as docs/training.md says)."""

    derived_arguments = ("input_size", "pooling")

    def __init__(self, num_features: int, **kwargs):
        super().__init__(input_size=2 * num_features, num_classes=2, pooling="mean", **kwargs)


def test_derived_arguments_are_left_out_of_the_logged_hyperparameters_only(tmp_path):
    """The modules read their arguments from hparams (the pooling, the input size in an
    error message), which derived_arguments emptied: an AttributeError at the first forward."""
    model = PairFeatureClassifier(2, rnn=rnn_factory(), optimizer=adam())
    assert model.hparams.pooling == "mean" and model.hparams.input_size == 4
    assert not {"input_size", "pooling"} & set(model.hparams_initial)
    assert {"num_features", "num_classes", "rnn"} <= set(model.hparams_initial)
    with pytest.raises(ValueError, match=r"inputs: expected floats of shape \(B, T, 4\) or a PackedSequence, "
                                         r"got torch.float32 of shape \(3, 7\)"):
        model(torch.zeros(3, 7))
    inputs = torch.randn(3, 7, 4)
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader([{"inputs": inputs, "targets": torch.tensor([0, 1, 1])}]))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    restored = PairFeatureClassifier.load_from_checkpoint(tmp_path / "model.ckpt")
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(inputs)[0], model.eval()(inputs)[0])


def test_lengths_may_be_a_list_and_int32_targets_are_class_ids():
    model = classifier()
    _, batch = variable_batch()
    loss, logits, _ = model.shared_step(batch, "val")
    listed = {**batch, "lengths": batch["lengths"].tolist(), "targets": batch["targets"].int()}
    loss_listed, logits_listed, _ = model.shared_step(listed, "val")
    torch.testing.assert_close(logits_listed, logits)
    torch.testing.assert_close(loss_listed, loss)


class TokenClassifier(SequenceClassifier):
    """Text classification: token ids embedded before the rnn (the float check steps aside)."""

    def __init__(self, vocab_size: int, **kwargs):
        super().__init__(input_size=5, num_classes=2, **kwargs)
        self.input_layer = torch.nn.Embedding(vocab_size, 5)


def test_a_subclass_embedding_token_ids_takes_integer_inputs():
    model = TokenClassifier(11, rnn=rnn_factory(hidden_size=6), optimizer=adam())
    batch = {"inputs": torch.randint(0, 11, (3, 6)), "lengths": torch.tensor([6, 2, 4]), "targets": torch.tensor([0, 1, 1])}
    loss, logits, _ = model.shared_step(batch, "val")
    assert logits.shape == (3, 2) and torch.isfinite(loss)


@pytest.mark.parametrize("targets, message", [
    (torch.zeros(4, 1), r"targets: expected floats of shape \(4, 1, 1\) \(batch, horizon, output_size\), got "
                        r"torch.float32 of shape \(4, 1\)"),  # MSE would broadcast it to (4, 4, 1)
    (torch.zeros(4, 1, 1, dtype=torch.long), r"got torch.int64 of shape \(4, 1, 1\)"),
])
def test_regressor_targets_of_another_shape_are_named(targets, message):
    model = SequenceRegressor(input_size=2, output_size=1, horizon=1, rnn=rnn_factory(), optimizer=adam())
    predictions, _ = model(torch.rand(4, 5, 2))
    with pytest.raises(ValueError, match=message):
        model.compute_loss(predictions, {"inputs": None, "targets": targets})
