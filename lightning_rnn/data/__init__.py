"""Data: character corpora, synthetic long-range tasks, classification and forecasting."""
from .base import DictDataset, RNNDataModule
from .char_corpus import CharCorpusDataModule
from .classification import SequenceClassificationDataModule, pad_batch
from .corpora import PYTHON_STDLIB_FILES, CorpusUnavailableError, python_stdlib_text, tiny_shakespeare_path
from .forecasting import ForecastingDataModule
from .samplers import LengthBucketBatchSampler
from .streams import ContiguousStreams, ResumableLoader, StreamLoader, trainer_batches_done
from .synthetic import COPY_MEMORY_VOCAB, AddingProblemDataModule, CopyMemoryDataModule
from .vocab import CharVocab

__all__ = [
    "COPY_MEMORY_VOCAB",
    "PYTHON_STDLIB_FILES",
    "AddingProblemDataModule",
    "CharCorpusDataModule",
    "CharVocab",
    "ContiguousStreams",
    "CopyMemoryDataModule",
    "CorpusUnavailableError",
    "DictDataset",
    "ForecastingDataModule",
    "LengthBucketBatchSampler",
    "RNNDataModule",
    "ResumableLoader",
    "SequenceClassificationDataModule",
    "StreamLoader",
    "pad_batch",
    "python_stdlib_text",
    "tiny_shakespeare_path",
    "trainer_batches_done",
]
