"""CharLanguageModel: streamed sampling, determinism, checkpoints."""
import pytest
import torch
from modules_helpers import adam, batches_loader, rnn_factory, tiny_trainer

from lightning_rnn.modules import CharLanguageModel

VOCAB = "\nabcdefgh "


@pytest.fixture
def model():
    return CharLanguageModel(vocab=VOCAB, embedding_dim=6, rnn=rnn_factory(hidden_size=12, num_layers=2),
                             optimizer=adam())


def test_sample_is_deterministic_under_a_seed(model):
    first = model.sample("abc", length=40, temperature=1.0, seed=7)
    assert first == model.sample("abc", length=40, temperature=1.0, seed=7)
    assert first != model.sample("abc", length=40, temperature=1.0, seed=8)
    assert first.startswith("abc") and len(first) == 43 and set(first) <= set(VOCAB)


def test_streamed_sampling_matches_one_pass_over_the_text(model):
    """Carrying state one character at a time gives the logits of one pass over the whole
    text, so greedy decoding must agree with the argmax of a single forward."""
    text = model.sample("ab", length=12, temperature=0)
    ids = model.vocab.encode(text).unsqueeze(0)
    with torch.no_grad():
        logits, _ = model(ids[:, :-1])
    assert torch.equal(logits.argmax(-1)[0, 1:], ids[0, 2:])


def test_top_k_one_is_greedy(model):
    assert model.sample("a", 15, temperature=1.0, top_k=1, seed=3) == model.sample("a", 15, temperature=0)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(start_text="z"), ValueError, "start_text: characters not in the vocabulary: 'z'"),
    (dict(temperature=-1.0), ValueError, "temperature: expected a finite number >= 0"),
    (dict(temperature=float("nan")), ValueError, "temperature: expected a finite number >= 0, got nan"),
    (dict(temperature=float("inf"), length=0), ValueError, "temperature"),  # checked before any step
    (dict(temperature="hot"), TypeError, "temperature: expected a finite number >= 0, got 'hot'"),
    (dict(top_k=0), ValueError, "top_k"),
    (dict(top_k=2.0), TypeError, "top_k: expected None or an int >= 1, got 2.0"),
    (dict(length=-1), ValueError, "length"),
    (dict(seed="1"), TypeError, "seed: expected None or an int, got '1'"),  # not torch's manual_seed error
    (dict(seed=1.5), TypeError, "seed: expected None or an int, got 1.5"),
    (dict(top_p=0.0), ValueError, r"top_p: expected None or a finite number in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), ValueError, "top_p: expected None or a finite number in"),
    (dict(num_samples=0), ValueError, "num_samples: expected an int >= 1, got 0"),
    (dict(num_samples=2.0), TypeError, "num_samples: expected an int >= 1, got 2.0"),
    (dict(stop=""), ValueError, "stop: expected None or a non-empty str, got ''"),
    (dict(stop=["\n"]), TypeError, "stop: expected None or a non-empty str"),
    (dict(decoder="fast"), ValueError, "decoder: expected one of 'auto', 'compiled', 'loop', got 'fast'"),
    (dict(on_text="print"), TypeError, r"on_text: expected None or a callable on_text\(index, text\)"),
])
def test_sample_rejects_bad_arguments(model, arguments, error, message):
    with pytest.raises(error, match=message):
        model.sample(**{"start_text": "a", "length": 5, **arguments})


def test_a_refused_sample_leaves_the_training_mode_as_it_was(model):
    """sample() switched to eval mode before it read start_text: a caller that caught the
    error trained on with dropout off."""
    model.train()
    with pytest.raises(ValueError, match="start_text"):
        model.sample("abz", 10)
    with pytest.raises(TypeError, match="start_text"):
        model.sample(["ab", "cd"], 10)
    assert model.training
    model.sample("ab", 3)
    assert model.training


@pytest.mark.parametrize("arguments, error, message", [
    (dict(rnn=rnn_factory(bidirectional=True)), ValueError,
     "rnn: a language model reads left to right; a bidirectional rnn's reverse direction would read"),
    (dict(embedding_dim=-1), ValueError, "embedding_dim: expected an int >= 1, got -1"),  # not input_size
    (dict(scheduler="cosine"), TypeError, "scheduler: expected None or a factory scheduler"),  # not at fit
])
def test_bad_model_settings_are_named_at_construction(arguments, error, message):
    """A bidirectional encoder would read the very characters it is to predict."""
    with pytest.raises(error, match=message):
        CharLanguageModel(vocab=VOCAB, **{"rnn": rnn_factory(), "optimizer": adam(), **arguments})


