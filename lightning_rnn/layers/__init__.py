"""Recurrent layers: TemporalAdapter and the fused LSTM/GRU."""
from ..kernels.batch import InputMismatchError
from .fused import FusedGRU, FusedLSTM
from .recurrent import FusedRNNBase
from .temporal_adapter import TemporalAdapter

__all__ = ["FusedGRU", "FusedLSTM", "FusedRNNBase", "InputMismatchError", "TemporalAdapter"]
