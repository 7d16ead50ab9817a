"""The cell options of the fused layers beyond torch.nn: their checks, parameters and inits.

Options of the same two layers (never other classes), documented in docs/layers.md:

- ``layer_norm``: LN(W_ih x) + LN(W_hh h) + b, and the LSTM's h = o * tanh(LN(c)) (Ba, Kiros
  & Hinton 2016); parameters ``layernorm_{ih,hh,c}_{weight,bias}_l{k}[_reverse]``;
- ``zoneout``: per unit and step keep the previous state with probability p (Krueger et
  al. 2016); the LSTM's as p or (p_cell, p_hidden);
- ``recurrent_dropout``: one mask per sequence on h_{t-1} entering W_hh (Gal & Ghahramani 2016);
- ``dropout_mode="variational"``: the between-layer dropout with one mask per sequence;
- ``weight_drop``: DropConnect on W_hh, one mask per forward call (Merity et al. 2017);
- ``forget_bias``, ``recurrent_init="orthogonal"``: initializations (Jozefowicz et al. 2015).
"""
from __future__ import annotations

import torch
from torch import nn

from ..utils.checks import check_choice, check_flag, check_number, check_probability

DROPOUT_MODES = ("standard", "variational")
RECURRENT_INITS = ("uniform", "orthogonal")
#: The options whose defaults make the layer torch.nn's.
TORCH_DEFAULTS = {"layer_norm": False, "zoneout": 0.0, "recurrent_dropout": 0.0, "weight_drop": 0.0,
                  "dropout_mode": "standard"}


def check_zoneout(value, lstm: bool) -> tuple[float, float]:
    """(p_cell, p_hidden): the LSTM's p (both) or (p_cell, p_hidden), the GRU's p (hidden only)."""
    if isinstance(value, (tuple, list)):
        if not lstm or len(value) != 2:
            expected = "a float in [0, 1) or a pair (p_cell, p_hidden)" if lstm else "a float in [0, 1) (a GRU has no cell state)"
            raise ValueError(f"zoneout: expected {expected}, got {value!r}")
        return check_probability("zoneout", value[0]), check_probability("zoneout", value[1])
    p = check_probability("zoneout", value)
    return (p, p) if lstm else (0.0, p)


def check_options(layer, *, layer_norm, zoneout, recurrent_dropout, dropout_mode, weight_drop, forget_bias,
                  recurrent_init) -> None:
    """Checks the options and sets them as the layer's attributes (plain ones: a callback may
    change a probability between calls)."""
    lstm = layer.cell.num_states == 2
    layer.layer_norm = check_flag("layer_norm", layer_norm)
    pair = check_zoneout(zoneout, lstm)
    layer.zoneout = pair if isinstance(zoneout, (tuple, list)) else pair[1]
    layer.recurrent_dropout = check_probability("recurrent_dropout", recurrent_dropout)
    layer.weight_drop = check_probability("weight_drop", weight_drop)
    layer.dropout_mode = check_choice("dropout_mode", dropout_mode, DROPOUT_MODES)
    layer.recurrent_init = check_choice("recurrent_init", recurrent_init, RECURRENT_INITS)
    if forget_bias is not None:
        if not lstm:
            raise ValueError(f"forget_bias: a GRU has no forget gate, got forget_bias={forget_bias!r}")
        if not layer.bias:
            raise ValueError(f"forget_bias: needs bias=True (the forget gate's bias), got forget_bias={forget_bias!r}")
        forget_bias = check_number("forget_bias", forget_bias)
    layer.forget_bias = forget_bias


def zoneout_pair(layer) -> tuple[float, float]:
    """The layer's zoneout as (p_cell, p_hidden), checked (it is a plain attribute)."""
    return check_zoneout(layer.zoneout, layer.cell.num_states == 2)


def used_options(layer) -> list[str]:
    """The options of ``layer`` torch.nn lacks that it uses, by argument name."""
    return [name for name, default in TORCH_DEFAULTS.items()
            if (any(zoneout_pair(layer)) if name == "zoneout" else getattr(layer, name) != default)]


def norm_names(layer, layer_index: int, direction: int) -> tuple[str, ...]:
    """One layer-direction's layer-norm parameter names (ih, hh, and the LSTM's c; weight, bias)."""
    sfx = layer._suffix(layer_index, direction)
    parts = ("ih", "hh", "c") if layer.cell.num_states == 2 else ("ih", "hh")
    return tuple(f"layernorm_{part}_{kind}{sfx}" for part in parts for kind in ("weight", "bias"))


def norm_layout(layer) -> list[tuple]:
    """Per layer-direction the layer-norm parameters as (name, shape), [] without layer_norm."""
    if not layer.layer_norm:
        return []
    G, H = layer.cell.num_gates, layer.hidden_size
    widths = (G * H, G * H, G * H, G * H, H, H)
    return [
        tuple((name, torch.Size((width,))) for name, width in zip(norm_names(layer, k, d), widths))
        for k in range(layer.num_layers) for d in range(layer.num_directions)
    ]


def reset_options(layer) -> None:
    """The options' initializations, after torch.nn's: norm gain 1 and bias 0, the forget
    gate's bias, orthogonal gate blocks of every W_hh."""
    with torch.no_grad():
        for layout in norm_layout(layer):
            for name, _ in layout:
                getattr(layer, name).fill_(1.0 if name.split("_")[2] == "weight" else 0.0)
        H = layer.hidden_size
        for k in range(layer.num_layers):
            for d in range(layer.num_directions):
                sfx = layer._suffix(k, d)
                if layer.forget_bias is not None:
                    getattr(layer, f"bias_ih{sfx}")[H : 2 * H] = layer.forget_bias
                    getattr(layer, f"bias_hh{sfx}")[H : 2 * H] = 0.0
                if layer.recurrent_init == "orthogonal":
                    for block in getattr(layer, f"weight_hh{sfx}").split(H):
                        nn.init.orthogonal_(block)
