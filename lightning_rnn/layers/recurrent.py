"""The driver shared by FusedLSTM and FusedGRU: parameters, argument checks, one call into the kernels.

A cell type is a :class:`~lightning_rnn.kernels.cell.CellSpec` (gates, states, whether it
projects) plus the torch.nn class it replaces. A forward reads top to bottom:

1. check the arguments once (the weights, the input against them, the initial states);
2. normalize the input into one batch description (:class:`~lightning_rnn.kernels.batch.SequenceBatch`:
   padded or packed, length-sorted, time-major) and the states into its order;
3. one call into the kernels (:func:`lightning_rnn.kernels.run.run`), which picks the path;
4. restore the caller's format (layout, batch order, unbatched).

Weight layout: each ``weight_ih_l{k}`` is ``(G*H, I)`` row-major with the gates fused in one
matrix, exactly torch.nn's layout. That is the layout the kernels read contiguously: the
input projection ``x @ W_ih^T`` and the recurrent ``h @ W_hh^T`` are NT GEMMs that walk each
weight row in memory order, so no per-forward repacking is needed and a torch.nn state dict
loads as is. torch.nn's other attributes and the conversions are in :mod:`.torch_compat`.
"""
from __future__ import annotations

import math
import warnings
from typing import ClassVar

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..kernels import checkpointing, dispatch
from ..kernels.batch import InputMismatchError, SequenceBatch
from ..kernels.cell import CellSpec
from ..kernels.run import RunOptions, run
from ..utils.checks import check_flag, check_int, check_probability
from . import cell_options
from .torch_compat import WEIGHT_KINDS, TorchRNNCompat


