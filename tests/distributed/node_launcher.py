"""Starting ``python -m lightning_rnn`` as the nodes of a multi-node run on this machine.

Each "node" is one process that finds its place in the run from Lightning's environment
variables (:func:`lightning_env`, read by its LightningEnvironment), as a cluster's launcher
sets them. They rendezvous over TCP on 127.0.0.1 with gloo.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: Variables by which Lightning (or torch.distributed) would place a process in some other
#: run: the test's own process may itself run under SLURM or torchrun.
PLACEMENT_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK",
                       "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the first node binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env() -> dict[str, str]:
    """This process's environment without any placement in another run, with the
    repository and this folder (the recorder callback) importable, logging offline."""
    env = {k: v for k, v in os.environ.items() if k not in PLACEMENT_VARIABLES and not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="disabled", HYDRA_FULL_ERROR="1")
    return env


def lightning_env(node_rank: int, port: int) -> dict[str, str]:
    """Lightning's variables for the one process of node ``node_rank`` (one device per node).
    LOCAL_RANK set says the process was started from outside, as on a cluster; the world size
    is not read from the environment but is ``trainer.num_nodes x trainer.devices``."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(node_rank), "LOCAL_RANK": "0"}


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """``python -m lightning_rnn ARGS`` as one process; its output (it must succeed)."""
    return run_nodes(args, cwd, [env or {}])[0]


def run_nodes(args: list[str], cwd: Path, node_envs: list[dict[str, str]]) -> list[str]:
    """One ``python -m lightning_rnn ARGS`` per entry of ``node_envs`` (its variables on top of
    :func:`base_env`), all at once; their outputs once all have exited 0. When one fails, the
    others are ended at once rather than left waiting for it in a collective."""
    logs = [cwd / f"node{i}.out" for i in range(len(node_envs))]
    processes = []
    for log, extra in zip(logs, node_envs):
        with log.open("w") as out:  # a file, not a pipe: a pipe nobody reads would block a talkative node
            processes.append(subprocess.Popen([sys.executable, "-m", "lightning_rnn", *args], cwd=cwd,
                                              env={**base_env(), **extra}, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))  # its own group: ended with its children
    ended = set()  # the nodes ended here, reported after the one that failed
    try:
        while any(p.poll() is None for p in processes):
            if any(p.returncode not in (None, 0) for p in processes):
                break
            time.sleep(0.2)
    finally:
        for i, p in enumerate(processes):
            if p.poll() is None:
                ended.add(i)
            try:
                os.killpg(p.pid, signal.SIGKILL)  # also what it started and left behind
            except ProcessLookupError:
                pass
            p.wait()
    outputs = [log.read_text() for log in logs]
    for i in sorted(range(len(processes)), key=lambda i: i in ended):
        assert processes[i].returncode == 0, f"node {i} exited with {processes[i].returncode}\n{outputs[i][-3000:]}"
    return outputs
