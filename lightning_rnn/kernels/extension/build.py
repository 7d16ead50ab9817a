"""Just-in-time build of a compiled kernel backend, once per process, cached on disk.

The extension is built with :func:`torch.utils.cpp_extension.load` (ninja) into
``$TORCH_EXTENSIONS_DIR`` (default: torch's extensions root) under a name that carries
a hash of every C++/CUDA source and header, the flags, the compiler ($CXX, else c++), the
torch version and the CPU model (for CUDA also the GPU architectures built for:
$TORCH_CUDA_ARCH_LIST, else the visible GPUs'), so an edit or a different machine gets a
fresh build and a cached build is reused otherwise: imported directly, with no compiler,
ninja or write access needed (a shared, read-only cache works). Concurrent builds are
serialized by torch's lock in the build directory (``lock``): up to torch 2.13 a file
baton, whose existence means a build is under way; from torch 2.14 an advisory lock
(flock) on a file that stays, held only while a process builds. Any failure becomes
:class:`BackendUnavailable` carrying the compiler's output.

Flags the compiler cannot use are replaced first (:func:`supported_flags`): GCC gets the
flags as written; a clang without an OpenMP that works with torch's (Apple's; Linux
clang, whose libomp torch's libgomp cannot serve) builds with -fopenmp-simd, and a
compiler without -march=native with -mcpu=native or neither.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import torch
from torch.utils import cpp_extension

from ..backends import BackendUnavailable

CSRC = Path(__file__).resolve().parent.parent / "csrc"

_lock = threading.Lock()
_built: dict[str, ModuleType | BackendUnavailable] = {}


CPUINFO = Path("/proc/cpuinfo")

#: What names an Arm CPU in /proc/cpuinfo, which has no "model name" there (a build for
#: -mcpu=native on a Graviton3, with SVE, must not be handed to a Graviton2).
_ARM_CPU_KEYS = ("CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features")


def _cpu_model() -> str:
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        lines = []
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" in fields:
        return fields["model name"]
    arm = [fields[key] for key in _ARM_CPU_KEYS if key in fields]
    return " ".join(arm) if arm else platform.processor()


#: Flags some compilers reject, each with what to try instead, in order (dropped when none
#: works): older (Apple) clang on arm64 takes -mcpu=native, not -march=native; a clang
#: without libomp (Apple's) rejects -fopenmp or has no omp.h, and -fopenmp-simd keeps the
#: kernels' `#pragma omp simd` loops (ATen's parallel_for then runs the pointwise passes
#: on the calling thread; the GEMMs stay multi-threaded in MKL / oneDNN).
FLAG_FALLBACKS = {"-march=native": ["-mcpu=native"], "-fopenmp": ["-fopenmp-simd"]}

#: What a flag's probe compiles: for -fopenmp, what torch's headers need of it (omp.h)
#: and a parallel region, whose calls into the OpenMP runtime the probe checks.
_PROBE_SOURCE = {
    "-fopenmp": "#include <omp.h>\nint lrnn_probe(int* x) {\n#pragma omp parallel\n"
                "  x[omp_get_thread_num()] = 1;\n  return omp_get_max_threads();\n}\n"
}

#: The entry points of a parallel region: GNU libgomp's, and LLVM / Intel libomp's.
_OPENMP_ENTRIES = ("GOMP_parallel", "__kmpc_fork_call")


def _cxx() -> str:
    """The C++ compiler torch's cpp_extension builds with: $CXX, else c++."""
    return os.environ.get("CXX", "c++")


def _torch_defines(symbol: str) -> bool:
    """Whether torch's libraries, with the OpenMP runtime they load, define ``symbol``."""
    try:
        ctypes.CDLL(torch._C.__file__)[symbol]
    except (OSError, AttributeError):
        return False
    return True


@functools.lru_cache(maxsize=None)
def _accepts(cxx: str, flag: str) -> bool | None:
    """Whether the compiler ``cxx`` compiles a tiny translation unit with ``flag`` and says
    nothing about it (clang only warns of a flag it ignores, "argument unused during
    compilation: '-mcpu=native'"), and its code calls only OpenMP runtime entries that
    torch's runtime has (clang with LLVM's libomp calls __kmpc_fork_call, which the
    libgomp of torch's Linux wheels lacks: the build would not import); None when the
    compiler cannot be run at all."""
    source = _PROBE_SOURCE.get(flag, "int lrnn_probe() { return 0; }\n")
    command = [cxx, "-x", "c++", "-S", "-", "-o", "-", flag]
    try:
        done = subprocess.run(command, input=source, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    if done.returncode != 0 or flag in done.stderr:
        return False
    return all(_torch_defines(entry) for entry in _OPENMP_ENTRIES if entry in done.stdout)


def supported_flags(cflags: list[str]) -> list[str]:
    """``cflags`` with each flag of FLAG_FALLBACKS the compiler rejects replaced by its
    first accepted alternative (or dropped). Probed once per process and compiler, a few
    milliseconds each; unchanged when the compiler cannot be run (a cached build is then
    found under the usual flags, and a build would fail with the compiler's own error)."""
    cxx = _cxx()
    chosen = []
    for flag in cflags:
        if flag not in FLAG_FALLBACKS:
            chosen.append(flag)
            continue
        for candidate in [flag] + FLAG_FALLBACKS[flag]:
            accepted = _accepts(cxx, candidate)
            if accepted is None:
                return list(cflags)
            if accepted:
                chosen.append(candidate)
                break
    return chosen


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
    machine = [torch.__version__, _cpu_model(), _cxx()] + ([_cuda_targets()] if cuda else [])
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


def _advisory_lock() -> bool:
    """Whether torch's load() locks the build directory with an advisory lock (torch >=
    2.14: ``filelock.FileLock``, released by the kernel when its holder dies) rather than
    a file baton whose existence alone makes other processes wait."""
    return getattr(cpp_extension, "FileLock", None) is not None


def _lock_held(lock: Path) -> bool:
    """Whether another process holds the advisory lock on ``lock`` (an flock, as
    filelock takes it on POSIX). False where it cannot tell (no such file, no read
    access, no fcntl): the import of a half-written build then fails and load() waits."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _build_under_way(build_dir: Path) -> bool:
    """Whether another process is building into ``build_dir`` now."""
    lock = build_dir / "lock"
    return _lock_held(lock) if _advisory_lock() else lock.exists()


def _clear_stale_lock(build_dir: Path) -> None:
    """torch's file baton (``build_dir/lock``) makes a process wait while another builds; a
    build that was killed leaves it behind, and every later process would wait forever.
    An advisory lock (torch >= 2.14) needs no clearing: only a live process holds it."""
    lock = build_dir / "lock"
    if _advisory_lock():
        if _lock_held(lock):
            print(f"lightning_rnn: waiting for the build another process started ({lock})",
                  file=sys.stderr, flush=True)
        return
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
        wanted, cflags = cflags, supported_flags(cflags)
        name = f"lightning_rnn_{tag}_{_fingerprint(paths, cflags + (cuda_cflags or []), cuda_cflags is not None)}"
        build_dir = _build_root() / name
        built = build_dir / f"{name}.so"
        if built.exists() and not _build_under_way(build_dir):  # built before, no build under way
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
                rejected = [f for f in wanted if f not in cflags]
                if rejected:
                    note = " (no OpenMP: the pointwise passes run on one thread)" if "-fopenmp" in rejected else ""
                    print(f"lightning_rnn: {_cxx()} cannot build with {' '.join(rejected)} here; building with "
                          f"{' '.join(cflags)}{note}", file=sys.stderr, flush=True)
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
