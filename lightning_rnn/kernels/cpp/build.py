"""Just-in-time build of a compiled kernel backend, once per process, cached on disk.

The extension is built with :func:`torch.utils.cpp_extension.load` (ninja) into
``$TORCH_EXTENSIONS_DIR`` (default: torch's extensions root) under a name that carries
a hash of every C++/CUDA source and header, the flags, the torch version and the CPU
model, so an edit or a different machine gets a fresh build and a cached build is
reused otherwise. Concurrent processes are serialized by torch's file baton in the
build directory. Any failure becomes :class:`BackendUnavailable` carrying the
compiler's output.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension

from ..dispatch import BackendUnavailable

CSRC = Path(__file__).resolve().parent.parent / "csrc"

_lock = threading.Lock()
_built: dict[str, ModuleType | BackendUnavailable] = {}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _build_root() -> Path:
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())


def _fingerprint(sources: list[Path], flags: list[str]) -> str:
    digest = hashlib.sha1()
    for path in sorted(p for p in CSRC.iterdir() if p.is_file()):  # headers too: torch hashes sources only
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join([str(s) for s in sources] + flags + [torch.__version__, _cpu_model()]).encode())
    return digest.hexdigest()[:12]


def jit_build(tag: str, sources: list[str], cflags: list[str], cuda_cflags: list[str] | None = None) -> ModuleType:
    """Build (or load the cached build of) ``sources`` from csrc/; raises BackendUnavailable.

    ``tag`` names the backend ("cpp", "cuda"). The outcome, success or failure, is
    remembered for the process: a failed build is not retried on every call.
    """
    with _lock:
        if tag in _built:
            result = _built[tag]
            if isinstance(result, BackendUnavailable):
                raise result
            return result
        paths = [CSRC / s for s in sources]
        name = f"lightning_rnn_{tag}_{_fingerprint(paths, cflags + (cuda_cflags or []))}"
        build_dir = _build_root() / name
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            if not (build_dir / f"{name}.so").exists():
                print(f"lightning_rnn: building the {tag!r} kernels (first use, about a minute) in {build_dir}",
                      file=sys.stderr, flush=True)
            module = cpp_extension.load(
                name=name,
                sources=[str(p) for p in paths],
                extra_cflags=cflags,
                extra_cuda_cflags=cuda_cflags,
                extra_include_paths=[str(CSRC)],
                build_directory=str(build_dir),
                with_cuda=cuda_cflags is not None,
                verbose=False,
            )
        except Exception as err:  # compiler missing, compile error, link error, import error
            failure = BackendUnavailable(f"building the {tag!r} kernels failed: {err}")
            _built[tag] = failure
            raise failure from err
        _built[tag] = module
        return module


def forget(tag: str) -> None:
    """Drop the remembered outcome for ``tag`` (tests)."""
    with _lock:
        _built.pop(tag, None)
