"""The driver shared by FusedLSTM and FusedGRU: layers x directions x packing x state.

A cell type is described by a :class:`CellSpec` (gate count, how many state tensors,
the torch.nn class it replaces). Everything else — parameters under torch.nn's names
and shapes, input normalization, initial states, inter-layer dropout, bidirectional
concatenation, backend dispatch — lives here once.

Weight layout: each ``weight_ih_l{k}`` is ``(G*H, I)`` row-major with the gates fused
in one matrix, exactly torch.nn's layout. That is the layout the kernels read
contiguously: the input projection ``x @ W_ih^T`` and the recurrent ``h @ W_hh^T``
are NT GEMMs that walk each weight row in memory order, so no per-forward repacking
is needed and a torch.nn state dict loads as is.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..kernels import dispatch, precision
from ..kernels.precision import compute_input
from ..utils.checks import check_flag, check_int
from . import checkpointing
from .sequence import InputMismatchError, SequenceBatch


@dataclass(frozen=True)
class CellSpec:
    name: str  # kernel function name: "lstm" or "gru"
    num_gates: int
    num_states: int  # 2 for (h, c), 1 for h
    torch_class: type
    projects: bool = False  # accepts proj_size > 0 (torch.nn: LSTM only)


_CONFIG_KEYS = (
    "input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional", "proj_size"
)


class FusedRNNBase(nn.Module):
    """Multi-layer, optionally bidirectional recurrent layer running fused kernels."""

    cell: ClassVar[CellSpec]

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
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.input_size = check_int("input_size", input_size, 1)
        self.hidden_size = check_int("hidden_size", hidden_size, 1)
        self.num_layers = check_int("num_layers", num_layers, 1)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout <= 1:
            raise ValueError(f"dropout: expected a float in [0, 1], got {dropout!r}")
        self.dropout = float(dropout)
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
        # call); a plain attribute so callbacks can switch it. See layers/checkpointing.py.
        self.checkpoint_chunk_size = checkpointing.check_chunk_size(checkpoint_chunk_size)
        factory = {"device": device, "dtype": dtype}
        G, H, P = self.cell.num_gates, hidden_size, self.output_size
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else P * self.num_directions
            for direction in range(self.num_directions):
                sfx = self._suffix(layer, direction)
                self.register_parameter(f"weight_ih{sfx}", nn.Parameter(torch.empty(G * H, layer_input, **factory)))
                self.register_parameter(f"weight_hh{sfx}", nn.Parameter(torch.empty(G * H, P, **factory)))
                if self.bias:
                    self.register_parameter(f"bias_ih{sfx}", nn.Parameter(torch.empty(G * H, **factory)))
                    self.register_parameter(f"bias_hh{sfx}", nn.Parameter(torch.empty(G * H, **factory)))
                if self.proj_size:
                    self.register_parameter(f"weight_hr{sfx}", nn.Parameter(torch.empty(P, H, **factory)))
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
        """torch.nn's initialization: U(-1/sqrt(H), 1/sqrt(H)) for every parameter."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def layer_weights(self, layer: int, direction: int) -> tuple:
        """(w_ih, w_hh, b_ih, b_hh, w_hr) of one layer-direction, torch.nn's order; biases are
        None without bias, w_hr (the projection) None without proj_size."""
        sfx = self._suffix(layer, direction)
        b_ih, b_hh = (getattr(self, f"bias_ih{sfx}"), getattr(self, f"bias_hh{sfx}")) if self.bias else (None, None)
        w_hr = getattr(self, f"weight_hr{sfx}") if self.proj_size else None
        return getattr(self, f"weight_ih{sfx}"), getattr(self, f"weight_hh{sfx}"), b_ih, b_hh, w_hr

    def flat_weights(self) -> list[torch.Tensor]:
        """All weights in torch.nn's ``_flat_weights`` order."""
        return [
            w
            for layer in range(self.num_layers)
            for d in range(self.num_directions)
            for w in self.layer_weights(layer, d)
            if w is not None
        ]

    # torch.nn.RNNBase's attributes, for code written against it
    @property
    def mode(self) -> str:
        return self.cell.torch_class.__name__  # "LSTM" or "GRU"

    @property
    def _flat_weights_names(self) -> list[str]:
        return [name for names in self._all_weights for name in names]

    @property
    def _flat_weights(self) -> list[torch.Tensor]:
        return self.flat_weights()

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

    def flatten_parameters(self) -> None:
        """Kept for drop-in compatibility with torch.nn: our weights are always in kernel layout."""

    # ----- conversion ---------------------------------------------------------------
    def _config(self) -> dict:
        """Constructor arguments shared with torch.nn (proj_size only where the cell has it:
        torch.nn.GRU refuses even proj_size=0)."""
        return {k: getattr(self, k) for k in _CONFIG_KEYS if k != "proj_size" or self.cell.projects}

    @classmethod
    def from_torch(cls, module: nn.Module, *, backend: str = "auto") -> "FusedRNNBase":
        """A fused copy of a ``torch.nn.LSTM``/``GRU``: same weights, dtype, device, train/eval
        mode and frozen parameters."""
        torch_class = cls.cell.torch_class
        if not isinstance(module, torch_class):
            raise TypeError(f"module: expected a torch.nn.{torch_class.__name__}, got {type(module).__name__}")
        ref = module.weight_ih_l0
        config = {k: getattr(module, k) for k in _CONFIG_KEYS}
        fused = cls(**config, backend=backend, device=ref.device, dtype=ref.dtype)
        return _copy_module_state(module, fused)

    def to_torch(self) -> nn.Module:
        """A ``torch.nn.LSTM``/``GRU`` copy of this layer: same weights, dtype, device,
        train/eval mode and frozen parameters."""
        ref = self.weight_ih_l0
        module = self.cell.torch_class(**self._config(), device=ref.device, dtype=ref.dtype)
        return _copy_module_state(self, module)

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
        weights = self._checked_weights()
        if type(input) is torch.Tensor:
            result = self._forward_plain(input, hx, weights)
            if result is not None:
                return result
        batch = SequenceBatch.from_input(input, self.batch_first, self.input_size)
        self._check_input_matches_weights(batch.source)
        states = [batch.sort_state(s) for s in self._initial_states(hx, batch)]
        # An empty batch (B = 0) gives torch.nn's empty outputs; the kernels need rows.
        backend = "torch" if batch.batch == 0 else dispatch.resolve(self.backend, batch.source.device)
        if backend == "torch":
            if self.checkpoint_chunk_size is not None and self.backend == "torch":
                warnings.warn(
                    "checkpoint_chunk_size is ignored with backend='torch' (torch.nn keeps its own activations)",
                    RuntimeWarning,
                )
            out, final = self._run_torch(batch, states, weights)
        else:
            out, final = self._run_kernels(dispatch.kernels(backend), batch, states, weights)
        final = [batch.unsort_state(s) for s in final]
        return batch.restore(out), (tuple(final) if self.cell.num_states > 1 else final[0])

    def _forward_plain(self, x: torch.Tensor, hx, weights: list[tuple]):
        """The common call in few Python steps, or None where it is not one: a padded,
        time-major float32 / float64 batch, no initial states or tensors of exactly their
        shapes, all in one dtype on one device with the weights, no autocast, a compiled
        backend, no checkpointing, no inter-layer dropout (``weights`` as
        :meth:`_checked_weights` gives them). The extension then takes the batch and the
        states as they are (csrc/rnn_autograd.h: padded_stack_apply) and runs the stack
        as the general path does, bit for bit. The general path's normalization, checks
        and dispatch cost about 0.2 ms of a 2 ms forward at hidden 64 with the caches a
        backward leaves (each Python step and each ATen call made from Python a few
        microseconds, cold), this one about half of that; every other call, and every bad
        input with its error, goes the general way."""
        if x.dim() != 3 or self.batch_first or self.checkpoint_chunk_size is not None:
            return None
        device = x.device
        backend = dispatch.resolve(self.backend, device)  # "torch" while a graph is captured
        padded = backend != "torch" and getattr(dispatch.kernels(backend), "padded", None)
        if not padded or (self.dropout and self.training and self.num_layers > 1):
            return None
        T, B, I = x.shape
        w = weights[0][0]
        if not (T and B and I == self.input_size and x.dtype in _PLAIN_DTYPES and x.dtype == w.dtype):
            return None
        if device != w.device or torch.is_autocast_enabled(device.type):
            return None
        h0 = c0 = None
        if hx is not None:
            lstm = self.cell.num_states == 2
            if lstm and not (type(hx) is tuple and len(hx) == 2):
                return None
            h0, c0 = hx if lstm else (hx, None)
            LD = self.num_layers * self.num_directions
            if not (_plain_state(h0, x, (LD, B, self.output_size))
                    and (not lstm or _plain_state(c0, x, (LD, B, self.hidden_size)))):
                return None
        result = padded(self.cell.name, x, h0, c0, weights, self.num_layers, self.num_directions)
        if result is None:
            return None
        out, final = result
        return out, (tuple(final) if self.cell.num_states > 1 else final[0])

    def _run_kernels(self, kernels, batch: SequenceBatch, states: list[torch.Tensor], weights: list[tuple]):
        """weights: per layer-direction, as layer_weights gives them (see _checked_weights)."""
        run_cell = getattr(kernels, self.cell.name)
        chunk = None if self.checkpoint_chunk_size is None else self._checkpoint_chunk_length(batch, states)
        D = self.num_directions
        if chunk is not None and D == 1:
            return self._run_stack_in_chunks(kernels, batch, states, weights, chunk)
        stack = getattr(kernels, "stack", None)  # the compiled backends: the stack in one call
        if chunk is None and stack is not None and not any(map(self._dropout_active, range(self.num_layers))):
            result = stack(self.cell.name, batch.data, batch.batch_sizes, states, weights, self.num_layers, D)
            if result is not None:
                return result
        x, batch_sizes = batch.data, batch.batch_sizes
        finals = []  # each layer-direction's final states
        for layer in range(self.num_layers):
            outs = []
            for d in range(D):
                k = layer * D + d
                init = [s[k] for s in states]
                if d == 0:  # in the dtype the kernels compute in: under autocast one low-precision
                    x = compute_input(x, weights[k][0])  # copy for both directions, and what chunks save
                if chunk is None:
                    out, *final = _call_cell(run_cell, x, batch_sizes, init, weights[k], d == 1)
                else:  # bidirectional: each layer-direction is chunked on its own
                    span = partial(self._run_span, run_cell, d == 1)
                    out, final = checkpointing.run_chunked(
                        span, x, batch_sizes, init, weights[k], [], chunk, d == 1, _weight_packs(kernels)
                    )
                outs.append(out)
                finals.append(final)
            x = outs[0] if D == 1 else precision.cat(outs, dim=1)  # (N, D*P)
            if self._dropout_active(layer):
                x = _dropout(x, _dropout_keep(x.shape, x.dtype, x.device, self.dropout), self.dropout)
        return x, [_stack(f) for f in zip(*finals)]

    # ----- gradient checkpointing ---------------------------------------------------
    def _checkpoint_chunk_length(self, batch: SequenceBatch, states: list[torch.Tensor]) -> int | None:
        """Steps per checkpointed chunk, or None when off or when no gradient is needed."""
        chunk = checkpointing.chunk_length(self.checkpoint_chunk_size, batch.num_steps)
        if chunk is None or not torch.is_grad_enabled():
            return None
        tensors = [batch.data, *states, *self.parameters()]
        return chunk if any(t.requires_grad for t in tensors) else None

    def _run_stack_in_chunks(
        self, kernels, batch: SequenceBatch, states: list[torch.Tensor], weights: list[tuple], chunk: int
    ):
        """A unidirectional stack with ALL layers inside each chunk of steps.

        Only the network input, the dropout masks (bool) and every layer's states at chunk
        boundaries are saved; layer outputs are recomputed too. The masks are drawn up front,
        in the order the plain path draws them, so results match it exactly.
        """
        L, S = self.num_layers, self.cell.num_states
        init = [s[layer] for layer in range(L) for s in states]
        weights = [w for layer_weights in weights for w in layer_weights]
        # saved by the chunks in the dtype the kernels compute in (low precision under autocast)
        x = compute_input(batch.data, weights[0])
        out_dtype = x.dtype  # what the layers output
        shape = (x.shape[0], self.output_size)  # (N, P)
        active = [k for k in range(L - 1) if self._dropout_active(k)]
        masks = [_dropout_keep(shape, out_dtype, x.device, self.dropout) for _ in active]
        span = partial(self._run_span, getattr(kernels, self.cell.name), False)
        out, final = checkpointing.run_chunked(
            span, x, batch.batch_sizes, init, weights, masks, chunk, False, _weight_packs(kernels)
        )
        return out, [_stack(final[s::S]) for s in range(S)]

    def _run_span(self, run_cell, reverse: bool, x, batch_sizes, masks, states, weights) -> tuple:
        """Consecutive layers of one direction over a range of steps: ``(out, *final_states)``.

        states: ``num_states`` tensors per layer ((b, P) h, (b, H) c); weights: 5 per layer (as
        layer_weights); masks: the dropout keep-masks between the layers (empty when dropout is off).
        """
        S, W, finals = self.cell.num_states, _WEIGHTS_PER_LAYER, []
        for k in range(len(weights) // W):
            if k and masks:
                x = _dropout(x, masks[k - 1], self.dropout)
            layer_states, layer_weights = states[k * S : (k + 1) * S], weights[W * k : W * (k + 1)]
            x, *final = _call_cell(run_cell, x, batch_sizes, layer_states, layer_weights, reverse)
            finals.extend(final)
        return (x, *finals)

    def _dropout_active(self, layer: int) -> bool:
        """Inter-layer dropout after ``layer``: outputs of all layers but the last, training only."""
        return bool(self.dropout) and self.training and layer < self.num_layers - 1

    def _run_torch(self, batch: SequenceBatch, states: list[torch.Tensor], weights: list[tuple]):
        fn = getattr(torch._VF, self.cell.name)
        hx = tuple(states) if self.cell.num_states > 1 else states[0]
        flat_weights = [w for layer_weights in weights for w in layer_weights if w is not None]  # as flat_weights()
        args = (flat_weights, self.bias, self.num_layers, self.dropout, self.training, self.bidirectional)
        if batch.is_full:  # (T, B, F) out, as restore() takes it
            out, *final = fn(batch.source, hx, *args, False)
        else:
            out, *final = fn(batch.data, batch.batch_sizes, hx, *args)
        return out, final

    # ----- validation ---------------------------------------------------------------
    def _checked_weights(self) -> list[tuple]:
        """Every layer-direction's weights as :meth:`layer_weights` gives them, read once per
        forward (a parametrized weight is evaluated once), and checked: every weight a
        tensor in torch.nn's shape, so that a replaced weight of another shape (a parameter,
        a parametrization's result or a plain tensor) is named here, not in a kernel; the
        parameters in one dtype and on one device (a parametrization may give a layer
        another dtype: the per-layer path converts between layers)."""
        params, reference, layers = self._parameters, None, []
        for layout in self._weight_layout():
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

    def _weight_layout(self) -> list[tuple]:
        """Per layer-direction, layer_weights' five entries as (name, torch.nn's shape), None
        where the configuration has no such weight; computed once per configuration."""
        config = (self.input_size, self.hidden_size, self.num_layers, self.bias, self.bidirectional, self.proj_size)
        if getattr(self, "_weight_layout_for", None) != config:
            G, H, P, D = self.cell.num_gates, self.hidden_size, self.output_size, self.num_directions
            layout = []
            for layer in range(self.num_layers):
                inputs = self.input_size if layer == 0 else P * D
                shapes = {"weight_ih": (G * H, inputs), "weight_hh": (G * H, P)}
                if self.bias:
                    shapes.update(bias_ih=(G * H,), bias_hh=(G * H,))
                if self.proj_size:
                    shapes["weight_hr"] = (P, H)
                for d in range(D):
                    sfx = self._suffix(layer, d)
                    layout.append(tuple(
                        (kind + sfx, torch.Size(shapes[kind])) if kind in shapes else None for kind in _WEIGHT_KINDS
                    ))
            self._weight_layout_for, self._weight_layout_cache = config, layout
        return self._weight_layout_cache

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

    def _initial_states(self, hx, batch: SequenceBatch) -> list[torch.Tensor]:
        """The initial states as (L*D, B, P) h_0 and (L*D, B, H) c_0 tensors, zeros where hx is None."""
        L, B = self.num_layers * self.num_directions, batch.batch
        widths = (self.output_size, self.hidden_size)[: self.cell.num_states]  # h_0, c_0
        shapes = [(L, w) if batch.unbatched else (L, B, w) for w in widths]
        if hx is None:  # one zeros tensor per width: h_0 and c_0 share it without a projection
            zeros = {w: batch.source.new_zeros(L, B, w) for w in set(widths)}
            return [zeros[w] for w in widths]
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
        states, x = [], batch.source
        for label, s, expected in zip(("h_0", "c_0"), hx, shapes):
            if not isinstance(s, torch.Tensor):
                raise TypeError(f"hx: {label} must be a tensor, got {_describe(s)}")
            if s.shape != expected:
                raise InputMismatchError(f"hx: expected {label} of shape {expected}, got {tuple(s.shape)}")
            if s.device != x.device:
                raise InputMismatchError(f"hx: expected {label} on {x.device}, got {s.device}")
            if s.dtype != x.dtype and not torch.is_autocast_enabled(s.device.type):
                raise InputMismatchError(f"hx: expected {label} of dtype {x.dtype} like the input, got {s.dtype}")
            states.append(s.unsqueeze(1) if batch.unbatched else s)
        return states

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        # torch.nn's order: proj_size first
        defaults = dict(proj_size=0, num_layers=1, bias=True, batch_first=False, dropout=0.0, bidirectional=False)
        config = self._config()
        s += "".join(f", {k}={config[k]}" for k, v in defaults.items() if config.get(k, v) != v)  # GRU: no proj
        s += f", backend={self.backend!r}" if self.backend != "auto" else ""
        if self.checkpoint_chunk_size is not None:
            s += f", checkpoint_chunk_size={self.checkpoint_chunk_size!r}"
        return s


def _copy_module_state(source: nn.Module, target: nn.Module) -> nn.Module:
    """Weights, train/eval mode and which parameters are frozen, from ``source`` to ``target``."""
    target.load_state_dict(source.state_dict())
    frozen = {name for name, p in source.named_parameters() if not p.requires_grad}
    for name, p in target.named_parameters():
        p.requires_grad_(name not in frozen)
    return target.train(source.training)


_PLAIN_DTYPES = (torch.float32, torch.float64)  # what the compiled kernels compute in without autocast
_WEIGHT_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")  # layer_weights' order
_WEIGHTS_PER_LAYER = len(_WEIGHT_KINDS)


@torch.compiler.disable
def _forward_outside_graph(layer: FusedRNNBase, input, hx):
    """The layer's forward, run eagerly inside a compiled model or an exported program (one
    clean graph break around it, the rest compiled; torch.export sees torch.nn's op, see
    dispatch.resolve). Tracing into it only met code Dynamo cannot trace (the batch sizes
    of a PackedSequence, the kernel build's hashing, the pybind kernels) and printed a
    warning for each. Eager calls skip the wrapper: it costs a few microseconds per call."""
    return layer._forward(input, hx)


def _plain_state(state, x: torch.Tensor, shape: tuple) -> bool:
    """Whether an initial state can go to the layers' common call as it is: a tensor of
    ``shape`` in x's dtype on x's device (anything else takes the general path's checks)."""
    return type(state) is torch.Tensor and state.shape == shape and state.dtype == x.dtype and state.device == x.device


def _stack(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """(L*D, B, H) final states from the layer-directions' (B, H) ones; one is unsqueezed
    (a view of the kernel's own result, not a copy)."""
    return states[0].unsqueeze(0) if len(states) == 1 else precision.stack(states)


def _call_cell(run_cell, x, batch_sizes, states, weights, reverse: bool):
    """One layer-direction on a kernel backend: ``weights`` as layer_weights gives them, the
    projection passed only when there is one (the GRU's kernels take none)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = weights
    projection = () if w_hr is None else (w_hr,)
    return run_cell(x, batch_sizes, *states, w_ih, w_hh, b_ih, b_hh, reverse, *projection)


def _weight_packs(kernels):
    """The kernel backend's packed-weight store factory, for backends that have one."""
    return getattr(kernels, "weight_packs", None)


def _dropout_keep(shape, dtype: torch.dtype, device: torch.device, p: float) -> torch.Tensor:
    """Bool keep-mask, drawn as F.dropout draws its noise on CPU (the same RNG stream)."""
    return torch.empty(shape, dtype=dtype, device=device).bernoulli_(1 - p).bool()


def _dropout(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout with a given bool keep-mask: ``x * keep / (1 - p)`` (zeros at p = 1)."""
    return _MaskedDropout.apply(x, keep, 0.0 if p >= 1 else 1.0 / (1 - p))


class _MaskedDropout(torch.autograd.Function):
    """Dropout that saves its bool mask (1 byte per element; F.dropout on CPU saves a float mask)."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0.0)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None, None


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return type(value).__name__