class FusedRNNBase(TorchRNNCompat, nn.Module):
    """Multi-layer, optionally bidirectional recurrent layer running fused kernels."""

    cell: ClassVar[CellSpec]
    torch_class: ClassVar[type]  # the torch.nn layer it replaces

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
        *,
        backend: str = "auto",
        checkpoint_chunk_size: int | str | None = None,
        layer_norm: bool = False,
        zoneout: float | tuple[float, float] = 0.0,
        recurrent_dropout: float = 0.0,
        dropout_mode: str = "standard",
        weight_drop: float = 0.0,
        forget_bias: float | None = None,
        recurrent_init: str = "uniform",
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.input_size = check_int("input_size", input_size, 1)
        self.hidden_size = check_int("hidden_size", hidden_size, 1)
        self.num_layers = check_int("num_layers", num_layers, 1)
        self.dropout = check_probability("dropout", dropout, include_one=True)
        if self.dropout and self.num_layers == 1:
            warnings.warn(
                f"dropout={self.dropout} has no effect with num_layers=1: it applies between stacked layers "
                "(as in torch.nn)",
                UserWarning,
                stacklevel=2,
            )
        self.bias = check_flag("bias", bias)
        self.batch_first = check_flag("batch_first", batch_first)
        self.bidirectional = check_flag("bidirectional", bidirectional)
        self.proj_size = check_int("proj_size", proj_size, 0)
        if self.proj_size and not self.cell.projects:
            raise ValueError(f"proj_size: only FusedLSTM has a projection (as in torch.nn), got {proj_size!r}")
        if self.proj_size >= self.hidden_size:
            raise ValueError(f"proj_size: expected an int < hidden_size={self.hidden_size}, got {proj_size!r}")
        self.backend = dispatch.check_backend_name(backend)
        # Gradient checkpointing over time (None = off, an int, or "sqrt" = ceil(sqrt(T)) per
        # call); a plain attribute so callbacks can switch it. See kernels/checkpointing.py.
        self.checkpoint_chunk_size = checkpointing.check_chunk_size(checkpoint_chunk_size)
        # The cell options beyond torch.nn (see cell_options.py), plain attributes like the above.
        cell_options.check_options(
            self, layer_norm=layer_norm, zoneout=zoneout, recurrent_dropout=recurrent_dropout,
            dropout_mode=dropout_mode, weight_drop=weight_drop, forget_bias=forget_bias, recurrent_init=recurrent_init,
        )
        if self.backend == "torch" and cell_options.used_options(self):
            raise ValueError(f"{cell_options.used_options(self)[0]}: backend='torch' (torch.nn's implementation) "
                             "has none of the cell options; use a kernel backend (auto, cpp, cuda, reference)")
        factory = {"device": device, "dtype": dtype}
        for layout in self._weight_layout() + cell_options.norm_layout(self):  # torch.nn's parameters first
            for entry in layout:
                if entry is not None:
                    name, shape = entry
                    self.register_parameter(name, nn.Parameter(torch.empty(shape, **factory)))
        self.reset_parameters()

    # ----- parameters -------------------------------------------------------------
    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """Columns of h (and of each direction's output): ``proj_size`` if set, else ``hidden_size``."""
        return self.proj_size or self.hidden_size

    @staticmethod
    def _suffix(layer: int, direction: int) -> str:
        return f"_l{layer}" + ("_reverse" if direction == 1 else "")

    def reset_parameters(self) -> None:
        """torch.nn's initialization, U(-1/sqrt(H), 1/sqrt(H)) for each of torch.nn's
        parameters, then the cell options' (cell_options.reset_options)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for layout in self._weight_layout():
            for entry in layout:
                if entry is not None:
                    nn.init.uniform_(getattr(self, entry[0]), -bound, bound)
        cell_options.reset_options(self)

    def layer_weights(self, layer: int, direction: int) -> tuple:
        """(w_ih, w_hh, b_ih, b_hh, w_hr) of one layer-direction, torch.nn's order; biases are
        None without bias, w_hr (the projection) None without proj_size."""
        sfx = self._suffix(layer, direction)
        b_ih, b_hh = (getattr(self, f"bias_ih{sfx}"), getattr(self, f"bias_hh{sfx}")) if self.bias else (None, None)
        w_hr = getattr(self, f"weight_hr{sfx}") if self.proj_size else None
        return getattr(self, f"weight_ih{sfx}"), getattr(self, f"weight_hh{sfx}"), b_ih, b_hh, w_hr

    def _weight_layout(self) -> list[tuple]:
        """Per layer-direction, ``WEIGHT_KINDS``' five entries as (name, torch.nn's shape), None
        where the configuration has no such weight; computed once per configuration."""
        config = (self.input_size, self.hidden_size, self.num_layers, self.bias, self.bidirectional, self.proj_size)
        if getattr(self, "_weight_layout_for", None) != config:
            G, H, P, D = self.cell.num_gates, self.hidden_size, self.output_size, self.num_directions
            layout = []
            for layer in range(self.num_layers):
                shapes = {"weight_ih": (G * H, self.input_size if layer == 0 else P * D), "weight_hh": (G * H, P)}
                if self.bias:
                    shapes.update(bias_ih=(G * H,), bias_hh=(G * H,))
                if self.proj_size:
                    shapes["weight_hr"] = (P, H)
                for d in range(D):
                    sfx = self._suffix(layer, d)
                    layout.append(tuple(
                        (kind + sfx, torch.Size(shapes[kind])) if kind in shapes else None for kind in WEIGHT_KINDS
                    ))
            self._weight_layout_for, self._weight_layout_cache = config, layout
        return self._weight_layout_cache

    # ----- forward ------------------------------------------------------------------
    def forward(self, input, hx=None):
        """Same contract as torch.nn: ``(output, h_n)`` for GRU, ``(output, (h_n, c_n))`` for LSTM.

        input: (T, B, I), (B, T, I) with batch_first, (T, I) unbatched, or a PackedSequence.
        hx:    initial state(s) (L*D, B, P) h_0 and (L*D, B, H) c_0 ((L*D, ...) unbatched) in the
               caller's batch order; P = proj_size if set, else H.
        """
        if torch.compiler.is_compiling():  # torch.compile / torch.export: see _forward_outside_graph
            return _forward_outside_graph(self, input, hx)
        return self._forward(input, hx)

    def _forward(self, input, hx):
        weights = self._checked_weights(self._weight_layout())  # (L*D) tuples of WEIGHT_KINDS
        norms = self._checked_weights(cell_options.norm_layout(self)) if self.layer_norm else None
        batch = SequenceBatch.from_input(input, self.batch_first, self.input_size)
        self._check_input_matches_weights(batch.source)
        states = None if hx is None else [batch.sort_state(s) for s in self._checked_states(hx, batch)]
        options = RunOptions(self.num_layers, self.num_directions, self.output_size, self.hidden_size,
                             self.dropout, self.training, self.checkpoint_chunk_size, self.dropout_mode,
                             cell_options.zoneout_pair(self), self.recurrent_dropout, self.weight_drop)
        out, final = run(self.cell, self.backend, batch, states, weights, options, norms)
        final = [batch.restore_state(s) for s in final]
        return batch.restore(out), (tuple(final) if self.cell.num_states > 1 else final[0])

    # ----- argument checks ------------------------------------------------------------
    def _checked_weights(self, layouts: list[tuple]) -> list[tuple]:
        """Every layer-direction's weights of ``layouts`` (``_weight_layout``: as
        :meth:`layer_weights` gives them; or the layer norms'), read once per forward (a
        parametrized weight is evaluated once), and checked: every weight a tensor in its
        shape, so that a replaced weight of another shape (a parameter, a parametrization's
        result or a plain tensor) is named here, not in a kernel; the parameters in one dtype
        and on one device (a parametrization may give a layer another dtype: the per-layer
        path converts between layers)."""
        params, reference, layers = self._parameters, None, []
        for layout in layouts:
            weights = []
            for entry in layout:
                if entry is None:  # no bias, no projection
                    weights.append(None)
                    continue
                name, shape = entry
                w = params.get(name)
                is_parameter = w is not None
                if not is_parameter:  # parametrized (this evaluates it), or replaced by another attribute
                    w = getattr(self, name, None)
                    if not isinstance(w, torch.Tensor):
                        raise TypeError(f"{name}: expected a tensor of shape {tuple(shape)}, got {_describe(w)}")
                if w.shape != shape:
                    raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(w.shape)}")
                if is_parameter and reference is None:
                    reference = name, w
                elif is_parameter and (w.dtype != reference[1].dtype or w.device != reference[1].device):
                    raise ValueError(f"{name}: expected {reference[1].dtype} on {reference[1].device} like "
                                     f"{reference[0]}, got {w.dtype} on {w.device}")
                weights.append(w)
            layers.append(tuple(weights))
        return layers

    def _check_input_matches_weights(self, x: torch.Tensor) -> None:
        """Input and weights on one device, in one dtype (but under autocast), or an
        InputMismatchError: the ValueError torch.nn raises for the dtype, the RuntimeError
        for the device."""
        w = self._parameters.get("weight_ih_l0")
        if w is None and parametrize.is_parametrized(self, "weight_ih_l0"):
            w = self.parametrizations.weight_ih_l0.original  # its stored tensor: evaluating costs a call
        elif w is None:  # no longer a parameter
            w = self.weight_ih_l0
        if x.device != w.device:
            raise InputMismatchError(f"input: expected a tensor on {w.device} like the layer's weights, got {x.device}")
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise InputMismatchError(
                f"input: dtype {x.dtype} does not match the layer's weights ({w.dtype}); "
                f"convert the input or the layer (e.g. layer.to({x.dtype}))"
            )

    def _checked_states(self, hx, batch: SequenceBatch) -> tuple[torch.Tensor, ...]:
        """``hx`` as a tuple (h_0[, c_0]) of (L*D, B, P) and (L*D, B, H) tensors (without B
        for an unbatched input) in the input's dtype and on its device, or an error naming it."""
        L, B = self.num_layers * self.num_directions, batch.batch
        widths = (self.output_size, self.hidden_size)[: self.cell.num_states]  # h_0, c_0
        shapes = [(L, w) if batch.unbatched else (L, B, w) for w in widths]
        if len(widths) > 1:
            if not isinstance(hx, (tuple, list)) or len(hx) != len(widths):
                raise TypeError(
                    f"hx: {type(self).__name__} expects a tuple (h_0, c_0) of tensors of shapes {shapes[0]} and "
                    f"{shapes[1]}, got {_describe(hx)}"
                )
        elif not isinstance(hx, torch.Tensor):
            raise TypeError(f"hx: {type(self).__name__} expects a tensor h_0 of shape {shapes[0]}, got {_describe(hx)}")
        else:
            hx = (hx,)
        x = batch.source
        for label, s, expected in zip(("h_0", "c_0"), hx, shapes):
            if not isinstance(s, torch.Tensor):
                raise TypeError(f"hx: {label} must be a tensor, got {_describe(s)}")
            if s.shape != expected:
                raise InputMismatchError(f"hx: expected {label} of shape {expected}, got {tuple(s.shape)}")
            if s.device != x.device:
                raise InputMismatchError(f"hx: expected {label} on {x.device}, got {s.device}")
            if s.dtype != x.dtype and not torch.is_autocast_enabled(s.device.type):
                raise InputMismatchError(f"hx: expected {label} of dtype {x.dtype} like the input, got {s.dtype}")
        return tuple(hx)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        # torch.nn's order: proj_size first
        defaults = dict(proj_size=0, num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False)
        config = self._config()
        s += "".join(f", {k}={config[k]}" for k, v in defaults.items() if config.get(k, v) != v)  # GRU: no proj
        s += f", backend={self.backend!r}" if self.backend != "auto" else ""
        if self.checkpoint_chunk_size is not None:
            s += f", checkpoint_chunk_size={self.checkpoint_chunk_size!r}"
        options = {name: getattr(self, name) for name in (*cell_options.TORCH_DEFAULTS, "forget_bias", "recurrent_init")}
        defaults = {**cell_options.TORCH_DEFAULTS, "forget_bias": None, "recurrent_init": "uniform"}
        s += "".join(f", {k}={v!r}" for k, v in options.items() if v != defaults[k])
        return s


@torch.compiler.disable
def _forward_outside_graph(layer: FusedRNNBase, input, hx):
    """The layer's forward, run eagerly inside a compiled model or an exported program: one
    clean graph break around it, the rest compiled (torch.export sees torch.nn's op, see
    dispatch.resolve_backend). Dynamo cannot trace the batch sizes of a PackedSequence, the
    kernel build's hashing or the pybind kernels. Eager calls skip this wrapper."""
    return layer._forward(input, hx)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return type(value).__name__
