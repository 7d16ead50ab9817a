"""How many threads torch gives each operation (its intra-op threads) in a command-line run.

torch starts one thread per core in every process. Processes that share the cores (DDP's
processes on one machine, the trials of a parallel sweep) then run more threads than there
are cores, and since every thread of an operation waits for the slowest one at the
operation's end, a thread that is not running holds all the others back: steps take several
times as long as they would alone. A run therefore takes the CPUs this process may use, divided by the
processes it runs on this machine, unless told a count (``threads=N``).
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from ..utils.checks import check_int

log = logging.getLogger(__name__)

#: The variable OpenMP (and torch, when it starts) reads its thread count from; Lightning's DDP
#: launcher, and joblib's workers, leave a count set in it as it is.
THREADS_VARIABLE = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class ThreadCount:
    """``threads`` per process, where the number came from (printed with it), and the
    ``processes`` the run has on this machine."""

    threads: int
    reason: str
    processes: int = 1


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or a job's share),
    where the platform says, else every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return os.cpu_count() or 1


def devices_per_machine(trainer: Mapping) -> int:
    """The processes a Trainer config starts on each machine: one per device of
    ``trainer.devices`` (an int, a list of ids, ``"0,1"``, ``"auto"``, ``-1``)."""
    devices = trainer.get("devices", 1)
    if OmegaConf.is_list(devices) or isinstance(devices, (list, tuple)):
        return max(1, len(devices))
    if isinstance(devices, str):
        devices = devices.strip()
        if "," in devices:
            return max(1, len([d for d in devices.split(",") if d.strip()]))
        devices = int(devices) if devices.lstrip("-").isdigit() else -1  # "auto": every device there is
    if isinstance(devices, int) and devices > 0:
        return devices
    if str(trainer.get("accelerator", "cpu")) == "cpu":
        return 1  # Lightning runs "auto"/-1 CPU devices as one process
    import torch

    return max(1, torch.cuda.device_count())


def sweep_jobs(launcher: Mapping | None, cpus: int) -> int:
    """The trials a multirun's launcher runs at once on this machine: its ``n_jobs``
    (joblib's; negative counts back from the CPUs, -1 being all of them), else 1."""
    n_jobs = None if launcher is None else launcher.get("n_jobs")
    if not isinstance(n_jobs, int) or n_jobs == 0:
        return 1
    return n_jobs if n_jobs > 0 else max(1, cpus + 1 + n_jobs)


def choose_threads(cfg: DictConfig, launcher: Mapping | None = None, environ: Mapping[str, str] = os.environ,
                   cpus: int | None = None) -> ThreadCount:
    """The intra-op threads of each process of the run ``cfg``, first of:

    - ``cfg.threads`` when set (an int >= 1);
    - ``OMP_NUM_THREADS`` when the environment sets it (as a user, joblib's workers or the
      process that started this one under DDP do);
    - ``SLURM_CPUS_PER_TASK``: the CPUs SLURM gave this task, which is one process;
    - ``cpus`` (default :func:`available_cpus`) divided by the processes on this machine:
      ``LOCAL_WORLD_SIZE`` (set by torchrun) or the devices of ``cfg.trainer``, times the
      trials ``launcher`` (the multirun's launcher config, None outside a multirun) runs at
      once.
    """
    cpus = available_cpus() if cpus is None else cpus
    local = environ.get("LOCAL_WORLD_SIZE", "").strip()
    devices = int(local) if local.isdigit() and int(local) >= 1 else devices_per_machine(cfg.get("trainer") or {})
    jobs = sweep_jobs(launcher, cpus)
    processes = devices * jobs
    setting = cfg.get("threads")
    if setting is not None:
        return ThreadCount(check_int("threads", setting, 1), f"threads={setting}", processes)
    for variable in (THREADS_VARIABLE, "SLURM_CPUS_PER_TASK"):
        value = environ.get(variable, "").strip()
        if value.isdigit() and int(value) >= 1:
            return ThreadCount(int(value), f"{variable}={value}", processes)
    parts = [f"{devices} per run"] * (devices > 1) + [f"{jobs} runs at once"] * (jobs > 1)
    described = f"{processes} processes: {', '.join(parts)}" if parts else "1 process"
    return ThreadCount(max(1, cpus // processes), f"{cpus} CPUs for {described}", processes)


def busy_hint(count: ThreadCount, cpus: int | None = None) -> str:
    """A hint to use fewer threads when other processes keep the CPUs busy: the whole CPUs
    the load average of the last minute (runnable threads; this process's own start-up hardly
    counts) keeps busy leave fewer free CPUs per process of the run than ``count.threads``;
    else "". Only a hint: what
    else runs, and for how long, is out of the run's sight."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on Windows
        return ""
    cpus = available_cpus() if cpus is None else cpus
    busy = math.floor(load)  # whole CPUs other work keeps busy; a fraction is background noise
    suggested = max(1, (cpus - busy) // count.processes)
    if suggested >= count.threads:
        return ""
    return (f". Other processes keep this machine busy (load average {load:.1f} on {cpus} CPUs): "
            f"threads={suggested} may be faster")


def apply_threads(count: ThreadCount, announce: bool = True) -> Callable[[], None]:
    """Set torch's intra-op threads to ``count`` and ``OMP_NUM_THREADS`` with it (which the
    processes the run starts inherit, and which keeps Lightning's DDP launcher from choosing
    its own count); log the count (``announce``), with :func:`busy_hint`. Returns the function
    that puts torch's count and ``OMP_NUM_THREADS`` back as they were, so a next job in this
    process chooses afresh."""
    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(count.threads)
    previous = os.environ.get(THREADS_VARIABLE)
    os.environ[THREADS_VARIABLE] = str(count.threads)
    if announce:
        log.info("torch threads: %d per process (%s; threads=N sets another count)%s", count.threads,
                 count.reason, busy_hint(count))

    def restore() -> None:
        torch.set_num_threads(previous_threads)
        if previous is None:
            os.environ.pop(THREADS_VARIABLE, None)
        else:
            os.environ[THREADS_VARIABLE] = previous

    return restore
