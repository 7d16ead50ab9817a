"""torch.nn.RNNBase's surface for code written against torch.nn.LSTM/GRU, and conversion.

The fused layers keep their weights as torch.nn does (same names, shapes and gate order),
so a state dict, ``_flat_weights``-based weight drop, ``all_weights`` and
``flatten_parameters`` work as they do on torch.nn's layers, and :meth:`from_torch` /
:meth:`to_torch` copy a layer between the two.
"""
from __future__ import annotations

from torch import nn

from .cell_options import TORCH_DEFAULTS, used_options

#: Constructor arguments shared with torch.nn.LSTM/GRU.
TORCH_CONFIG_KEYS = (
    "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional", "proj_size"
)
#: One layer-direction's weights in torch.nn's order (``layer_weights``).
WEIGHT_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")


class TorchRNNCompat:
    """Mixin of :class:`~lightning_rnn.layers.recurrent.FusedRNNBase` with torch.nn.RNNBase's attributes."""

    @property
    def mode(self) -> str:
        return self.torch_class.__name__  # "LSTM" or "GRU"

    @property
    def _all_weights(self) -> list[list[str]]:
        kinds = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if self.bias else ())
        kinds += ("weight_hr",) if self.proj_size else ()
        return [
            [f"{kind}{self._suffix(layer, d)}" for kind in kinds]
            for layer in range(self.num_layers)
            for d in range(self.num_directions)
        ]

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    @property
    def _flat_weights_names(self) -> list[str]:
        return [name for names in self._all_weights for name in names]

    @property
    def _flat_weights(self) -> list:
        return [getattr(self, name) for name in self._flat_weights_names]

    @_flat_weights.setter
    def _flat_weights(self, weights) -> None:
        """What torch.nn's weight-replacing code (weight drop, ...) assigns after swapping
        weights: each entry is set as its attribute (the forward reads the attributes)."""
        names, weights = self._flat_weights_names, list(weights)
        if len(weights) != len(names):
            raise ValueError(f"_flat_weights: expected {len(names)} tensors ({', '.join(names)}), got {len(weights)}")
        for name, w in zip(names, weights):
            if getattr(self, name, None) is not w:
                setattr(self, name, w)

    def flatten_parameters(self) -> None:
        """Kept for drop-in compatibility with torch.nn: the weights are always in kernel layout."""

    def _config(self) -> dict:
        """Constructor arguments shared with torch.nn (proj_size only where the cell has it:
        torch.nn.GRU refuses even proj_size=0)."""
        return {k: getattr(self, k) for k in TORCH_CONFIG_KEYS if k != "proj_size" or self.cell.projects}

    @classmethod
    def from_torch(cls, module: nn.Module, *, backend: str = "auto"):
        """A fused copy of a ``torch.nn.LSTM``/``GRU``: same weights, dtype, device, train/eval
        mode and frozen parameters."""
        if not isinstance(module, cls.torch_class):
            raise TypeError(f"module: expected a torch.nn.{cls.torch_class.__name__}, got {type(module).__name__}")
        ref = module.weight_ih_l0
        config = {k: getattr(module, k) for k in TORCH_CONFIG_KEYS}
        fused = cls(**config, backend=backend, device=ref.device, dtype=ref.dtype)
        return copy_module_state(module, fused)

    def to_torch(self) -> nn.Module:
        """A ``torch.nn.LSTM``/``GRU`` copy of this layer: same weights, dtype, device,
        train/eval mode and frozen parameters. A ValueError names an option torch.nn lacks
        that the layer uses (layer_norm, zoneout, recurrent_dropout, weight_drop, variational
        dropout); the regularizers change nothing in evaluation, so setting them to 0 (or
        ``dropout_mode="standard"``) first converts the function the layer computes there."""
        used = used_options(self)
        if used:
            raise ValueError(f"{used[0]}: torch.nn.{self.torch_class.__name__} has no {used[0]}; a copy would "
                             f"compute another function (set {used[0]}={TORCH_DEFAULTS[used[0]]!r} first where "
                             "that is what you want)")
        ref = self.weight_ih_l0
        module = self.torch_class(**self._config(), device=ref.device, dtype=ref.dtype)
        return copy_module_state(self, module)


def copy_module_state(source: nn.Module, target: nn.Module) -> nn.Module:
    """Weights, train/eval mode and which parameters are frozen, from ``source`` to ``target``."""
    target.load_state_dict(source.state_dict())
    frozen = {name for name, p in source.named_parameters() if not p.requires_grad}
    for name, p in target.named_parameters():
        p.requires_grad_(name not in frozen)
    return target.train(source.training)
