"""Building and choosing the compiled backends: errors, fallback, caching, bad input."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from lightning_rnn.kernels import cpp, dispatch
from lightning_rnn.kernels.extension import build

from kernel_cases import kernels_for, make_args


@pytest.fixture
def broken_cpp(tmp_path, monkeypatch):
    """The cpp backend with a source that fails to compile (fast: #error on line 1)."""
    src = tmp_path / "broken.cpp"
    src.write_text('#error "lightning_rnn test: deliberately broken kernel"\n')
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(cpp, "SOURCES", [str(src)])
    monkeypatch.setattr(build, "_built", {})  # forget this process's real build meanwhile
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_loaded", {})  # and which backend the layers resolved to


def test_named_backend_raises_with_compiler_error(broken_cpp):
    with pytest.raises(dispatch.BackendUnavailable, match="deliberately broken kernel"):
        dispatch.resolve("cpp", torch.device("cpu"))
    with pytest.raises(dispatch.BackendUnavailable, match="deliberately broken kernel"):
        cpp.load()  # the failure is remembered, not rebuilt


def test_auto_warns_once_and_falls_back(broken_cpp):
    with pytest.warns(RuntimeWarning, match="(?s)'cpp' backend is unavailable.*deliberately broken.*falling back"):
        assert dispatch.resolve("auto", torch.device("cpu")) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.resolve("auto", torch.device("cpu")) == "reference"
    assert dispatch.available_backends("cpu") == ["reference"]


def test_the_fallback_warning_points_at_the_user_s_call(broken_cpp):
    from lightning_rnn import FusedLSTM

    layer = FusedLSTM(3, 4)
    with pytest.warns(RuntimeWarning, match="'cpp' backend is unavailable") as caught:
        layer(torch.randn(5, 2, 3))  # the layer's forward, through torch's module call
    assert caught[0].filename == __file__


def test_a_build_without_a_compiler_says_so_in_the_warning():
    """The fallback warning keeps the line with the cause ('c++: not found'), not only the
    (long) compile command."""
    err = dispatch.BackendUnavailable(
        "building the 'cpp' kernels failed: Error building extension 'x': [1/2] c++ -MMD -MF rnn_cpu.o.d ...\n"
        "FAILED: rnn_cpu.o\n/bin/sh: 1: c++: not found\nninja: build stopped: subcommand failed."
    )
    assert "/bin/sh: 1: c++: not found" in dispatch._summary(err)


def test_a_long_compile_command_is_cut_before_the_cause():
    """The first line ends with the compile command (torch 2.4's flags and long paths made it
    fill the whole summary): it is cut, the cause is kept, and the summary stays in bounds."""
    command = "c++ " + " ".join(f"-isystem /a/long/path/{i}/torch/include" for i in range(40))
    err = dispatch.BackendUnavailable(
        f"building the 'cpp' kernels failed: Error building extension 'x': [1/2] {command}\n"
        f"FAILED: rnn_cpu.o\n{command}\nrnn_cpu.cpp:1:2: error: #error \"the cause\"\nninja: build stopped"
    )
    summary = dispatch._summary(err)
    assert len(summary) <= 1000
    assert summary.startswith("building the 'cpp' kernels failed: Error building extension 'x': [1/2] c++ ")
    assert summary.endswith('... | rnn_cpu.cpp:1:2: error: #error "the cause"')


def test_torch_without_is_exporting_tells_export_by_is_compiling_outside_dynamo(monkeypatch):
    monkeypatch.delattr(torch.compiler, "is_exporting", raising=False)  # torch < 2.7
    assert dispatch._is_exporting() is False
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what torch.export's tracing sets
    assert dispatch._is_exporting() is True
    monkeypatch.setattr(torch.compiler, "is_dynamo_compiling", lambda: True)  # Dynamo (torch.compile too)
    assert dispatch._is_exporting() is False


def test_a_lock_left_by_a_killed_build_is_removed_and_a_fresh_one_kept(tmp_path, capsys, monkeypatch):
    import os
    import time

    monkeypatch.setattr(build, "_advisory_lock", lambda: False)  # torch <= 2.13's file baton
    lock = tmp_path / "lock"
    lock.touch()
    build._clear_stale_lock(tmp_path)  # another process is building now: wait for it
    assert lock.exists() and "waiting for the build another process started" in capsys.readouterr().err
    old = time.time() - build.STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    build._clear_stale_lock(tmp_path)  # killed mid-build long ago: every later process would hang
    assert not lock.exists() and "removing a build lock left" in capsys.readouterr().err


def test_an_advisory_lock_counts_only_while_a_process_holds_it(tmp_path, capsys, monkeypatch):
    """torch >= 2.14 locks the build folder with filelock (flock) and leaves the file: the
    file alone is no build under way and is never removed; a held lock is, and is waited for."""
    from filelock import FileLock

    monkeypatch.setattr(build, "_advisory_lock", lambda: True)
    lock = tmp_path / "lock"
    assert not build._build_under_way(tmp_path)  # no file yet
    with FileLock(str(lock)):  # the lock torch's load() takes while it builds
        assert lock.exists() and build._build_under_way(tmp_path)
        build._clear_stale_lock(tmp_path)
        assert "waiting for the build another process started" in capsys.readouterr().err
    assert lock.exists() and not build._build_under_way(tmp_path)  # released: the file stays
    build._clear_stale_lock(tmp_path)
    assert lock.exists() and capsys.readouterr().err == ""


def test_the_lock_style_follows_torch(monkeypatch):
    monkeypatch.setattr(build.cpp_extension, "FileLock", object(), raising=False)
    assert build._advisory_lock()
    monkeypatch.delattr(build.cpp_extension, "FileLock")
    assert not build._advisory_lock()


def test_ninja_is_found_next_to_python_without_an_activated_venv(monkeypatch):
    import shutil

    monkeypatch.setenv("PATH", "/nonexistent")
    assert shutil.which("ninja") is None
    build._find_ninja()
    assert shutil.which("ninja") is not None  # pip's ninja (a dependency) beside this Python


def test_a_cached_build_is_imported_without_building_tools(monkeypatch):
    """No compiler, ninja or write access is needed for a build made earlier (torch's load()
    wants to write its lock file into the build folder first)."""
    cpp.load()  # built (or cached) by this process's first use

    def no_build(**kwargs):
        raise AssertionError("cpp_extension.load called for a cached build")

    monkeypatch.setattr(build, "_built", {})
    monkeypatch.setattr(build.cpp_extension, "load", no_build)
    monkeypatch.setenv("PATH", "/nonexistent")
    module = cpp.load()
    x, h = torch.randn(6, 3), torch.zeros(2, 4)
    out = module.gru_forward(x, torch.tensor([2, 2, 2]), h, None, torch.randn(12, 3), torch.randn(12, 4),
                             None, None, None, False, torch.float32, torch.float32)[0]
    assert out.shape == (6, 4)


def test_a_cuda_build_is_cached_per_gpu_architecture(tmp_path, monkeypatch):
    """A cache shared by machines with the same CPU and torch (a cluster's home folder) must
    not hand a build for one GPU architecture to another ("no kernel image is available for
    execution on the device" at the first launch): torch builds for $TORCH_CUDA_ARCH_LIST,
    else for the visible GPUs, and the build's name says which."""
    from lightning_rnn.kernels import cuda

    names = []

    def fake_load(name, **kwargs):
        names.append(name)
        raise RuntimeError("not built in this test")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(build.cpp_extension, "load", fake_load)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def build_for(capability):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(build, "_built", {})
        with pytest.raises(dispatch.BackendUnavailable, match="not built in this test"):
            build.jit_build("cuda", cuda.SOURCES, cuda.CFLAGS, cuda.CUDA_CFLAGS)

    build_for((8, 0))
    build_for((9, 0))
    build_for((9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    build_for((9, 0))
    assert names[0] != names[1] == names[2] != names[3]


def test_auto_picks_compiled_backend_on_cpu():
    assert dispatch.resolve("auto", torch.device("cpu")) == "cpp"
    assert dispatch.available_backends("cpu") == ["cpp", "reference"]


def test_cuda_backend_never_breaks_a_cpu_install():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the cuda backend is tested by test_backend_parity")
    with pytest.raises(dispatch.BackendUnavailable):
        dispatch.backend("cuda")
    assert "cuda" not in dispatch.available_backends("cuda")


def test_a_cuda_home_without_headers_is_named_with_the_toolkit_nvcc_points_to(tmp_path, monkeypatch):
    """torch takes the folder above nvcc's bin/ as CUDA_HOME, /usr/local for a symlink
    /usr/local/bin/nvcc, which has no CUDA headers: the backend says so before any build,
    with the toolkit the link points to."""
    from torch.utils import cpp_extension

    from lightning_rnn.kernels import cuda

    toolkit, local = tmp_path / "cuda-13.0", tmp_path / "local"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").touch()
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    (local / "bin").mkdir(parents=True)
    (local / "bin" / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    monkeypatch.setenv("PATH", str(local / "bin"))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(local))
    with pytest.raises(dispatch.BackendUnavailable, match="has no include/cuda_runtime.h") as raised:
        cuda.load()
    assert f"CUDA_HOME={local} " in str(raised.value) and f"try CUDA_HOME={toolkit})" in str(raised.value)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no nvcc on PATH: no hint, still the reason
    assert cuda._why_unavailable().endswith("set CUDA_HOME to the CUDA toolkit's folder")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(toolkit))  # the toolkit itself: nothing to say
    assert cuda._why_unavailable() is None
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", str(local))  # headers where torch also looks
    monkeypatch.setenv("CUDA_INC_PATH", str(toolkit / "include"))
    assert cuda._why_unavailable() is None
    monkeypatch.delenv("CUDA_INC_PATH")
    (local / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    (local / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").touch()
    assert cuda._why_unavailable() is None


def test_cached_build_is_reused_by_another_process():
    kernels_for("cpp")  # built (or loaded) in this process
    code = "from lightning_rnn.kernels import cpp; cpp.load(); print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok" and "building" not in done.stderr


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a.__setitem__(5, a[5][:, :-1]), "w_hh: expected shape"),
        (lambda a: a.__setitem__(2, a[2][:-1]), "h0: expected shape"),
        (lambda a: a.__setitem__(1, torch.tensor([2, 3])), "batch_sizes: expected positive, non-increasing"),
        (lambda a: a.__setitem__(1, torch.tensor([3.0, 2.0])), "batch_sizes: expected a non-empty 1-D int64"),
        (lambda a: a.__setitem__(0, a[0][:-1]), "x: expected 5 rows"),
        (lambda a: a.__setitem__(7, None), "b_ih, b_hh: expected both or neither"),
        (lambda a: a.append(torch.zeros(3, 4, dtype=torch.float64)), r"w_hr: expected a 2-D \(4, hidden_size\)"),
        (lambda a: a.append(torch.zeros(4, 4, dtype=torch.float32)), "w_hr: expected dtype Double"),
    ],
)
def test_bad_input_is_rejected_at_the_boundary(change, message):
    kernels = kernels_for("cpp")
    args = [a.detach() if isinstance(a, torch.Tensor) else a for a in make_args("lstm", [3, 2])]
    change(args)
    with pytest.raises(RuntimeError, match=message):
        kernels.lstm(*args)


def _fake_cxx(tmp_path, reject=(), warn=(), asm=""):
    """A compiler script that fails on the flags in ``reject`` (as Apple clang does on
    -fopenmp), warns of those in ``warn`` (as clang does of a flag it ignores), else
    succeeds, writing ``asm`` as the assembly of a -fopenmp compile."""
    script = tmp_path / "fake-c++"
    script.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        f'  case " {" ".join(reject)} " in *" $arg "*) echo "error: unsupported option \'$arg\'" >&2; exit 1;; esac\n'
        f'  case " {" ".join(warn)} " in *" $arg "*) echo "warning: argument unused: \'$arg\'" >&2;; esac\n'
        f'  if [ "$arg" = -fopenmp ]; then echo \'{asm}\'; fi\n'
        "done\n"
        "cat > /dev/null\n"
    )
    script.chmod(0o755)
    return str(script)


