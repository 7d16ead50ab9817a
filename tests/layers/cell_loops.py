"""Ground truth for the cell options of FusedLSTM / FusedGRU: plain PyTorch loops.

Written from the equations of the cell-options specification (layer norm, Ba, Kiros & Hinton
2016; zoneout, Krueger et al. 2016; recurrent dropout, Gal & Ghahramani 2016; weight drop,
Merity et al. 2017), one nn.functional op at a time per step, autograd for the gradients. A
loop runs a whole stack (layers, directions, padded or packed input, given or zero initial
states) from a layer's parameters, read by name, and from the masks a forward of the layer
drew: :func:`record_masks` wraps ``lightning_rnn.kernels.masks.draw`` and keeps them in order;
:func:`split_masks` names each one by (kind, layer, direction) in the specification's order.

Inside the loop the batch is time-major and in length-sorted order (a padded input: the
caller's order; a PackedSequence: its ``sorted_indices`` order), the order of the masks'
rows; per-token masks are kept as the packed rows (N, width) and laid out as (T, B, width).
"""
from __future__ import annotations

import dataclasses
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence

LN_EPS = 1e-5  # the specification's LN: torch.nn.functional.layer_norm with eps=1e-5


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """What the loop computes: the stack's shape and every option (off at 0 / False)."""

    cell: str  # "lstm" or "gru"
    num_layers: int
    num_directions: int
    hidden_size: int
    proj_size: int = 0
    training: bool = False
    layer_norm: bool = False
    zoneout_c: float = 0.0  # LSTM only
    zoneout_h: float = 0.0  # the GRU's zoneout p
    recurrent_dropout: float = 0.0
    weight_drop: float = 0.0
    dropout: float = 0.0  # between stacked layers
    dropout_mode: str = "standard"

    @property
    def gates(self) -> int:
        return 4 if self.cell == "lstm" else 3

    @property
    def output_size(self) -> int:
        return self.proj_size or self.hidden_size

    @classmethod
    def of(cls, layer) -> LoopConfig:
        """The configuration of a fused layer (or a torch.nn.LSTM / GRU: every option off)."""
        zoneout = getattr(layer, "zoneout", 0.0)
        p_c, p_h = zoneout if isinstance(zoneout, (tuple, list)) else (zoneout, zoneout)
        cell = layer.mode.lower()
        return cls(cell, layer.num_layers, 2 if layer.bidirectional else 1, layer.hidden_size,
                   getattr(layer, "proj_size", 0), layer.training, getattr(layer, "layer_norm", False),
                   p_c if cell == "lstm" else 0.0, p_h, getattr(layer, "recurrent_dropout", 0.0),
                   getattr(layer, "weight_drop", 0.0), layer.dropout, getattr(layer, "dropout_mode", "standard"))


# ----- masks ------------------------------------------------------------------------------
@dataclasses.dataclass
class MaskRecording:
    """What one or more forwards drew: ``draws`` as (kind, shape, p, mask) in call order;
    ``standard``, the per-element keep masks of standard between-layer dropout."""

    draws: list = dataclasses.field(default_factory=list)
    standard: list = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        self.draws.clear()
        self.standard.clear()


def record_masks(monkeypatch) -> MaskRecording:
    """Wraps ``masks.draw`` (and standard dropout's ``dropout_keep`` wherever a kernels module
    bound it) to call the original and keep a copy of each mask."""
    from lightning_rnn.kernels import masks

    recording = MaskRecording()
    draw = masks.draw

    def recording_draw(kind, shape, p, device):
        mask = draw(kind, shape, p, device)
        recording.draws.append((kind, tuple(shape), p, mask.clone()))
        return mask

    monkeypatch.setattr(masks, "draw", recording_draw)
    keep = getattr(masks, "dropout_keep", None)
    if keep is not None:
        def recording_keep(*args, **kwargs):
            mask = keep(*args, **kwargs)
            recording.standard.append(mask.clone())
            return mask

        for module in [m for name, m in sys.modules.items() if name.startswith("lightning_rnn.kernels")]:
            if getattr(module, "dropout_keep", None) is keep:
                monkeypatch.setattr(module, "dropout_keep", recording_keep)
    return recording


