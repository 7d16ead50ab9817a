"""Composing the real configs in-process, and running the CLI in a subprocess."""
import os
import subprocess
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from lightning_rnn.cli import config_dir

REPO = Path(__file__).resolve().parents[2]
CONF = config_dir()

#: Overrides that keep any run tiny: no kernel build, no logger, no callbacks.
QUICK = ["model.rnn.backend=reference", "logger=none", "callbacks=none"]


def compose_config(output_dir, overrides=()):
    """The composed ``config.yaml`` with ``overrides``, writing under ``output_dir``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"output_dir={output_dir}", *overrides])


def run_cli(args, cwd, timeout=120, env=None):
    """``python -m lightning_rnn ARGS`` in ``cwd``; the completed process (checked)."""
    process_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
        "HYDRA_FULL_ERROR": "1",
        **(env or {}),
    }
    result = subprocess.run([sys.executable, "-m", "lightning_rnn", *args], cwd=cwd, env=process_env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result
