"""Character data: vocabulary, torch-rnn stream layout, corpora, the char DataModule."""
import pytest
import torch

from lightning_rnn.data import CharCorpusDataModule, CharVocab, ContiguousStreams, StreamLoader, corpora


def test_vocab_round_trip_and_unknown_characters():
    vocab = CharVocab.from_text("hello world")
    assert vocab.chars == " dehlorw"
    assert vocab.decode(vocab.encode("low")) == "low"
    with pytest.raises(ValueError, match="text: characters not in the vocabulary: 'axz'"):
        vocab.encode("zax")
    with pytest.raises(ValueError, match="chars"):
        CharVocab("aa")


def test_streams_rows_continue_across_batches():
    tokens = torch.arange(1001)
    streams = ContiguousStreams(tokens, batch_size=4, seq_len=10)
    batches = list(streams)
    assert len(batches) == len(streams) == 1000 // 40
    for previous, batch in zip(batches, batches[1:]):
        # row b of the next batch starts where row b of this one ended
        assert torch.equal(batch["inputs"][:, 0], previous["inputs"][:, -1] + 1)
    first = batches[0]
    assert torch.equal(first["targets"], first["inputs"] + 1)
    assert first["inputs"].shape == (4, 10)


def test_streams_of_two_ranks_make_the_one_process_batch():
    tokens = torch.randint(0, 50, (5000,))
    single = list(ContiguousStreams(tokens, batch_size=8, seq_len=16))
    ranks = [list(ContiguousStreams(tokens, batch_size=4, seq_len=16, rank=r, world_size=2)) for r in (0, 1)]
    assert len(single) == len(ranks[0]) == len(ranks[1])
    for i, batch in enumerate(single):
        assert torch.equal(batch["inputs"], torch.cat([ranks[0][i]["inputs"], ranks[1][i]["inputs"]]))


@pytest.mark.parametrize("kwargs, error, message", [
    ({"batch_size": 0}, ValueError, "batch_size: expected an int >= 1, got 0"),
    ({"seq_len": 4000}, ValueError, "tokens: .* too few"),
    ({"rank": 2}, ValueError, r"rank: expected an int in \[0, 0\], got 2"),
    ({"batch_size": True}, TypeError, "batch_size: expected an int >= 1, got True"),
])
def test_streams_reject_bad_arguments(kwargs, error, message):
    args = {"tokens": torch.arange(3000), "batch_size": 2, "seq_len": 5, **kwargs}
    with pytest.raises(error, match=message):
        ContiguousStreams(**args)


def test_python_stdlib_corpus_is_deterministic_and_large():
    text = corpora.python_stdlib_text()
    assert text == corpora.python_stdlib_text()
    assert len(text) > 500_000
    assert "def " in text and "class " in text


def test_tiny_shakespeare_downloads_once(tmp_path, monkeypatch):
    calls = []

    def fake_download(url, dest):
        calls.append(url)
        dest.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")

    monkeypatch.setattr(corpora, "download", fake_download)
    path = corpora.tiny_shakespeare_path(tmp_path)
    assert corpora.tiny_shakespeare_path(tmp_path) == path
    assert calls == [corpora.TINY_SHAKESPEARE_URL]
    assert path.read_text().startswith("First Citizen")


def test_tiny_shakespeare_offline_error_names_data_path(tmp_path, monkeypatch):
    def offline(url, dest):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(corpora, "download", offline)
    with pytest.raises(corpora.CorpusUnavailableError, match="data.path="):
        corpora.tiny_shakespeare_path(tmp_path)


def test_a_cache_that_is_a_file_or_an_empty_cached_copy_is_named(tmp_path, monkeypatch):
    """A cache path that is a file, and an empty cached copy, are named as such (not a
    FileExistsError, nor the vocabulary's "chars: expected a non-empty string")."""
    monkeypatch.setattr(corpora, "download", lambda url, dest: pytest.fail("no download expected"))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(corpora.CorpusUnavailableError, match=r"cache directory \S*file .* cannot be made"):
        corpora.tiny_shakespeare_path(not_a_dir)
    (tmp_path / "tinyshakespeare.txt").write_text("")
    with pytest.raises(corpora.CorpusUnavailableError, match=r"tinyshakespeare.txt, is empty: delete it"):
        corpora.load_corpus("tiny_shakespeare", tmp_path)