def test_batches_with_lengths_are_named(model):
    """Packed by the batch's lengths, the logits reached the loss as a PackedSequence (an
    AttributeError inside cross_entropy's call)."""
    batch = {"inputs": torch.randint(0, 5, (3, 6)), "targets": torch.randint(0, 5, (3, 6)),
             "lengths": torch.tensor([6, 4, 2])}
    with pytest.raises(ValueError, match="lengths: CharLanguageModel trains on fixed-length character streams"):
        model.shared_step(batch, "train")


def test_sample_takes_numpy_and_tensor_numbers(model):
    np = pytest.importorskip("numpy")
    expected = model.sample("a", 10, temperature=0.5, top_k=3, seed=2)
    assert model.sample("a", 10, temperature=np.float32(0.5), top_k=np.int64(3), seed=2) == expected
    assert model.sample("a", 10, temperature=torch.tensor(0.5), top_k=torch.tensor(3), seed=2) == expected
    assert model.sample("a", np.int64(10), temperature=0.5, top_k=3, seed=np.int64(2)) == expected
    assert model.sample("a", torch.tensor(10), temperature=0.5, top_k=3, seed=torch.tensor(2)) == expected


@pytest.mark.parametrize("arguments, error, message", [
    (dict(val_sample_length=-1), ValueError, "val_sample_length: expected an int >= 0, got -1"),
    (dict(val_sample_length="200"), TypeError, "val_sample_length: expected an int >= 0, got '200'"),
    (dict(val_sample_temperature=-0.5), ValueError, "val_sample_temperature: expected a finite number >= 0, got -0.5"),
])
def test_bad_validation_sample_settings_are_refused_at_construction(arguments, error, message):
    """Not after a whole training interval, when the first validation samples."""
    with pytest.raises(error, match=message):
        CharLanguageModel(vocab=VOCAB, rnn=rnn_factory(), optimizer=adam(), **arguments)


def test_a_tiny_temperature_is_greedy_not_nan(model):
    """Dividing the raw logits by 1e-40 overflowed float32 to inf and softmax gave NaN."""
    assert model.sample("ab", 12, temperature=1e-40, seed=0) == model.sample("ab", 12, temperature=0)


@pytest.mark.parametrize("length", [0, 1, 7])
def test_an_empty_start_gives_exactly_length_characters(model, length):
    """The uniformly drawn first character is one of the ``length`` (val samples of 200
    characters had 201)."""
    text = model.sample("", length, seed=4)
    assert len(text) == length and set(text) <= set(VOCAB)


def test_checkpoint_alone_restores_the_model_and_its_vocabulary(model, tmp_path):
    batches = [{"inputs": torch.randint(0, 10, (2, 8)), "targets": torch.randint(0, 10, (2, 8))}]
    trainer = tiny_trainer(max_epochs=1)
    trainer.fit(model, batches_loader(batches))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=True)  # plain data: the factories described
    assert checkpoint["lightning_rnn_class"] == "lightning_rnn.modules.char_lm.CharLanguageModel"
    assert checkpoint["hyper_parameters"]["rnn"]["_target_"] == "lightning_rnn.FusedLSTM"
    assert checkpoint["hyper_parameters"]["vocab"] == VOCAB
    restored = CharLanguageModel.load_from_checkpoint(tmp_path / "model.ckpt")
    assert restored.vocab.chars == VOCAB
    assert restored.sample("a", 30, seed=1) == model.sample("a", 30, seed=1)


