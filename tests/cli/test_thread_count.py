"""The CLI's choice of torch's intra-op threads: CPUs / processes on the machine, overrides,
one line saying so. The machine's own CPU count never enters: every test gives its own."""
import logging
import os

import pytest
import torch
from cli_helpers import QUICK, compose_config
from omegaconf import OmegaConf

from lightning_rnn.cli import run
from lightning_rnn.tasks import threads
from lightning_rnn.tasks.threads import ThreadCount, apply_threads, busy_hint, choose_threads

#: Variables that choose a count themselves; each test starts without them.
VARIABLES = ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    threads_before = torch.get_num_threads()
    yield
    torch.set_num_threads(threads_before)


def config(threads=None, **trainer):
    return OmegaConf.create({"threads": threads, "trainer": {"accelerator": "cpu", "devices": 1, **trainer}})


@pytest.mark.parametrize("devices, expected", [(1, 8), (2, 4), (3, 2), ([0, 1], 4), ("0,1,2,3", 2), ("2", 4),
                                               ("auto", 8), (-1, 8)])
def test_the_cpus_are_shared_by_the_runs_processes(devices, expected):
    count = choose_threads(config(devices=devices), cpus=8)
    assert count.threads == expected
    assert count.reason.startswith("8 CPUs for ")


def test_the_trials_a_joblib_sweep_runs_at_once_share_them_too():
    assert choose_threads(config(devices=2), launcher={"n_jobs": 2}, cpus=8) == \
        ThreadCount(2, "8 CPUs for 4 processes: 2 per run, 2 runs at once", 4)
    assert choose_threads(config(), launcher={"n_jobs": -1}, cpus=8).threads == 1  # joblib's -1: one job per CPU
    assert choose_threads(config(), launcher={"n_jobs": -3}, cpus=8).threads == 1  # 6 jobs
    assert choose_threads(config(), launcher={"n_jobs": 3}, cpus=2).threads == 1  # never 0
    assert choose_threads(config(), launcher={}, cpus=8).threads == 8  # a launcher that runs one job at a time


def test_a_setting_or_the_environment_decides_before_the_cpus():
    environ = {"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "5"}
    assert choose_threads(config(threads=6), environ=environ, cpus=8) == ThreadCount(6, "threads=6")
    assert choose_threads(config(), environ=environ, cpus=8) == ThreadCount(3, "OMP_NUM_THREADS=3")
    assert choose_threads(config(), environ={"SLURM_CPUS_PER_TASK": "5"}, cpus=8).threads == 5
    assert choose_threads(config(), environ={"LOCAL_WORLD_SIZE": "4"}, cpus=8).threads == 2  # torchrun's processes
    assert choose_threads(config(), environ={"OMP_NUM_THREADS": ""}, cpus=8).threads == 8  # set but empty


@pytest.mark.parametrize("value, error", [(0, ValueError), (-2, ValueError), ("two", TypeError), (1.5, TypeError)])
def test_a_bad_thread_count_is_named(value, error):
    with pytest.raises(error, match=r"threads: expected an int >= 1"):
        choose_threads(config(threads=value), cpus=8)


def test_the_cpus_are_those_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert threads.available_cpus() == 3
    assert choose_threads(config()).threads == 3


def test_a_busy_machine_is_mentioned_with_the_count_that_fits_it(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 1.0, 0.5))
    hint = busy_hint(ThreadCount(2, "2 CPUs for 1 process"), cpus=2)
    assert "load average 2.2 on 2 CPUs" in hint and "threads=1 may be faster" in hint
    assert busy_hint(ThreadCount(1, "threads=1"), cpus=2) == ""  # as few as there can be
    # 14 CPUs left free, for 2 processes
    assert "threads=7 may be faster" in busy_hint(ThreadCount(8, "16 CPUs for 2 processes", 2), cpus=16)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.9, 0.2, 0.1))  # less than a CPU's worth: noise
    assert busy_hint(ThreadCount(2, "2 CPUs for 1 process"), cpus=2) == ""


def test_applying_a_count_sets_torch_and_the_environment_until_restored():
    torch.set_num_threads(3)
    restore = apply_threads(ThreadCount(1, "threads=1"), announce=False)
    assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    restore()
    assert torch.get_num_threads() == 3 and "OMP_NUM_THREADS" not in os.environ


#: What the stand-in task saw: torch's thread count and OMP_NUM_THREADS.
SEEN = []


def record_threads(cfg):
    """A task that records the threads it runs with."""
    SEEN.append((torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")))


def test_the_cli_runs_the_task_with_its_count_and_says_it_once(tmp_path, monkeypatch, caplog):
    """A 2-process run on 4 CPUs: 2 threads each, logged in one line; afterwards the process's
    own count and environment are back (a next job of a multirun chooses afresh)."""
    monkeypatch.setattr(threads, "available_cpus", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    torch.set_num_threads(3)
    cfg = compose_config(tmp_path, ["task._target_=test_thread_count.record_threads", "trainer.devices=2", *QUICK])
    SEEN.clear()
    with caplog.at_level(logging.INFO, logger="lightning_rnn.tasks.threads"):
        run(cfg)
    assert SEEN == [(2, "2")]
    lines = [r.getMessage() for r in caplog.records if r.name == "lightning_rnn.tasks.threads"]
    assert lines == ["torch threads: 2 per process (4 CPUs for 2 processes: 2 per run; threads=N sets another count)"]
    assert torch.get_num_threads() == 3 and "OMP_NUM_THREADS" not in os.environ


def test_a_process_that_ddp_started_says_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = compose_config(tmp_path, ["task._target_=test_thread_count.record_threads", "threads=1", *QUICK])
    with caplog.at_level(logging.INFO, logger="lightning_rnn.tasks.threads"):
        run(cfg)
    assert not [r for r in caplog.records if r.name == "lightning_rnn.tasks.threads"]
