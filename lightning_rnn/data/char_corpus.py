"""Character-level corpus: any local text file or a built-in corpus."""
from __future__ import annotations

from torch.utils.data import DataLoader

from ..utils.checks import check_choice, check_file, check_int
from .base import RNNDataModule, read_text_file, split_sizes
from .corpora import BUILTIN_CORPORA, load_corpus, tiny_shakespeare_path
from .streams import ContiguousStreams, StreamLoader, trainer_batches_done
from .vocab import CharVocab


class CharCorpusDataModule(RNNDataModule):
    """A text split into contiguous train/val/test parts, batched in torch-rnn's layout.

    Args:
        path: a local UTF-8 text file. If None, the built-in ``corpus`` is used.
        corpus: ``"python_stdlib"`` (embedded, no network) or ``"tiny_shakespeare"``
            (downloaded once into ``cache_dir``).
        cache_dir: where downloads are cached (default ``$LIGHTNING_RNN_CACHE`` or
            ``~/.cache/lightning_rnn``).
        batch_size: streams per process (rows per batch).
        seq_len: characters per row and batch.
        val_fraction, test_fraction: the last parts of the text held out, in that order.

    Every batch row is its own contiguous stream (see :class:`ContiguousStreams`), so a
    model may carry its hidden state from one batch to the next. The vocabulary covers
    the whole text and is handed to the model (:meth:`model_kwargs`), which stores it in
    its checkpoint.
    """

    def __init__(
        self,
        path: str | None = None,
        corpus: str = "python_stdlib",
        cache_dir: str | None = None,
        batch_size: int = 50,
        seq_len: int = 50,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
    ):
        super().__init__(batch_size=batch_size)
        if path is None:
            check_choice("corpus", corpus, BUILTIN_CORPORA)
        self.path, self.corpus, self.cache_dir = check_file("path", path, optional=True), corpus, cache_dir
        self.seq_len = check_int("seq_len", seq_len, 1)
        self.fractions = (val_fraction, test_fraction)
        split_sizes(1, *self.fractions)  # validates the fractions now, not at setup
        self.vocab: CharVocab | None = None

    def prepare_data(self) -> None:
        if self.path is None and self.corpus == "tiny_shakespeare":
            tiny_shakespeare_path(self.cache_dir)  # download once, on one process

    def read_text(self) -> str:
        if self.path is None:
            return load_corpus(self.corpus, self.cache_dir)
        text = read_text_file(self.path)
        if not text:
            raise ValueError(f"path: {self.path} is empty")
        return text

    def build_datasets(self) -> dict:
        text = self.read_text()
        self.vocab = CharVocab.from_text(text)
        ids = self.vocab.encode(text)
        n_train, n_val, _ = split_sizes(len(ids), *self.fractions)
        return {"train": ids[:n_train], "val": ids[n_train : n_train + n_val], "test": ids[n_train + n_val :]}

    def model_kwargs(self) -> dict:
        return {"vocab": self.vocab.chars}

    def _dataloader(self, split: str) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        tokens, needed = self.datasets[split], self.batch_size * world * self.seq_len + 1
        if len(tokens) < needed:
            fix = "raise val_fraction/test_fraction" if split != "train" else "use a longer text"
            raise ValueError(
                f"seq_len: the {split} split has {len(tokens)} characters, too few for one batch of "
                f"batch_size={self.batch_size}{f' x {world} processes' if world > 1 else ''} streams of "
                f"seq_len={self.seq_len} (at least {needed}); lower batch_size or seq_len, or {fix}"
            )
        streams = ContiguousStreams(tokens, self.batch_size, self.seq_len, rank, world)
        if split != "train":
            return DataLoader(streams, batch_size=None)  # in-memory slices: no workers needed
        return StreamLoader(streams, batches_done=lambda: trainer_batches_done(self.trainer))  # resumable