@pytest.mark.parametrize("inputs, message", [
    (torch.tensor([[0, len(VOCAB)]]), rf"inputs: expected ids in \[0, {len(VOCAB) - 1}\] .* got ids from 0 to {len(VOCAB)}"),
    (torch.tensor([[-1, 2]]), "inputs: expected ids in .* got ids from -1 to 2"),
    (torch.zeros(1, 3), r"inputs: expected integer character ids of shape \(B, T\), got torch.float32 of shape \(1, 3\)"),
])
def test_inputs_that_are_not_ids_of_the_vocabulary_are_named(model, inputs, message):
    """Were the embedding's IndexError ('index out of range in self'; a device-side assert on
    a GPU) or its dtype RuntimeError."""
    with pytest.raises(ValueError, match=message):
        model(inputs)
    packed = torch.nn.utils.rnn.pack_padded_sequence(inputs, torch.tensor([inputs.shape[1]]), batch_first=True)
    with pytest.raises(ValueError, match=message.replace(r"of shape \(1, 3\)", r"of shape \(3,\)")):
        model(packed)


def test_validation_samples_keep_only_the_newest(monkeypatch):
    """One sample per validation, and the table logged is the newest ``val_samples_kept``
    of them: a table of every sample grew without bound over a long run (each log wrote
    all of them again)."""
    logged = []
    monkeypatch.setattr("lightning_rnn.modules.char_lm.log_text_samples",
                        lambda loggers, key, rows: logged.append(list(rows)))
    monkeypatch.setattr(CharLanguageModel, "val_samples_kept", 3, raising=False)
    model = CharLanguageModel(vocab=VOCAB, embedding_dim=6, rnn=rnn_factory(), optimizer=adam(), val_sample_length=4)
    batches = [{"inputs": torch.randint(0, 10, (2, 8)), "targets": torch.randint(0, 10, (2, 8))}]
    trainer = tiny_trainer(max_epochs=5)
    trainer.fit(model, batches_loader(batches), batches_loader(batches))
    assert [len(rows) for rows in logged] == [1, 2, 3, 3, 3]
    assert [step for step, _ in logged[-1]] == [3, 4, 5]  # global steps of the last three validations
    assert all(len(text) == 4 for _, text in logged[-1])


def test_num_samples_gives_a_list_of_texts_drawn_side_by_side(model):
    texts = model.sample("ab", 30, seed=3, num_samples=4)
    assert len(texts) == 4 and len(set(texts)) == 4
    assert all(t.startswith("ab") and len(t) == 32 for t in texts)
    assert model.sample("ab", 30, seed=3, num_samples=1) == [model.sample("ab", 30, seed=3)]
    firsts = {t[0] for t in model.sample("", 3, seed=3, num_samples=30)}  # each draws its own first character
    assert len(firsts) > 1


def test_top_p_keeps_the_most_likely_characters(model):
    """A nucleus this small holds the most likely character alone: greedy decoding."""
    assert model.sample("ab", 25, seed=0, top_p=1e-6) == model.sample("ab", 25, temperature=0)
    assert model.sample("ab", 25, seed=0, top_p=1.0) == model.sample("ab", 25, seed=0)


def test_a_text_of_no_new_characters_still_reaches_on_text(model):
    pieces = []
    assert model.sample("abc", 0, on_text=lambda i, text: pieces.append((i, text)), num_samples=2) == ["abc", "abc"]
    assert pieces == [(0, "abc"), (1, "abc")]
    assert model.sample("", 0, num_samples=2) == ["", ""]


def test_validation_samples_go_to_the_console_where_no_logger_takes_text(tmp_path, caplog):
    """logger=csv or none: each validation's sample is an INFO line of the module's logger
    (the console and cli.log of a command-line run); TensorBoard (or wandb) takes it instead."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    batches = [{"inputs": torch.randint(0, 10, (2, 8)), "targets": torch.randint(0, 10, (2, 8))}]
    for logger, shown in [(False, 2), (CSVLogger(tmp_path), 2), (TensorBoardLogger(tmp_path), 0)]:
        model = CharLanguageModel(vocab=VOCAB, embedding_dim=6, rnn=rnn_factory(), optimizer=adam(),
                                  val_sample_length=7)
        caplog.clear()
        with caplog.at_level("INFO", logger="lightning_rnn.modules.char_lm"):
            tiny_trainer(max_epochs=2, logger=logger).fit(model, batches_loader(batches), batches_loader(batches))
        lines = [r.getMessage() for r in caplog.records if r.name == "lightning_rnn.modules.char_lm"]
        assert len(lines) == shown
        assert lines == [f"val/samples at step {step}:\n{text}" for step, text in model._val_samples][:shown]
