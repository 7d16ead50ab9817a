"""lightning_rnn: fused, memory-efficient LSTM/GRU layers and a Lightning framework for RNNs."""
from .layers import FusedGRU, FusedLSTM, TemporalAdapter

__all__ = ["FusedGRU", "FusedLSTM", "TemporalAdapter"]
__version__ = "0.1.0"