def _with(flags, old, new):
    return [new if f == old else f for f in flags if f != old or new is not None]


@pytest.mark.parametrize(
    "reject,warn,asm,replaced",
    [
        ((), (), "", {}),
        (("-fopenmp",), (), "", {"-fopenmp": "-fopenmp-simd"}),  # Apple clang
        (("-fopenmp", "-fopenmp-simd"), (), "", {"-fopenmp": None}),
        (("-march=native",), (), "", {"-march=native": "-mcpu=native"}),  # older clang on arm64
        (("-march=native",), ("-mcpu=native",), "", {"-march=native": None}),
        ((), (), "call __kmpc_fork_call", {"-fopenmp": "-fopenmp-simd"}),  # clang with LLVM's libomp
        ((), (), "call GOMP_parallel", {}),
    ],
    ids=["accepts-all", "no-openmp", "no-openmp-simd", "no-march", "no-native", "libomp", "libgomp"],
)
def test_flags_a_compiler_cannot_use_are_replaced(tmp_path, monkeypatch, reject, warn, asm, replaced):
    monkeypatch.setattr(build, "_torch_defines", lambda symbol: symbol == "GOMP_parallel")  # torch's Linux wheels
    monkeypatch.setenv("CXX", _fake_cxx(tmp_path, reject, warn, asm))
    want = list(cpp.CFLAGS)
    for old, new in replaced.items():
        want = _with(want, old, new)
    assert build.supported_flags(cpp.CFLAGS) == want


