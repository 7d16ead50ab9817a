"""Recurrent layers: TemporalAdapter and the fused LSTM/GRU."""
from .cells import FusedGRU, FusedLSTM
from .recurrent import FusedRNNBase
from .sequence import InputMismatchError
from .temporal_adapter import TemporalAdapter

__all__ = ["FusedGRU", "FusedLSTM", "FusedRNNBase", "InputMismatchError", "TemporalAdapter"]
