"""A non-editable install carries the configs: the CLI works from any directory."""
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from cli_helpers import REPO


def run(args, cwd, env=None):
    result = subprocess.run(args, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, f"{args}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return result


def copy_source(tmp_path, folders=("lightning_rnn", "conf", "recipes")):
    """The project's sources in tmp_path/source: builds never write build/ into the working tree."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "_conf", "*.so", "build")
    for name in folders:
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    if not (source / "README.md").exists():
        (source / "README.md").write_text("lightning_rnn\n")
    return source


def test_wheel_ships_configs_and_recipes(tmp_path):
    source = copy_source(tmp_path)
    # what a CLI run started inside recipes/ (= conf/experiment/) leaves there: not shipped
    for stray in ("outputs/2026-01-01/00-00-00/.hydra/config.yaml", "multirun/2026-01-01/0/config.yaml"):
        (source / "recipes" / stray).parent.mkdir(parents=True)
        (source / "recipes" / stray).write_text("seed: 1\n")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
         str(source)], tmp_path)
    (wheel,) = (tmp_path / "dist").glob("lightning_rnn-*.whl")
    site = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], tmp_path)
    assert (site / "lightning_rnn" / "_conf" / "experiment" / "char_shakespeare.yaml").is_file()
    shipped = {p.relative_to(site / "lightning_rnn" / "_conf").parts[:2] for p in (site / "lightning_rnn" / "_conf").rglob("*")}
    assert ("experiment", "outputs") not in shipped and ("experiment", "multirun") not in shipped

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(site), "HYDRA_FULL_ERROR": "1"}
    where = run([sys.executable, "-c", "import lightning_rnn.cli as c; print(c.config_dir())"], elsewhere, env)
    assert where.stdout.strip() == str(site / "lightning_rnn" / "_conf")
    job = run([sys.executable, "-m", "lightning_rnn", "experiment=char_shakespeare", "--cfg", "job"], elsewhere, env)
    assert "_target_: lightning_rnn.modules.CharLanguageModel" in job.stdout
    assert "corpus: tiny_shakespeare" in job.stdout


def test_sdist_ships_tests_license_configs_and_kernel_sources(tmp_path):
    source = copy_source(tmp_path, folders=("lightning_rnn", "conf", "recipes", "tests"))
    build = "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"
    name = run([sys.executable, "-c", build], source).stdout.strip().splitlines()[-1]
    with tarfile.open(source / "dist" / name) as sdist:
        files = {Path(*Path(member).parts[1:]).as_posix() for member in sdist.getnames()}
    for shipped in ("LICENSE", "README.md", "tests/conftest.py", "tests/cli/test_packaging.py",
                    "conf/config.yaml", "recipes/char_shakespeare.yaml", "lightning_rnn/kernels/csrc"):
        assert shipped in files or any(f.startswith(shipped + "/") for f in files), shipped
    assert not any("__pycache__" in f or f.endswith(".so") for f in files)