def test_flags_are_kept_where_the_compiler_cannot_be_run(tmp_path, monkeypatch):
    """No compiler: a cached build is found under the flags as written."""
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    assert build.supported_flags(cpp.CFLAGS) == cpp.CFLAGS


def test_torch_s_openmp_runtime_is_found():
    """The probe asks torch's libraries for a parallel region's entry point: they have
    the runtime of the OpenMP torch was built with, and nothing else."""
    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch without OpenMP")
    assert build._torch_defines("GOMP_parallel") or build._torch_defines("__kmpc_fork_call")
    assert not build._torch_defines("lrnn_no_such_symbol")


def test_gcc_builds_with_the_flags_as_written(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    version = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout
    if "Free Software Foundation" not in version or "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("c++ is not GCC, or torch has no OpenMP")
    assert build.supported_flags(cpp.CFLAGS) == cpp.CFLAGS


def test_the_flags_used_name_the_build(tmp_path, monkeypatch, capsys):
    """A compiler without OpenMP builds with -fopenmp-simd, says so, and under its own name."""
    builds = []

    def fake_load(name, extra_cflags, **kwargs):
        builds.append((name, extra_cflags))
        raise RuntimeError("not built in this test")

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(build.cpp_extension, "load", fake_load)
    for i, reject in enumerate([(), ("-fopenmp",)]):
        (tmp_path / str(i)).mkdir()
        monkeypatch.setenv("CXX", _fake_cxx(tmp_path / str(i), reject))
        monkeypatch.setattr(build, "_built", {})
        with pytest.raises(dispatch.BackendUnavailable, match="not built in this test"):
            build.jit_build("cpp", cpp.SOURCES, cpp.CFLAGS)
    assert builds[0][1] == cpp.CFLAGS and builds[1][1] == _with(cpp.CFLAGS, "-fopenmp", "-fopenmp-simd")
    assert builds[0][0] != builds[1][0]
    assert "cannot build with -fopenmp here" in capsys.readouterr().err


def test_arm_cpus_are_told_apart_in_the_build_s_name(tmp_path, monkeypatch):
    """Arm's /proc/cpuinfo has no "model name": a -mcpu=native build for one Arm CPU (SVE
    on a Graviton3) must not be reused from a shared cache by another (a Graviton2)."""
    names = []
    for part, features in (("0xd0c", "fp asimd"), ("0xd40", "fp asimd sve"), ("0xd40", "fp asimd sve")):
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text(f"processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: {features}\nCPU implementer\t: 0x41\n"
                           f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part}\n\n"
                           "processor\t: 1\nCPU part\t: 0xfff\n")
        monkeypatch.setattr(build, "CPUINFO", cpuinfo)
        names.append(build._fingerprint([build.CSRC / s for s in cpp.SOURCES], cpp.CFLAGS))
    assert names[0] != names[1] == names[2]
    assert build._cpu_model() == "0x41 8 0x1 0xd40 fp asimd sve"


