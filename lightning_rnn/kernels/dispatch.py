"""Choosing the kernel backend a fused layer runs on.

Each kernel backend is a :class:`~lightning_rnn.kernels.backends.Backend`, the ``BACKEND``
of its module, which declares the devices it runs on and its entry points (see
:mod:`.backends`). ``"reference"`` (plain torch ops, any device) is always available; the
compiled ones, ``"cpp"`` (CPU) and ``"cuda"``, are built on first use by :func:`load`,
which raises :class:`BackendUnavailable` where they cannot be.

:func:`resolve` turns what a layer was given (``backend=``) into a concrete name for a
device: ``"auto"`` takes the first backend of :data:`PREFERENCE` for the device type that
loads (the device's compiled kernel, then ``"reference"``) and warns once when it falls
back; a named backend loads or raises. The first time a compiled backend is resolved for a
device (per GPU index) it must pass :mod:`.selfcheck`, a parity check against ``"reference"``
on tiny cases: where it fails, ``"auto"`` warns once and falls back, a named backend raises
:class:`~.selfcheck.SelfCheckFailed`. ``"torch"`` is not a kernel backend: :mod:`.run`
hands the whole stack to torch.nn's own implementation (the baseline, an escape hatch, and
what runs on the meta device, under torch.func transforms and while a graph is exported).
"""
from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import torch

from . import selfcheck
from .backends import Backend, BackendUnavailable
from .selfcheck import SelfCheckFailed

KERNEL_BACKENDS = ("reference", "cpp", "cuda")
BACKENDS = ("auto", "torch") + KERNEL_BACKENDS

_MODULES = {
    "reference": "lightning_rnn.kernels.reference",
    "cpp": "lightning_rnn.kernels.cpp",
    "cuda": "lightning_rnn.kernels.cuda",
}
# Kernel backends per device type, fastest first; "reference" closes every list.
PREFERENCE = {"cpu": ("cpp", "reference"), "cuda": ("cuda", "reference")}
_warned: set = set()  # backends (names) and self-checks ((name, device type, index)) warned of
# (backend asked for, device type, device index) -> the backend it resolved to once that loaded
# and passed its self-check: every forward asks, and a load (an import and a build check) is not
# free per call.
_loaded: dict[tuple[str, str, int | None], Backend] = {}

__all__ = ["BACKENDS", "KERNEL_BACKENDS", "PREFERENCE", "Backend", "BackendUnavailable", "available_backends",
           "backend", "check_backend_name", "load", "resolve", "resolve_backend", "SelfCheckFailed"]


def check_backend_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend


def load(name: str) -> Backend:
    """The kernel backend ``name``, built if needed. Raises BackendUnavailable.

    Called on every forward: an imported backend module is taken from ``sys.modules``
    (what ``import_module`` would return, at a fraction of its cost per call)."""
    module = sys.modules.get(_MODULES[name]) or importlib.import_module(_MODULES[name])
    backend = module.BACKEND
    backend.load()  # builds (once) or raises BackendUnavailable
    return backend


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
    """The concrete backend name for ``backend`` on ``device`` (``"torch"`` included); see
    :func:`resolve_backend`."""
    found = resolve_backend(backend, device)
    return "torch" if found is None else found.name


def resolve_backend(backend: str, device: torch.device) -> Backend | None:
    """The kernel backend that runs a layer given ``backend=`` on ``device``, or None for
    torch.nn's implementation.

    ``"auto"`` picks the fastest backend for the device that loads and passes its
    self-check (see :data:`PREFERENCE`, :mod:`.selfcheck`); when a faster one cannot be
    built it warns once (per backend and process) and moves on, ending at ``"reference"``;
    when one fails its self-check it warns once per device, naming what differed, and uses
    the next one for that device from then on. Named backends raise
    :class:`BackendUnavailable` (:class:`SelfCheckFailed`) instead of falling back. On the
    meta device (shape inference, deferred initialization), inside ``torch.func``
    transforms and while a graph is captured for export (``torch.export``,
    ``torch.jit.trace``) every backend resolves to torch.nn's (None).
    """
    check_backend_name(backend)
    device = device if isinstance(device, torch.device) else torch.device(device)
    device_type = device.type
    if backend == "torch" or device_type == "meta":
        return None  # meta: shapes only, torch.nn's implementation propagates meta tensors
    if _torch_func_active():
        return None  # the kernels' autograd.Functions are not torch.func-transformable
    if _is_exporting() or torch.jit.is_tracing():
        return None  # captured as aten.lstm / aten.gru, which exported programs can run
    if device_type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (backend, device_type, device.index)
    loaded = _loaded.get(key)
    if loaded is not None:
        return loaded
    if backend != "auto":
        found = load(backend)
        if not found.runs_on(device_type):
            raise BackendUnavailable(f"backend: {backend!r} runs on {' and '.join(found.devices)} tensors, got "
                                     f"a tensor on {device_type}")
        if backend != "reference":
            selfcheck.verify(found, device)
        _loaded[key] = found
        return found
    names, failed_check = _preference(device), False
    for position, name in enumerate(names):
        try:
            found = load(name)
            if name != "reference":
                selfcheck.verify(found, device)
            if name != "reference" or failed_check:  # a build failure is tried again next call,
                _loaded[key] = found  # a failed self-check is final for the process
            return found
        except SelfCheckFailed as err:
            failed_check = True
            _warn_once((name, device_type, device.index), f"lightning_rnn: {err}; falling back to the "
                       f"{names[position + 1]!r} backend on {device}.")
        except (BackendUnavailable, ModuleNotFoundError) as err:
            _warn_once(name, f"lightning_rnn: the {name!r} backend is unavailable ({_summary(err)}); "
                       "falling back to the slower 'reference' backend.")
    return load("reference")


def _warn_once(key, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=_caller_level())


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


def backend(name: str) -> Backend:
    """The :class:`Backend` of a concrete kernel backend name (as :func:`resolve` returns)."""
    return load(name)