def test_a_file_s_byte_order_mark_is_not_a_character(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("abcab" * 400, encoding="utf-8-sig")
    dm = CharCorpusDataModule(path=str(path), batch_size=2, seq_len=10)
    dm.setup()
    assert dm.vocab.chars == "abc"  # the BOM is no fourth character


def test_char_datamodule_splits_a_file_in_order(tmp_path):
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    dm = CharCorpusDataModule(path=str(path), batch_size=5, seq_len=20, val_fraction=0.1, test_fraction=0.1)
    dm.setup()
    assert dm.model_kwargs() == {"vocab": "abcdefghijklmnopqrstuvwxyz"}
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [8000, 1000, 1000]
    batch = next(iter(dm.train_dataloader()))
    assert dm.vocab.decode(batch["inputs"][0]) == text[:20]
    assert dm.vocab.decode(next(iter(dm.val_dataloader()))["inputs"][0]) == text[8000:8020]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"path": "/no/such/file.txt"}, ValueError, "path: no such file '/no/such/file.txt'"),
    ({"path": 3}, TypeError, "path: expected None or a file path, got 3"),
    ({"corpus": "war_and_peace"}, ValueError, "corpus: expected one of 'python_stdlib', 'tiny_shakespeare'"),
    ({"val_fraction": 0.7}, ValueError, r"val_fraction: expected a finite number in \(0, 0.5\), got 0.7"),
    ({"val_fraction": "abc"}, TypeError, r"val_fraction: expected a finite number in \(0, 0.5\), got 'abc'"),
])
def test_char_datamodule_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        CharCorpusDataModule(**kwargs)


def test_streams_keep_their_order_with_dataloader_workers():
    """Each worker yields every W-th batch; the loader takes them in turn: the same batches
    in the same order as without workers (each worker yielded all of them, twice as many)."""
    streams = ContiguousStreams(torch.arange(1001), 5, 10)
    plain = list(torch.utils.data.DataLoader(streams, batch_size=None))
    workers = list(torch.utils.data.DataLoader(streams, batch_size=None, num_workers=2))
    assert len(workers) == len(plain) == 20
    assert all(torch.equal(a["inputs"], b["inputs"]) for a, b in zip(workers, plain))


def test_a_split_too_short_for_one_batch_is_named(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefghij" * 1000)
    dm = CharCorpusDataModule(path=str(path), batch_size=4, seq_len=100, val_fraction=0.1, test_fraction=0.03)
    dm.setup()
    dm.train_dataloader()
    with pytest.raises(ValueError, match=r"seq_len: the test split has 300 characters, too few for one batch of "
                                         r"batch_size=4 streams of seq_len=100 \(at least 401\)"):
        dm.test_dataloader()


@pytest.mark.parametrize("content, message", [
    (b"", "path: .* is empty"),
    ("caf\u00e9 ".encode("latin-1") * 50, "path: .* is not UTF-8 text"),
])
def test_unreadable_corpus_files_are_named(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        CharCorpusDataModule(path=str(path), batch_size=1, seq_len=2).setup()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_loader_resumes_a_pass_once_then_starts_from_the_first_batch(num_workers):
    streams = ContiguousStreams(torch.arange(1001), 5, 10)  # 20 batches
    loader = StreamLoader(streams, batches_done=lambda: 6, num_workers=num_workers)
    assert loader.state_dict() == {"batches_done": 6}
    firsts = [int(b["inputs"][0, 0]) for b in loader]
    loader.load_state_dict(loader.state_dict())
    resumed = [int(b["inputs"][0, 0]) for b in loader]
    assert resumed == firsts[6:]
    assert [int(b["inputs"][0, 0]) for b in loader] == firsts  # the next pass is whole
    loader.load_state_dict({"batches_done": 20})  # saved at the end of a pass: the next one is whole
    assert len(list(loader)) == 20


def test_a_run_resumed_mid_epoch_reads_the_rest_of_that_epoch(tmp_path):
    """Lightning saves the train loader's state in checkpoints: the resumed run sees the batches the
    uninterrupted one saw after the checkpoint (a plain DataLoader restarts the pass)."""
    import functools

    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_rnn import FusedLSTM
    from lightning_rnn.modules import CharLanguageModel

    class Record(Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            self.seen.append((trainer.current_epoch, batch_idx, batch["inputs"][:, 0].tolist()))

    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 30)

    def run(max_epochs, ckpt_path=None, callbacks=(), **trainer_args):
        torch.manual_seed(0)
        data = CharCorpusDataModule(path=str(path), batch_size=3, seq_len=8, val_fraction=0.1, test_fraction=0.1)
        data.setup()
        model = CharLanguageModel(vocab=data.vocab.chars, embedding_dim=4, val_sample_length=0,
                                  rnn=functools.partial(FusedLSTM, hidden_size=8), stateful=True,
                                  optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        record = Record()
        trainer = Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                          limit_val_batches=0, callbacks=[record, *callbacks], default_root_dir=tmp_path,
                          **trainer_args)
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return record.seen, trainer

    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    whole, trainer = run(2, callbacks=[saver])
    per_epoch = trainer.num_training_batches
    assert per_epoch > 4 and len(whole) == 2 * per_epoch
    resumed, _ = run(2, ckpt_path=tmp_path / "ckpt" / "step=4.ckpt")
    assert resumed == whole[4:]  # batch 4 of epoch 0 onwards: the same indices and the same text

    # an epoch cut short by limit_train_batches, resumed from its end: the next epoch starts at batch 0
    saver = ModelCheckpoint(dirpath=tmp_path / "short", save_top_k=-1, filename="{epoch}")
    whole, _ = run(2, limit_train_batches=3)
    run(1, callbacks=[saver], limit_train_batches=3)
    resumed, _ = run(2, ckpt_path=tmp_path / "short" / "epoch=0.ckpt", limit_train_batches=3)
    assert resumed == whole[3:]