_CLANG_PARITY = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from kernel_cases import make_args, run_and_grad
from lightning_rnn.kernels import cpp, reference
from lightning_rnn.kernels.extension import build
ext = cpp.load()
print(" ".join(build.supported_flags(cpp.CFLAGS)))
assert ext.__file__.startswith(str(build._build_root())), ext.__file__
for cell in ("lstm", "gru"):
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        got = run_and_grad(getattr(cpp, cell), make_args(cell, [4, 3, 3, 1], dtype=dtype))
        want = run_and_grad(getattr(reference, cell), make_args(cell, [4, 3, 3, 1], dtype=dtype))
        for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
print("ok")
"""


def test_clang_without_openmp_builds_a_matching_kernel():
    """CXX=clang++ with no libomp (as Apple's clang): the build falls back to
    -fopenmp-simd and matches the reference. One build (~30-60 s), cached on disk."""
    import shutil
    from pathlib import Path

    if shutil.which("clang++") is None:
        pytest.skip("clang++ is not installed")
    env = dict(os.environ, CXX="clang++")
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", _CLANG_PARITY, str(here)], capture_output=True, text=True,
                          env=env, cwd=here.parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    flags, ok = done.stdout.split("\n")[-3:-1]
    assert ok == "ok" and "-march=native" in flags.split()
    if not build._torch_defines("__kmpc_fork_call"):  # torch with GNU libgomp: clang's OpenMP cannot use it
        assert "-fopenmp-simd" in flags.split() and "-fopenmp" not in flags.split()


def _cuda_toolkit() -> str | None:
    """torch's CUDA_HOME where it holds nvcc and the CUDA headers, else None."""
    if torch.version.cuda is None:
        return None
    from torch.utils.cpp_extension import CUDA_HOME

    from lightning_rnn.kernels import cuda

    return CUDA_HOME if CUDA_HOME is not None and cuda._has_cuda_headers(CUDA_HOME) else None


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the CUDA tests build and run the backend")
@pytest.mark.skipif(_cuda_toolkit() is None, reason="needs a CUDA build of torch and nvcc with the CUDA headers")
def test_the_cuda_sources_build_link_and_import_without_a_gpu(tmp_path, monkeypatch):
    """Where torch has CUDA and nvcc exists but no GPU is visible, the cuda backend's sources
    still compile (for sm_80 and sm_90), link against torch's CUDA libraries and import; its
    bindings refuse CPU tensors by name before any kernel would launch (the cell options'
    entry points too)."""
    from lightning_rnn.kernels import cuda

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    monkeypatch.setattr(build, "_built", {})  # this build is for no device: forget it after the test
    module = build.jit_build("cuda", cuda.SOURCES, cuda.CFLAGS, cuda.CUDA_CFLAGS)
    parts = ("forward", "backward", "gemm_bound", "apply", "stack", "padded", "options_forward", "options_backward")
    names = {f"{cell}_{part}" for cell in ("lstm", "gru") for part in parts}
    assert names <= set(dir(module))
    x, h0, c0 = torch.randn(6, 3), torch.zeros(2, 4), torch.zeros(2, 4)
    with pytest.raises(RuntimeError, match="x: expected a tensor on cuda, got cpu"):
        module.lstm_forward(x, torch.tensor([2, 2, 2]), h0, c0, torch.randn(16, 3), torch.randn(16, 4),
                            None, None, None, False, torch.float32, torch.float32)
    with pytest.raises(RuntimeError, match="x: expected a tensor on cuda, got cpu"):
        module.lstm_options_forward(x, torch.tensor([2, 2, 2]), h0, c0, torch.randn(16, 3), torch.randn(16, 4),
                                    None, None, None, False, torch.float32, torch.float32, [], None, 0.0, 0.1,
                                    0.1, None, None, None, 0.0)
