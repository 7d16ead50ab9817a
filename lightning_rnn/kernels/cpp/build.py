"""Just-in-time build of a compiled kernel backend, once per process, cached on disk.

The extension is built with :func:`torch.utils.cpp_extension.load` (ninja) into
``$TORCH_EXTENSIONS_DIR`` (default: torch's extensions root) under a name that carries
a hash of every C++/CUDA source and header, the flags, the torch version and the CPU
model (for CUDA also the GPU architectures built for: $TORCH_CUDA_ARCH_LIST, else the
visible GPUs'), so an edit or a different machine gets a fresh build and a cached build is
reused otherwise: imported directly, with no compiler, ninja or write access needed (a
shared, read-only cache works). Concurrent builds are serialized by torch's file baton
in the build directory. Any failure becomes :class:`BackendUnavailable` carrying the
compiler's output.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import sys
import threading
import time
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


def _cuda_targets() -> str:
    """What a CUDA build's machine code is made for: torch builds for $TORCH_CUDA_ARCH_LIST,
    else for the compute capabilities of the visible GPUs (the newest with PTX), with the
    CUDA version of this torch build."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if not archs:
        archs = ";".join(sorted({"%d.%d" % torch.cuda.get_device_capability(i)
                                 for i in range(torch.cuda.device_count())}))
    return f"cuda {torch.version.cuda} archs {archs}"


def _fingerprint(sources: list[Path], flags: list[str], cuda: bool = False) -> str:
    digest = hashlib.sha1()
    for path in sorted(p for p in CSRC.iterdir() if p.is_file()):  # headers too: torch hashes sources only
        digest.update(path.name.encode() + path.read_bytes())
    machine = [torch.__version__, _cpu_model()] + ([_cuda_targets()] if cuda else [])
    digest.update(" ".join([str(s) for s in sources] + flags + machine).encode())
    return digest.hexdigest()[:12]


#: A build lock older than this was left by a build that was killed (builds take ~1-2 minutes).
STALE_LOCK_SECONDS = 15 * 60


def _find_ninja() -> None:
    """Put the ninja that pip installed with this package on PATH when PATH has none (a
    venv's Python run without activating the venv: cron jobs, IDEs)."""
    if shutil.which("ninja"):
        return
    candidates = [Path(sys.executable).parent]
    try:
        import ninja

        candidates.insert(0, Path(ninja.BIN_DIR))
    except (ImportError, AttributeError):
        pass
    for directory in candidates:
        if (directory / "ninja").exists():
            os.environ["PATH"] = os.pathsep.join([str(directory), os.environ.get("PATH", "")])
            return


def _clear_stale_lock(build_dir: Path) -> None:
    """torch's file baton (``build_dir/lock``) makes a process wait while another builds; a
    build that was killed leaves it behind, and every later process would wait forever."""
    lock = build_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        print(f"lightning_rnn: removing a build lock left {age / 60:.0f} minutes ago by an interrupted "
              f"build: {lock}", file=sys.stderr, flush=True)
        lock.unlink(missing_ok=True)
    else:
        print(f"lightning_rnn: waiting for the build another process started ({lock}); if no other "
              "process is building, delete that file", file=sys.stderr, flush=True)


def jit_build(tag: str, sources: list[str], cflags: list[str], cuda_cflags: list[str] | None = None) -> ModuleType:
    """Build (or load the cached build of) ``sources`` from csrc/; raises BackendUnavailable.

    ``tag`` names the backend ("cpp", "cuda"). The outcome, success or failure, is
    remembered for the process: a failed build is not retried on every call.
    """
    done = _built.get(tag)  # every forward asks: a finished build needs no lock
    if done is not None and not isinstance(done, BackendUnavailable):
        return done
    with _lock:
        if tag in _built:
            result = _built[tag]
            if isinstance(result, BackendUnavailable):
                raise result
            return result
        paths = [CSRC / s for s in sources]
        name = f"lightning_rnn_{tag}_{_fingerprint(paths, cflags + (cuda_cflags or []), cuda_cflags is not None)}"
        build_dir = _build_root() / name
        built = build_dir / f"{name}.so"
        if built.exists() and not (build_dir / "lock").exists():  # built before, no build under way
            try:
                module = _import_built(name, built)
            except ImportError:
                pass  # e.g. an incomplete file: build again below
            else:
                _built[tag] = module
                return module
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
            _find_ninja()
            _clear_stale_lock(build_dir)
            if not built.exists():
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


def _import_built(name: str, path: Path) -> ModuleType:
    """Import an extension built earlier (its folder's name fingerprints every source and
    flag, so it is current). Needs no write access, no ninja and no compiler: a shared or
    read-only cache works, where torch's load() would first write its lock file there."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def forget(tag: str) -> None:
    """Drop the remembered outcome for ``tag`` (tests)."""
    with _lock:
        _built.pop(tag, None)
