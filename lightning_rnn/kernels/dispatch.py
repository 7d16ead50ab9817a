"""Choosing a backend for the fused layers.

A *kernel backend* is a module with two functions that run one direction of one
layer (signatures in :mod:`lightning_rnn.kernels.reference`)::

    lstm(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse) -> (out, h_n, c_n)
    gru(x, batch_sizes, h0, w_ih, w_hh, b_ih, b_hh, reverse)      -> (out, h_n)

``"reference"`` is always available. Compiled backends are loaded lazily by
:func:`load`; a backend that cannot be built raises :class:`BackendUnavailable`.
``"auto"`` takes the first backend of :data:`PREFERENCE` for the device that loads
(fastest first: the compiled kernel of the device, then ``reference``).
``"torch"`` is not a kernel backend: the layer hands the whole stack to torch.nn's
own implementation (the baseline, and an escape hatch).
"""
from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

KERNEL_BACKENDS = ("reference", "cpp", "cuda")
BACKENDS = ("auto", "torch") + KERNEL_BACKENDS

_MODULES = {
    "reference": "lightning_rnn.kernels.reference",
    "cpp": "lightning_rnn.kernels.cpp",
    "cuda": "lightning_rnn.kernels.cuda",
}
# Kernel backends per device type, fastest first; "reference" closes every list.
PREFERENCE = {"cpu": ("cpp", "reference"), "cuda": ("cuda", "reference")}
_warned: set[str] = set()
# (backend asked for, device type) -> the backend it resolved to, once that loaded: every
# forward asks (resolving anew took ~45 us of a 1x64 forward with the caches a backward
# leaves, ~18 us with this; resolve still checks the modes on every call).
_loaded: dict[tuple[str, str], str] = {}


class BackendUnavailable(RuntimeError):
    """A compiled backend cannot be used here (no compiler, no GPU, build error)."""


def check_backend_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


def load(name: str) -> ModuleType:
    """Import a kernel backend, building it if needed. Raises BackendUnavailable.

    Called on every forward: an imported backend is taken from ``sys.modules`` (what
    ``import_module`` would return, at a fraction of its cost per call)."""
    module = sys.modules.get(_MODULES[name]) or importlib.import_module(_MODULES[name])
    if name != "reference":
        module.load()  # builds (once) or raises BackendUnavailable
    return module


def _preference(device: torch.device) -> tuple[str, ...]:
    return PREFERENCE.get(torch.device(device).type, ("reference",))


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """Kernel backends that load here and run on ``device`` (fastest first).

    Builds compiled backends on first call; used to parametrize the parity tests.
    """
    names = []
    for name in _preference(device):
        try:
            load(name)
        except (BackendUnavailable, ModuleNotFoundError):
            continue
        names.append(name)
    return names


def _torch_func_active() -> bool:
    """Whether a torch.func transform (grad, vjp, jacrev, vmap, ...) is running."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active is not None and active())


def resolve(backend: str, device: torch.device) -> str:
    """The concrete backend for ``backend`` on ``device``.

    ``"auto"`` picks the fastest backend for the device that loads (see
    :data:`PREFERENCE`); when a faster one cannot be built it warns once (per backend
    and process) and moves on, ending at ``"reference"``. Named backends raise
    :class:`BackendUnavailable` instead of falling back. On the meta device (shape
    inference, deferred initialization), inside ``torch.func`` transforms and while a
    graph is captured for export (``torch.export``, ``torch.jit.trace``) every backend
    resolves to ``"torch"``.
    """
    check_backend_name(backend)
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    if device_type == "meta":
        return "torch"  # shapes only: torch.nn's implementation propagates meta tensors
    if _torch_func_active():
        return "torch"  # the kernels' autograd.Functions are not torch.func-transformable
    if _is_exporting() or torch.jit.is_tracing():
        return "torch"  # captured as aten.lstm / aten.gru, which exported programs can run
    loaded = _loaded.get((backend, device_type))
    if loaded is not None:
        return loaded
    if backend != "auto":
        if backend in KERNEL_BACKENDS:
            load(backend)
        _loaded[backend, device_type] = backend
        return backend
    for name in _preference(device):
        try:
            load(name)
            if name != "reference":  # a fallback tries the faster backends again next call
                _loaded[backend, device_type] = name
            return name
        except (BackendUnavailable, ModuleNotFoundError) as err:
            if name not in _warned:
                _warned.add(name)
                warnings.warn(
                    f"lightning_rnn: the {name!r} backend is unavailable ({_summary(err)}); "
                    "falling back to the slower 'reference' backend.",
                    RuntimeWarning,
                    stacklevel=_caller_level(),
                )
    return "reference"


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside lightning_rnn and torch (the user's call
    of the layer), so that the warning points there and can be filtered by module."""
    inside = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent))
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


def _is_exporting() -> bool:
    """torch.compiler.is_exporting(), which torch versions before 2.7 lack. There (checked
    on 2.4.1) is_compiling() outside Dynamo tells torch.export's tracing: export is what
    sets its flag, while under Dynamo (torch.compile too) it reads True regardless."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    if is_exporting is not None:
        return bool(is_exporting())
    return bool(torch.compiler.is_compiling() and not torch.compiler.is_dynamo_compiling())


#: Words of the lines that say why a build failed (compiler errors, a missing tool).
_CAUSES = ("error", "not found", "fatal", "no such file", "permission denied")


def _summary(err: Exception, max_lines: int = 3, max_chars: int = 1000) -> str:
    """The gist of a (possibly long) build failure: its first line and the lines giving the
    cause. Over ``max_chars``, the first line is cut first: it ends with the compile command
    (longer with torch 2.4's flags than with 2.13's), the causes say what went wrong."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    causes = [ln for ln in lines[1:] if any(w in ln.lower() for w in _CAUSES)
              and not ln.startswith(("c++ ", "[", "FAILED"))]
    first, rest = lines[0], "".join(" | " + ln for ln in causes[:max_lines])
    room = max_chars - len(rest)
    if len(first) > room:
        first = first[: max(room - 3, 0)] + "..."
    return (first + rest)[:max_chars]


def kernels(backend: str) -> ModuleType:
    """The kernel module of a concrete backend name."""
    return load(backend)

