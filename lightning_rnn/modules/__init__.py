"""LightningModules: RNNModule (the base to subclass) and its family."""
from .char_lm import CharLanguageModel
from .classifier import SequenceClassifier
from .packing import pack_like
from .regressor import SequenceRegressor
from .rnn_module import RNNModule

__all__ = ["CharLanguageModel", "RNNModule", "SequenceClassifier", "SequenceRegressor", "pack_like"]
