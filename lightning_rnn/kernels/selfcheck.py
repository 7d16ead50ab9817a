"""A compiled backend proves itself before it is trusted: a tiny parity check against the reference.

The first time a compiled backend (``cpp``, ``cuda``) is resolved for a device in a process
(:mod:`.dispatch`; per GPU index), :func:`verify` runs each entry point the backend declares on
the tiny cases of :func:`cases` (LSTM and GRU: one layer both ways, also without autograd; one
layer with every cell option; the ``stack`` and ``padded`` entries) and compares outputs, final
states and the gradient of every input with the ``reference`` backend in float64 on the CPU.

The backend computes in float64 where the device computes float64 at speed (CPUs, data-centre
GPUs), else in float32 against the same float64 ground truth with a float32 (or TF32)
tolerance. A failure names the case, the tensor and the error; :mod:`.dispatch` then falls
back (``backend="auto"``) or raises (a named backend). Each (backend, device) is checked once
per process, in a thread of its own, so the caller's grad mode, inference mode, autocast and
saved-tensor hooks neither change the check nor see it. ``LIGHTNING_RNN_SELFCHECK=0`` skips it.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from . import reference
from .backends import Backend, BackendUnavailable
from .cell import CellExtras

ENV = "LIGHTNING_RNN_SELFCHECK"

#: CUDA compute capabilities with full-rate float64 units (P100, V100, A100/A30, H100/H200,
#: B200); other GPUs run float64 at 1/32-1/64 of float32's rate and are checked in float32.
FAST_FLOAT64 = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}

#: Largest error (see :func:`_error`) accepted per compute dtype: a right kernel differs from
#: the float64 reference by its rounding, ~1e-15 in float64 and ~1e-6 in float32 on these
#: cases; TF32 GEMMs keep a 10-bit mantissa (~1e-3 per product: an estimate, not measured).
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
TF32_TOLERANCE = 2e-2

T, B, I, H, P = 4, 3, 4, 6, 4  # steps, sequences, input size, hidden size, the LSTM's projection
LENGTHS = (4, 3, 1)  # packed cases: sorted, the longest first
OPTION_P = dict(recurrent=0.25, zoneout=(0.2, 0.3), weight=0.3)


class SelfCheckFailed(BackendUnavailable):
    """A compiled backend's results differ from the reference backend's on this device."""


@dataclass(frozen=True)
class Case:
    cell: str  # "lstm" or "gru"
    entry: str  # the backend's entry point: "layer" (lstm/gru), "stack" or "padded"
    layers: int = 1
    directions: int = 1
    packed: bool = True  # variable lengths (LENGTHS); False: every sequence T steps
    states: bool = True  # given h0 (c0); False: zeros
    projection: bool = False  # LSTM only: h = W_hr (o * tanh(c)), P columns
    options: bool = False  # layer norm, zoneout, recurrent dropout, weight drop (training masks)
    reverse: bool = False  # one direction: the reversed one
    inference: bool = False  # the forward also under no_grad (no autograd node: the inference path)

    def __str__(self) -> str:
        parts = [f"{self.layers} layers" if self.layers > 1 else "",
                 "bidirectional" if self.directions == 2 else "", "reversed" if self.reverse else "",
                 "packed" if self.packed else "full lengths", "projected" if self.projection else "",
                 "cell options" if self.options else ""]
        return f"{self.cell} {self.entry} ({', '.join(p for p in parts if p)})"


def cases() -> list[Case]:
    """What the check runs, per cell."""
    out = []
    for cell in ("lstm", "gru"):
        proj = cell == "lstm"
        out += [Case(cell, "layer", directions=2, projection=proj, inference=True),
                Case(cell, "layer", projection=proj, options=True, reverse=True),
                Case(cell, "stack", layers=2, directions=2, projection=proj),
                Case(cell, "padded", layers=2, packed=False, states=False)]
    return out


@dataclass(frozen=True)
class Mismatch:
    case: Case
    tensor: str  # e.g. "grad of w_hh (layer 1, reverse)"; or the exception the call raised
    error: float | None  # None: the call raised
    tolerance: float

    def __str__(self) -> str:
        if self.error is None:
            return f"{self.case}: raised {self.tensor}"
        return f"{self.case}: {self.tensor} differs by {self.error:.1e} (tolerance {self.tolerance:.0e})"


@dataclass(frozen=True)
class Report:
    backend: str
    device: torch.device
    dtype: torch.dtype
    mismatches: tuple[Mismatch, ...]
    seconds: float  # the whole check's wall time
    worst: float = 0.0  # the largest error of any tensor compared (inf: a call raised, or NaN)

    def message(self, most: int = 3) -> str:
        shown = "; ".join(map(str, self.mismatches[:most]))
        more = len(self.mismatches) - most
        return (f"the {self.backend!r} backend failed its self-check on {self.device} ({str(self.dtype)[6:]} "
                f"against the 'reference' backend): {shown}" + (f"; and {more} more" if more > 0 else ""))


_reports: dict[tuple[str, str, int | None], Report] = {}
_lock = threading.Lock()


def enabled() -> bool:
    """Whether ``LIGHTNING_RNN_SELFCHECK`` lets the check run (unset, "" or "1"; "0" skips it)."""
    value = os.environ.get(ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV}: expected 1 (check each compiled backend once per device) or 0 (skip the "
                         f"check), got {value!r}")
    return value != "0"


def verify(backend: Backend, device: torch.device) -> None:
    """Runs the check for ``backend`` on ``device`` once per process (later calls look up the
    first one's report); raises :class:`SelfCheckFailed` naming the first mismatches."""
    if not enabled():
        return
    key = (backend.name, device.type, device.index)
    report = _reports.get(key)
    if report is None:
        with _lock:  # two threads resolving at once: one checks, the other waits for its report
            report = _reports.get(key)
            if report is None:
                report = _reports[key] = run_isolated(backend, device)
    if report.mismatches:
        raise SelfCheckFailed(report.message())


def reports() -> list[Report]:
    """The checks this process ran, in order."""
    return list(_reports.values())


def run_isolated(backend: Backend, device: torch.device, dtype: torch.dtype | None = None) -> Report:
    """:func:`run` in a thread of its own: grad mode, inference mode, autocast, saved-tensor
    hooks and the CUDA device and stream are per thread, so the caller's state is neither
    used by the check nor touched by it."""
    with ThreadPoolExecutor(1, thread_name_prefix="lightning_rnn-selfcheck") as worker:
        return worker.submit(run, backend, device, dtype).result()  # its exception, if any, raised here


def check_dtype(device: torch.device) -> torch.dtype:
    """float64, or float32 on a GPU without full-rate float64 units (see :data:`FAST_FLOAT64`)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) not in FAST_FLOAT64:
        return torch.float32
    return torch.float64


def tolerance(dtype: torch.dtype, device: torch.device) -> float:
    """The error accepted: :data:`TOLERANCE`, or :data:`TF32_TOLERANCE` for float32 on a GPU
    whose float32 matrix products may run in TF32 (``torch.backends.cuda.matmul.allow_tf32``)."""
    if dtype == torch.float32 and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


def run(backend: Backend, device: torch.device, dtype: torch.dtype | None = None) -> Report:
    """Every case of :func:`cases` the backend has an entry for, on ``device`` in ``dtype``
    (default :func:`check_dtype`), against the reference backend in float64 on the CPU."""
    device = torch.device(device)
    dtype = dtype or check_dtype(device)
    tol = tolerance(dtype, device)
    start, mismatches, worst = time.perf_counter(), [], 0.0
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for case in cases():
            if (case.entry == "stack" and backend.stack is None) or (case.entry == "padded" and (
                    backend.padded is None or dtype not in backend.padded_dtypes)):
                continue
            if case.options and not backend.cell_options:
                continue  # the layers run these calls on the reference backend
            found, case_worst = _compare(backend, case, device, dtype, tol)
            mismatches, worst = mismatches + found, max(worst, case_worst)
    return Report(backend.name, device, dtype, tuple(mismatches), time.perf_counter() - start, worst)


def _compare(backend: Backend, case: Case, device, dtype, tol: float) -> tuple[list[Mismatch], float]:
    """The case's outputs and gradients on ``backend`` against the reference's: the
    mismatches and the largest error."""
    inputs = _inputs(case, torch.Generator().manual_seed(0))
    want = _outputs_and_grads(reference.BACKEND, case, _leaves(inputs, "cpu", torch.float64, dtype), "layer")
    try:
        leaves = _leaves(inputs, device, dtype, dtype)
        got = _outputs_and_grads(backend, case, leaves, case.entry)
        if got is not None and case.inference:
            with torch.no_grad():
                got.update(_named_outputs(*_forward(backend, case, leaves, case.entry), " (no grad)"))
            want.update({f"{name} (no grad)": want[name] for name in ("out", "h_n", "c_n") if name in want})
    except Exception as err:  # noqa: BLE001 (a kernel that cannot run here fails the check)
        return [Mismatch(case, f"{type(err).__name__}: {(str(err) or '?').splitlines()[0]}", None, tol)], math.inf
    if got is None:  # the entry declined the call (see backends.py): nothing of it to check
        return [], 0.0
    errors = {name: _error(got[name], value) for name, value in want.items()}
    found = [Mismatch(case, name, error, tol) for name, error in errors.items() if not error <= tol]  # NaN too
    return found, max((math.inf if math.isnan(e) else e for e in errors.values()), default=0.0)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over max(1, max |want|): absolute for values within [-1, 1] (outputs,
    states), relative to the largest entry beyond (gradients)."""
    got, want = got.detach().to("cpu", torch.float64), want.detach()
    if got.shape != want.shape:
        return float("inf")
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def _inputs(case: Case, gen: torch.Generator) -> dict:
    """The case's values in float64 on the CPU: ``x``, ``batch_sizes``, ``states`` (a list, or
    None for zeros), ``weights`` (per layer-direction (w_ih, w_hh, b_ih, b_hh, w_hr)),
    ``extras`` (per layer-direction CellExtras, or None) and ``upstream`` (a gradient per output)."""
    lengths = LENGTHS if case.packed else (T,) * B
    batch_sizes = torch.tensor([sum(n > t for n in lengths) for t in range(T)], dtype=torch.int64)
    N, G, LD = int(batch_sizes.sum()), 4 if case.cell == "lstm" else 3, case.layers * case.directions
    Pc = P if case.projection else H

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    def mask(*shape, keep):
        return torch.rand(*shape, generator=gen) < keep

    weights, extras = [], []
    for k in range(LD):
        width = I if k < case.directions else case.directions * Pc
        weights.append((randn(G * H, width, scale=0.5), randn(G * H, Pc, scale=0.5), randn(G * H, scale=0.5),
                        randn(G * H, scale=0.5), randn(Pc, H, scale=0.5) if case.projection else None))
        if case.options:
            norm = tuple(randn(n, scale=0.3) + (1.0 if j % 2 == 0 else 0.0)  # weights ~1, biases ~0
                         for j, n in enumerate((G * H,) * 4 + ((H, H) if case.cell == "lstm" else ())))
            zoneout = OPTION_P["zoneout"] if case.cell == "lstm" else (0.0, OPTION_P["zoneout"][1])
            extras.append(CellExtras(
                norm=norm, recurrent_keep=mask(B, Pc, keep=1 - OPTION_P["recurrent"]),
                recurrent_p=OPTION_P["recurrent"], zoneout=zoneout,
                keep_c=mask(N, H, keep=zoneout[0]) if case.cell == "lstm" else None,
                keep_h=mask(N, Pc, keep=zoneout[1]), weight_keep=mask(G * H, Pc, keep=1 - OPTION_P["weight"]),
                weight_p=OPTION_P["weight"]))
    widths = (Pc, H)[: 2 if case.cell == "lstm" else 1]
    states = [randn(LD, B, w) for w in widths] if case.states else None
    out_width = case.directions * Pc
    upstream = [randn(N, out_width)] + [randn(LD, B, w) for w in widths]
    return dict(x=randn(N, I), batch_sizes=batch_sizes, states=states, weights=weights,
                extras=extras or None, upstream=upstream)


def _leaves(inputs: dict, device, dtype: torch.dtype, rounded: torch.dtype) -> dict:
    """``inputs`` on ``device`` in ``dtype``, their values rounded to ``rounded`` first (the
    reference sees exactly the numbers the backend does); float tensors require grad."""
    def leaf(t):
        if t is None or not t.is_floating_point():
            return t if t is None or t.device == torch.device(device) else t.to(device)
        return t.to(rounded).to(device, dtype).requires_grad_()

    extras = None
    if inputs["extras"] is not None:
        extras = [replace(e, norm=tuple(map(leaf, e.norm)), **{n: leaf(getattr(e, n)) for n in (
            "recurrent_keep", "keep_c", "keep_h", "weight_keep")}) for e in inputs["extras"]]
    return dict(x=leaf(inputs["x"]), batch_sizes=inputs["batch_sizes"],
                states=None if inputs["states"] is None else [leaf(s) for s in inputs["states"]],
                weights=[tuple(map(leaf, w)) for w in inputs["weights"]], extras=extras,
                upstream=[u.to(rounded).to(device, dtype) for u in inputs["upstream"]])


def _outputs_and_grads(backend: Backend, case: Case, t: dict, entry: str) -> dict[str, torch.Tensor] | None:
    """``{"out": ..., "h_n": ..., "grad of x": ...}`` of the case on ``backend`` through
    ``entry`` (the reference runs every case layer by layer), or None where it declined."""
    result = _forward(backend, case, t, entry)
    if result is None:
        return None
    out, finals = result
    found = _named_outputs(out, finals)
    named = _named_leaves(case, t)
    loss = sum((o * u).sum() for o, u in zip([out, *finals], t["upstream"]))
    grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
    for name, g, leaf in zip(named, grads, named.values()):
        found[f"grad of {name}"] = torch.zeros_like(leaf) if g is None else g
    return found


def _named_outputs(out, finals, suffix: str = "") -> dict[str, torch.Tensor]:
    return {f"{name}{suffix}": v for name, v in zip(("out", "h_n", "c_n"), [out, *(finals or ())])}


def _forward(backend: Backend, case: Case, t: dict, entry: str):
    """``(out (N, D*P), [h_n, c_n])`` through ``entry``, or None if it declined the call."""
    L, D, x, batch_sizes = case.layers, case.directions, t["x"], t["batch_sizes"]
    if entry == "stack":
        return backend.stack(case.cell, x, batch_sizes, t["states"], t["weights"], L, D)
    if entry == "padded":
        h0, c0 = (None, None) if t["states"] is None else (t["states"] + [None])[:2]
        result = backend.padded(case.cell, x.view(T, B, I), h0, c0, t["weights"], L, D)
        return None if result is None else (result[0].reshape(T * B, -1), result[1])
    return _layers(backend, case, t)


def _layers(backend: Backend, case: Case, t: dict):
    """Layer after layer through the per-layer entry (the reference's ground truth for every
    case), both directions of a layer on the same input."""
    x, batch_sizes, weights, extras = t["x"], t["batch_sizes"], t["weights"], t["extras"]
    states = t["states"]
    if states is None:
        Pc = P if case.projection else H
        widths = (Pc, H)[: 2 if case.cell == "lstm" else 1]
        states = [x.new_zeros(case.layers * case.directions, B, w) for w in widths]
    run_cell, finals = backend.cell(case.cell), []
    for layer in range(case.layers):
        outs = []
        for d in range(case.directions):
            k = layer * case.directions + d
            w_ih, w_hh, b_ih, b_hh, w_hr = weights[k]
            args = (x, batch_sizes, *[s[k] for s in states], w_ih, w_hh, b_ih, b_hh, d == 1 or case.reverse)
            args += () if w_hr is None else (w_hr,)
            kwargs = {} if extras is None else {"extras": extras[k]}
            out, *final = run_cell(*args, **kwargs)
            outs.append(out)
            finals.append(final)
        x = torch.cat(outs, 1)
    return x, [torch.stack(f) for f in zip(*finals)]


def _named_leaves(case: Case, t: dict) -> dict[str, torch.Tensor]:
    """The tensors the case's gradients are taken of, by name."""
    named = {"x": t["x"]}
    if t["states"] is not None:
        named.update(zip(("h0", "c0"), t["states"]))
    for k, w in enumerate(t["weights"]):
        where = _where(case, k)
        named.update({f"{n} ({where})": v for n, v in zip(("w_ih", "w_hh", "b_ih", "b_hh", "w_hr"), w)
                      if v is not None})
        if t["extras"] is not None:
            names = ("ln_ih weight", "ln_ih bias", "ln_hh weight", "ln_hh bias", "ln_c weight", "ln_c bias")
            named.update({f"{n} ({where})": v for n, v in zip(names, t["extras"][k].norm)})
    return named


def _where(case: Case, k: int) -> str:
    layer, d = divmod(k, case.directions)
    return f"layer {layer + 1}" + (", reverse" if d == 1 or case.reverse else "")