def expected_draws(cfg: LoopConfig, batch: int, tokens: int) -> list[tuple[str, tuple, float, tuple]]:
    """(kind, shape, p, key) of every draw of one training forward, in the specification's
    order; key names the mask for the loop: (kind, layer, direction) or ("dropout", layer)."""
    if not cfg.training:
        return []
    G, H, P, D = cfg.gates, cfg.hidden_size, cfg.output_size, cfg.num_directions
    draws = []
    for k in range(cfg.num_layers):
        for d in range(D):
            if cfg.weight_drop:
                draws.append(("weight_drop", (G * H, P), 1 - cfg.weight_drop, ("weight_drop", k, d)))
            if cfg.recurrent_dropout:
                draws.append(("recurrent_dropout", (batch, P), 1 - cfg.recurrent_dropout, ("recurrent_dropout", k, d)))
            if cfg.zoneout_c:
                draws.append(("zoneout_c", (tokens, H), cfg.zoneout_c, ("zoneout_c", k, d)))
            if cfg.zoneout_h:
                draws.append(("zoneout_h", (tokens, P), cfg.zoneout_h, ("zoneout_h", k, d)))
    if cfg.dropout and cfg.dropout_mode == "variational":
        draws += [("dropout", (batch, D * P), 1 - cfg.dropout, ("dropout", k)) for k in range(cfg.num_layers - 1)]
    return draws


def split_masks(recording: MaskRecording, cfg: LoopConfig, batch: int, tokens: int) -> dict:
    """The recorded masks of one forward by key (see :func:`expected_draws`); standard
    between-layer dropout's under ("dropout", layer) as (tokens, D*P) rows. Fails unless the
    recording has exactly the expected kinds, shapes, probabilities and bool masks, in order."""
    expected = expected_draws(cfg, batch, tokens)
    got = [(kind, shape, p) for kind, shape, p, _ in recording.draws]
    assert len(got) == len(expected), f"draws: expected {[e[:3] for e in expected]}, got {got}"
    named = {}
    for (kind, shape, p, mask), (e_kind, e_shape, e_p, key) in zip(recording.draws, expected):
        assert (kind, shape) == (e_kind, e_shape) and math.isclose(p, e_p), \
            f"draws: expected {[e[:3] for e in expected]}, got {got}"
        assert mask.dtype == torch.bool and tuple(mask.shape) == e_shape, f"{kind}: {mask.dtype} {tuple(mask.shape)}"
        named[key] = mask
    if cfg.training and cfg.dropout and cfg.dropout_mode == "standard" and cfg.num_layers > 1:
        assert len(recording.standard) == cfg.num_layers - 1, f"standard dropout masks: {len(recording.standard)}"
        for k, mask in enumerate(recording.standard):
            named[("dropout", k)] = mask.reshape(tokens, -1)
    return named


# ----- layout helpers ---------------------------------------------------------------------
def rows_to_steps(rows: torch.Tensor, batch_sizes: list[int]) -> torch.Tensor:
    """Packed time-major rows (N, ...) as (T, B, ...), zeros past each sequence's end."""
    out = rows.new_zeros(len(batch_sizes), batch_sizes[0], *rows.shape[1:])
    start = 0
    for t, size in enumerate(batch_sizes):
        out[t, :size] = rows[start:start + size]
        start += size
    return out


def steps_to_rows(steps: torch.Tensor, batch_sizes: list[int]) -> torch.Tensor:
    """(T, B, ...) back to the packed rows (N, ...)."""
    return torch.cat([steps[t, :size] for t, size in enumerate(batch_sizes)])


