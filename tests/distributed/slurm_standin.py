"""A stand-in for SLURM's ``sbatch``, ``srun`` and ``sacct`` on one machine, enough for submitit.

``python slurm_standin.py TOOL ARGS``; :func:`install` writes the three commands into a folder
to put first on PATH. ``sbatch FILE`` prints ``Submitted batch job ID`` and runs the batch
script in the background at once (every job of an array in turn; no queue). The script's
``srun`` starts ``--nodes x --ntasks-per-node`` tasks on this machine with the variables that
SLURM gives each task, which Lightning's SLURMEnvironment and submitit read. ``sacct`` lists
the jobs that have ended.

Each job gets an id whose last four digits put Lightning's port (15000 + those digits) on a
port that is free here. No scheduling, no limits, no signals: it checks what a job sees, not
what a cluster does to it.
"""
from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"


def install(folder: Path) -> Path:
    """``folder`` with ``sbatch``, ``srun`` and ``sacct`` that run this file; returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    for tool in ("sbatch", "srun", "sacct"):
        path = folder / tool
        path.write_text(f'#!/bin/sh\nSTANDIN_SLURM_JOBS="{folder / "jobs"}" exec "{sys.executable}" '
                        f'"{Path(__file__).resolve()}" {tool} "$@"\n')
        path.chmod(0o755)
    return folder


def job_id_for_a_free_port() -> str:
    """A job id ``9dddd`` such that 15000 + dddd (Lightning's port for it) is free here."""
    while True:
        digits = random.randrange(10000)
        with socket.socket() as s:
            try:
                s.bind((HOST, 15000 + digits))
            except OSError:
                continue
        return f"9{digits:04d}"


def sbatch(script: str) -> None:
    """Start the batch script in the background (each job of an array in turn) and print its
    id at once, as sbatch does: submitit moves the job's pickle into place only then."""
    text = Path(script).read_text()
    flags = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", text, flags=re.M))
    array = re.fullmatch(r"0-(\d+)(%\d+)?", flags.get("array", ""))
    first = job_id_for_a_free_port()
    jobs = [first] if array is None else [f"{first}_{a}" for a in range(int(array.group(1)) + 1)]
    # stdout not inherited: submitit reads sbatch's output to its end
    subprocess.Popen([sys.executable, __file__, "run-jobs", script, *jobs], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"Submitted batch job {first}")


def run_jobs(script: str, jobs: list[str]) -> None:
    """Run the batch script once per job (``ID`` or ``ARRAYID_INDEX``) with SLURM's job
    variables; each job is written to the jobs file when it has ended."""
    flags = dict(re.findall(r"^#SBATCH --([\w-]+)=?(\S*)", Path(script).read_text(), flags=re.M))
    nodes, per_node = int(flags.get("nodes", 1)), int(flags.get("ntasks-per-node", 1))
    env = {**os.environ, "SLURM_JOB_NAME": flags.get("job-name", "sbatch"), "SLURM_NNODES": str(nodes),
           "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS_PER_NODE": str(per_node),
           "SLURM_NTASKS": str(nodes * per_node), "SLURM_JOB_NODELIST": HOST, "SLURM_NODELIST": HOST}
    for job in jobs:
        if "_" in job:  # a job of an array: a job id of its own besides the array's id and its index
            array_id, index = job.split("_")
            own = {"SLURM_JOB_ID": array_id if index == "0" else job_id_for_a_free_port(),
                   "SLURM_ARRAY_JOB_ID": array_id, "SLURM_ARRAY_TASK_ID": index}
        else:
            own = {"SLURM_JOB_ID": job}
        subprocess.run(["bash", script], env={**env, **own}, check=False)
        with open(os.environ["STANDIN_SLURM_JOBS"], "a") as ended:
            ended.write(job + "\n")


def srun(args: list[str]) -> int:
    """``srun [--unbuffered] [--output PATTERN] [--error PATTERN] COMMAND ...``: one process per
    task, outputs to the patterns' files (%A %a %j %t filled in). When a task fails the others
    are ended (they would wait for it in a collective); the first failure's status."""
    outputs = {}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            outputs[flag] = args.pop(0)
    env = os.environ
    per_node, tasks = int(env["SLURM_NTASKS_PER_NODE"]), int(env["SLURM_NTASKS"])
    processes = []
    for rank in range(tasks):
        fill = {"%A": env.get("SLURM_ARRAY_JOB_ID", ""), "%a": env.get("SLURM_ARRAY_TASK_ID", ""),
                "%j": env["SLURM_JOB_ID"], "%t": str(rank)}
        files = {}
        for flag, pattern in outputs.items():
            for key, value in fill.items():
                pattern = pattern.replace(key, value)
            Path(pattern).parent.mkdir(parents=True, exist_ok=True)
            files[flag] = open(pattern, "a")
        processes.append(subprocess.Popen(args, stdout=files.get("--output"), stderr=files.get("--error"), env={
            **env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % per_node),
            "SLURM_NODEID": str(rank // per_node), "SLURM_STEP_NUM_TASKS": str(tasks)}))
        for f in files.values():
            f.close()
    while any(p.poll() is None for p in processes) and not any(p.returncode for p in processes):
        time.sleep(0.2)
    for p in processes:
        if p.poll() is None:
            p.kill()
            p.wait()
    return next((p.returncode for p in processes if p.returncode), 0)


def sacct(args: list[str]) -> None:
    """The jobs asked for (``-j ID``) that have ended, as COMPLETED (submitit then reads their
    result files, or the logs of a task that wrote none); the others are not listed yet."""
    asked = {job for flag, job in zip(args, args[1:]) if flag == "-j"}
    jobs = Path(os.environ["STANDIN_SLURM_JOBS"])
    print("JobID|State|NodeList")
    for job in (jobs.read_text().split() if jobs.exists() else []):
        if job.split("_")[0] in asked:
            print(f"{job}|COMPLETED|{HOST}")


if __name__ == "__main__":
    tool, rest = sys.argv[1], sys.argv[2:]
    if tool == "sbatch":
        sbatch(rest[-1])
    elif tool == "run-jobs":
        run_jobs(rest[0], rest[1:])
    elif tool == "srun":
        sys.exit(srun(rest))
    else:
        sacct(rest)
