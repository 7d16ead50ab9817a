"""Lightning callbacks for recurrent models: memory, precision, variable lengths, monitoring.

Each works with any Trainer and any LightningModule containing fused layers
(:class:`~lightning_rnn.layers.FusedLSTM` / :class:`~lightning_rnn.layers.FusedGRU`).
"""
from ..data.samplers import LengthBucketBatchSampler  # the sampler PackedSequences installs
from .gpu_memory import GPUMemoryLogger
from .gradient_checkpointing import GradientCheckpointing
from .loss_plot import LossPlot
from .mixed_precision import MixedPrecision, RNNMixedPrecision
from .packed_sequences import PackedSequences
from .progress_bar import StepLimitedProgressBar

__all__ = [
    "GPUMemoryLogger",
    "GradientCheckpointing",
    "LengthBucketBatchSampler",
    "LossPlot",
    "MixedPrecision",
    "PackedSequences",
    "RNNMixedPrecision",
    "StepLimitedProgressBar",
]