def reverse_each(steps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each sequence's first ``lengths[b]`` steps of (T, B, ...) in reverse order (the rest kept)."""
    T, B = steps.shape[:2]
    t = torch.arange(T)[:, None].expand(T, B)
    index = torch.where(t < lengths[None], lengths[None] - 1 - t, t)
    return steps[index, torch.arange(B)[None].expand(T, B)]


# ----- the cells --------------------------------------------------------------------------
def _norm(a, params, which, sfx):
    """LN over the last dimension with the layer's gain and bias ``layernorm_{which}_*{sfx}``."""
    return F.layer_norm(a, a.shape[-1:], params[f"layernorm_{which}_weight{sfx}"],
                        params.get(f"layernorm_{which}_bias{sfx}"), eps=LN_EPS)


def _direction(cfg, params, sfx, x, lengths, state, masks):
    """One layer-direction over x (T, B, In) in its processing order; state: (h_0[, c_0]),
    masks: this direction's (recurrent dropout (B, P) or per step (T, B, P); zoneout (T, B, .)
    in processing order). Returns the outputs (T, B, P), zero past each end, and the final state."""
    train = cfg.training
    w_ih, w_hh = params[f"weight_ih{sfx}"], params[f"weight_hh{sfx}"]
    b_ih, b_hh = params.get(f"bias_ih{sfx}"), params.get(f"bias_hh{sfx}")
    if train and cfg.weight_drop:  # DropConnect: one mask per forward, gradient to the raw weight
        w_hh = w_hh * masks["weight_drop"].to(w_hh.dtype) / (1 - cfg.weight_drop)
    h, c = state[0], (state[1] if cfg.cell == "lstm" else None)
    outputs = []
    for t in range(x.shape[0]):
        active = (lengths > t)[:, None]  # (B, 1): rows whose sequence has a token at step t
        hbar = h
        if train and cfg.recurrent_dropout:
            m_r = masks["recurrent_dropout"]
            m_r = m_r[t] if m_r.dim() == 3 else m_r
            hbar = h * m_r.to(h.dtype) / (1 - cfg.recurrent_dropout)
        a_x, a_h = F.linear(x[t], w_ih), F.linear(hbar, w_hh)  # (B, G*H) each
        if cfg.layer_norm:
            a_x, a_h = _norm(a_x, params, "ih", sfx), _norm(a_h, params, "hh", sfx)
        if cfg.cell == "lstm":
            pre = a_x + a_h
            if b_ih is not None:
                pre = pre + b_ih + b_hh
            i, f, g, o = pre.chunk(4, dim=1)
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c_new = f * c + i * g
            h_new = o * torch.tanh(_norm(c_new, params, "c", sfx) if cfg.layer_norm else c_new)
            if cfg.proj_size:
                h_new = F.linear(h_new, params[f"weight_hr{sfx}"])
            if cfg.zoneout_c:
                d = masks["zoneout_c"][t].to(c.dtype) if train else cfg.zoneout_c
                c_new = d * c + (1 - d) * c_new
        else:
            if b_ih is not None:
                a_x, a_h = a_x + b_ih, a_h + b_hh
            x_r, x_z, x_n = a_x.chunk(3, dim=1)
            h_r, h_z, h_n = a_h.chunk(3, dim=1)
            r, z = torch.sigmoid(x_r + h_r), torch.sigmoid(x_z + h_z)
            n = torch.tanh(x_n + r * h_n)
            h_new = (1 - z) * n + z * h  # the true h_{t-1}, not hbar
        if cfg.zoneout_h:
            d = masks["zoneout_h"][t].to(h.dtype) if train else cfg.zoneout_h
            h_new = d * h + (1 - d) * h_new
        h = torch.where(active, h_new, h)
        if c is not None:
            c = torch.where(active, c_new, c)
        outputs.append(torch.where(active, h_new, torch.zeros_like(h_new)))
    return torch.stack(outputs), (h, c) if c is not None else (h,)


def run_stack(params: dict, cfg: LoopConfig, inp, hx=None, masks: dict | None = None):
    """The whole stack over ``inp`` ((T, B, I) time-major, or a PackedSequence).

    params: tensors by torch.nn's names (and the ``layernorm_*`` ones); hx: h_0 (L*D, B, P)
    (and c_0 (L*D, B, H)) in the caller's order, or None for zeros; masks: by key, see
    :func:`split_masks` (training with a drawing option only; an entry of a key may be
    replaced, e.g. recurrent dropout's by a per-step (T, B, P) mask). Returns
    ``(output, states)`` as torch.nn does: output (T, B, D*P) or a PackedSequence, states
    a tuple (h_n[, c_n]) in the caller's order.
    """
    masks = masks or {}
    packed = isinstance(inp, PackedSequence)
    if packed:
        batch_sizes = inp.batch_sizes.tolist()
        x = rows_to_steps(inp.data, batch_sizes)
    else:
        x = inp
        batch_sizes = [x.shape[1]] * x.shape[0]
    T, B = x.shape[:2]
    lengths = (torch.tensor(batch_sizes)[:, None] > torch.arange(B)[None]).sum(0)  # (B,) sorted order
    L, D, P, H = cfg.num_layers, cfg.num_directions, cfg.output_size, cfg.hidden_size
    widths = (P, H) if cfg.cell == "lstm" else (P,)
    if hx is None:
        hx = tuple(x.new_zeros(L * D, B, w) for w in widths)
    elif not isinstance(hx, tuple):
        hx = (hx,)
    if packed and inp.sorted_indices is not None:
        hx = tuple(s.index_select(1, inp.sorted_indices) for s in hx)

    def per_step(mask):  # per-token rows (N, w) -> (T, B, w)
        return rows_to_steps(mask, batch_sizes)

    finals = [[] for _ in widths]
    for k in range(L):
        outs = []
        for d in range(D):
            sfx = f"_l{k}" + ("_reverse" if d else "")
            own = {kind: masks[(kind, k, d)] for kind in ("weight_drop", "recurrent_dropout")
                   if (kind, k, d) in masks}
            own |= {kind: per_step(masks[(kind, k, d)]) for kind in ("zoneout_c", "zoneout_h")
                    if (kind, k, d) in masks}
            state = tuple(s[k * D + d] for s in hx)
            if d:
                x_d = reverse_each(x, lengths)
                own |= {kind: reverse_each(m, lengths) for kind, m in own.items() if kind.startswith("zoneout")}
                if "recurrent_dropout" in own and own["recurrent_dropout"].dim() == 3:
                    own["recurrent_dropout"] = reverse_each(own["recurrent_dropout"], lengths)
            else:
                x_d = x
            out, final = _direction(cfg, params, sfx, x_d, lengths, state, own)
            outs.append(reverse_each(out, lengths) if d else out)
            for j, s in enumerate(final):
                finals[j].append(s)
        x = torch.cat(outs, dim=2)  # (T, B, D*P)
        if cfg.training and cfg.dropout and k < L - 1:
            keep = masks[("dropout", k)]
            keep = keep[None] if cfg.dropout_mode == "variational" else per_step(keep)
            x = x * keep.to(x.dtype) / (1 - cfg.dropout)
    states = tuple(torch.stack(f) for f in finals)
    if packed:
        if inp.unsorted_indices is not None:
            states = tuple(s.index_select(1, inp.unsorted_indices) for s in states)
        return PackedSequence(steps_to_rows(x, batch_sizes), inp.batch_sizes, inp.sorted_indices,
                              inp.unsorted_indices), states
    return x, states


class LoopLayer:
    """The loop with a layer's parameters, options and train/eval mode, called as the layer is
    (``(output, h_n)`` for a GRU, ``(output, (h_n, c_n))`` for an LSTM; ``parameters()`` is
    the layer's, so its gradients line up with the layer's)."""

    def __init__(self, layer, masks: dict | None = None, cfg: LoopConfig | None = None, params: dict | None = None):
        self.layer, self.masks = layer, masks
        self.cfg = cfg or LoopConfig.of(layer)
        self.params = params if params is not None else dict(layer.named_parameters())

    def parameters(self):
        return self.layer.parameters()

    def __call__(self, inp, hx=None):
        batch_first = self.layer.batch_first and not isinstance(inp, PackedSequence)
        out, states = run_stack(self.params, self.cfg, inp.transpose(0, 1) if batch_first else inp, hx, self.masks)
        out = out.transpose(0, 1) if batch_first else out
        return out, (states if self.cfg.cell == "lstm" else states[0])
