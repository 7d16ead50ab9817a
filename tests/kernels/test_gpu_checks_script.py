"""tests/gpu_checks.sh and its Python checks (tests/gpu/checks.py) without a GPU: the shell
script parses, the CUDA checks skip cleanly, the device-independent parts of the memory and
precision runs pass on the CPU, and the readers of the recipe's and the benchmark's outputs
pass what they should and fail what they should."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu" / "checks.py"


@pytest.fixture(scope="module")
def checks():
    spec = importlib.util.spec_from_file_location("gpu_checks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out, *args):
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def _rows(out):
    return [line.split("\t") for line in (out / "summary.tsv").read_text().splitlines()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_shell_script_parses():
    done = subprocess.run(["bash", "-n", str(ROOT / "tests" / "gpu_checks.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU these checks run for real (gpu_checks.sh)")
def test_the_cuda_checks_skip_without_a_gpu(tmp_path):
    done = _run(tmp_path, "selfcheck", "memory", "precision")
    assert done.returncode == 0, done.stderr
    assert [(name, status) for name, status, *_ in _rows(tmp_path)] == [
        ("selfcheck", "SKIP"), ("memory", "SKIP"), ("precision", "SKIP")]


def test_the_memory_and_precision_runs_pass_on_the_cpu(tmp_path):
    """The runs the GPU checks make, on the CPU: 4 measured steps with activation bytes, and
    bf16 autocast reaching the fused layers with the loss falling."""
    done = _run(tmp_path, "memory", "precision", "--device", "cpu")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (memory, precision) = _rows(tmp_path)
    assert memory[:2] == ["memory", "PASS"] and "activations" in memory[2]
    assert precision[:2] == ["precision", "PASS"] and precision[2].startswith("bf16: loss ")


def test_a_failed_row_fails_the_summary(tmp_path):
    done = _run(tmp_path, "record:build cuda:PASS:80 s", "record:benchmark:FAIL:timed out", "summary")
    assert done.returncode == 1
    assert "FAILED: benchmark" in done.stdout and "build cuda" in done.stdout
    assert _run(tmp_path / "ok", "record:build cuda:PASS:80 s", "summary").returncode == 0


def _metrics(path, losses, val):
    path.mkdir(parents=True)
    lines = ["epoch,step,train/loss,val/loss"]
    lines += [f"0,{10 * k + 9},{loss},," for k, loss in enumerate(losses)]
    lines += [f"0,{100 * (k + 1) - 1},,{v}" for k, v in enumerate(val)]
    (path / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_the_recipe_reader(checks, tmp_path):
    _metrics(tmp_path / "fell" / "csv", [3.2, 3.0, 2.9] + [2.5] * 24 + [2.1, 2.0, 2.0], [2.8, 2.4, 2.1])
    assert checks.read_recipe(str(tmp_path / "fell")).startswith("300 steps: train/loss 3.03 -> 2.03")
    _metrics(tmp_path / "flat" / "csv", [3.2, 3.0, 2.9] + [2.8] * 27, [2.8, 2.7, 2.7])
    with pytest.raises(checks.Failed, match="did not fall below 0.75"):
        checks.read_recipe(str(tmp_path / "flat"))
    (tmp_path / "fell" / "run.log").write_text("RuntimeWarning: lightning_rnn: the 'cuda' backend failed its "
                                               "self-check on cuda:0 ...; falling back to the 'reference' backend")
    with pytest.raises(checks.Failed, match="fell back"):
        checks.read_recipe(str(tmp_path / "fell"))


def test_the_benchmark_reader(checks, tmp_path):
    head = "cell,layers,hidden,backend,ours_ms,torch_ms,ours_peak_bytes,torch_peak_bytes\n"
    good = tmp_path / "grid.csv"
    good.write_text(head + "lstm,1,128,cuda,1.0,0.5,100,200\nlstm,2,512,cuda,3.0,2.0,300,600\n")
    assert checks.read_bench(str(good)) == ("2 points; lstm 2x512: 3.00 ms vs cuDNN 2.00 ms (1.50x), "
                                            "peak memory 0.50x")
    fallback = tmp_path / "fallback.csv"
    fallback.write_text(head + "lstm,1,128,reference,9.0,0.5,100,200\n")
    with pytest.raises(checks.Failed, match=r"'ours' ran on \['reference'\]"):
        checks.read_bench(str(fallback))
