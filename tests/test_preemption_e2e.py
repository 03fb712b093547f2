"""Preemption as a cluster does it: real signals to real training processes, one and two of them.

A stop signal (``train.stop_signals``) makes every process finish its step, agree on one step,
save a checkpoint and exit with status 75; ``run.resume=auto`` then continues, and the final
backbone is bit-identical to that of a run nobody interrupted. The two-process runs are started
as a SLURM job step starts them (one process per rank, the rank in the environment), so that
each process's own exit status is seen, and the signal is sent to one process only: it may
reach one process first. Started by a launcher (``accelerate launch``, torchrun), the signal goes
to the launcher alone, as ``docker stop`` and Kubernetes send it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_utils import _free_port, accelerate_cpu_launcher
from safetensors.torch import load_file
from test_pretrain_e2e import PRETRAIN, QUICKSTART, TINY, env, pretrain_here

REQUEUE = 75
# 22 batches of 64 an epoch, two epochs: the signal lands mid-epoch, and no periodic checkpoint helps.
COMMON = [*TINY, "train.epochs=2", "eval.linear_epochs=0"]
# Twelve epochs (264 steps of a few milliseconds) for two processes: the test's own polling shares two cores with the
# run's processes and another test, and may lag the run by seconds; at four epochs the run once ended first.
TWO_PROCESS_EPOCHS = "train.epochs=12"


def start(
    tmp_path: Path, name: str, *overrides: str, world: int = 1, launcher: list[str] | None = None
) -> list[subprocess.Popen]:
    """``world`` processes of one run, each told its rank in the environment (as srun and a batch script do);
    with a ``launcher``, the one process that starts the run's processes."""
    command = [*(launcher or [sys.executable]), *PRETRAIN, str(QUICKSTART), f"run.output_dir={tmp_path}"]
    command += [f"run.name={name}", *COMMON, *overrides]
    # Only the ranks, as torchrun and srun set them: on a machine without a GPU sslkit tells Accelerate they are CPU
    # processes of one run (without, each would train a run of its own into the same directory).
    ranks = [{}]
    if world > 1:
        port = str(_free_port())
        shared = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
        shared.update(MASTER_PORT=port)
        ranks = [dict(shared, RANK=str(r), LOCAL_RANK=str(r)) for r in range(world)]
    return [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env(), **rank},
            preexec_fn=default_stop_signals,
        )
        for rank in ranks
    ]


def default_stop_signals() -> None:
    """A job step starts with the signals' default dispositions: not with an ignored SIGTERM that this test's
    process may have inherited or been left with, which a child would inherit in turn."""
    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


def finish(processes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each process's exit status, stdout and stderr."""
    outputs = [p.communicate(timeout=240) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs)]


def wait_for_step(run: Path, step: int, processes: list[subprocess.Popen], timeout: float = 180) -> None:
    metrics, deadline = run / "metrics.jsonl", time.time() + timeout
    while time.time() < deadline:
        logged = metrics.read_text().count('"loss"') if metrics.is_file() else 0
        if logged >= step:
            return
        assert all(p.poll() is None for p in processes), "the run ended before the signal"
        time.sleep(0.02)
    raise AssertionError(f"step {step} was not logged in {timeout} s")


def assert_same_backbone(a: Path, b: Path) -> None:
    first, second = load_file(a / "backbone.safetensors"), load_file(b / "backbone.safetensors")
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def assert_preempted(results: list[tuple[int, str, str]], run: Path) -> int:
    """Every process exited 75 after saving one checkpoint; the main process said so in one line. Returns its step."""
    codes = [code for code, *_ in results]
    assert codes == [REQUEUE] * len(results), (codes, [err[-2000:] for *_, err in results])
    # The last line: on a loaded machine gloo may first warn of a connection it retried.
    lines = [line for line in results[0][2].splitlines() if line.strip()][-1:]
    assert lines and "Traceback" not in results[0][2], results[0][2]
    return assert_saved_once(lines[0], run)


def assert_saved_once(stderr: str, run: Path) -> int:
    """The main process said in one line that the run stopped and saved a checkpoint, the newest, unfinished run's
    (none half-written); returns its step."""
    lines = [line for line in stderr.splitlines() if line.startswith("stopped by SIGTERM after step ")]
    assert len(lines) == 1 and "run.resume=auto" in lines[0], stderr[-3000:]
    saved = sorted((run / "checkpoints").glob("step-*"))
    assert saved and not list((run / "checkpoints").glob(".tmp-*")) and not (run / "backbone.safetensors").exists()
    step = json.loads((saved[-1] / "progress.json").read_text())["step"]
    assert f"after step {step}:" in lines[0]
    return step


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_the_requeued_run_is_bit_identical(tmp_path):
    # The runs nobody signals go through the command's main() in this process; the preempted one is a process.
    straight = pretrain_here(tmp_path, "run.name=straight", *COMMON[len(TINY) :])
    assert straight.returncode == 0, straight.stderr[-2000:]

    [process] = start(tmp_path, "preempted")
    wait_for_step(tmp_path / "preempted", 3, [process])
    for _ in range(4):  # a cluster may repeat its notice: signals while the checkpoint is written change nothing
        process.send_signal(signal.SIGTERM)
        time.sleep(0.02)
    step = assert_preempted(finish([process]), tmp_path / "preempted")
    assert 3 <= step < 44  # mid-run: two epochs of 22 steps

    resumed = pretrain_here(tmp_path, "run.name=preempted", "run.resume=auto", *COMMON[len(TINY) :])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {tmp_path / 'preempted' / 'checkpoints'}" in resumed.stdout
    assert_same_backbone(tmp_path / "straight", tmp_path / "preempted")


@pytest.mark.slow
def test_a_run_whose_stderr_is_gone_still_saves_and_exits_75(tmp_path):
    """As a run started by ``accelerate launch``, which reads stderr through a pipe and dies of SIGUSR1 at once:
    the stop line has no reader, the run has saved, and its exit status says so."""
    [process] = start(tmp_path, "orphaned")
    wait_for_step(tmp_path / "orphaned", 3, [process])
    process.stderr.close()  # the pipe's reader is gone
    process.send_signal(signal.SIGUSR1)
    assert process.wait(timeout=120) == REQUEUE
    assert sorted((tmp_path / "orphaned" / "checkpoints").glob("step-*"))


@pytest.mark.slow
def test_a_signal_to_one_of_two_processes_stops_both_after_one_step_and_the_resumed_run_is_bit_identical(tmp_path):
    straight = finish(start(tmp_path, "straight", TWO_PROCESS_EPOCHS, world=2))
    assert [code for code, *_ in straight] == [0, 0], [err[-2000:] for *_, err in straight]
    assert "2 processes on cpu" in straight[0][1].replace("\n", " "), straight[0][1][:2000]  # one run, not two

    processes = start(tmp_path, "preempted", TWO_PROCESS_EPOCHS, world=2)
    wait_for_step(tmp_path / "preempted", 3, processes)
    processes[1].send_signal(signal.SIGTERM)  # rank 1 only: rank 0 learns of it when they agree after a step
    assert_preempted(finish(processes), tmp_path / "preempted")

    resumed = finish(start(tmp_path, "preempted", TWO_PROCESS_EPOCHS, "run.resume=auto", world=2))
    assert [code for code, *_ in resumed] == [0, 0], [err[-2000:] for *_, err in resumed]
    assert_same_backbone(tmp_path / "straight", tmp_path / "preempted")


def launcher_of_two(name: str) -> list[str]:
    """``accelerate launch --cpu --num_processes 2`` or ``torchrun --nproc_per_node 2``, on a free port."""
    if name == "accelerate":
        return accelerate_cpu_launcher()
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "launcher_statuses"),
    [
        # Dies of it without passing it on (its processes learn of it as it exits): the status of a process killed by
        # SIGTERM, -15 as Python reports it, or 128 + 15 where the launcher was in a handler that exits with it.
        ("accelerate", {-signal.SIGTERM, 128 + signal.SIGTERM}),
        ("torchrun", {1}),  # passes it on, waits for both, and raises the signal as an error
    ],
)
def test_a_signal_to_the_launcher_alone_stops_both_processes_after_one_step(tmp_path, launcher, launcher_statuses):
    """The stop and its checkpoint; that a run stopped so resumes bit-identically is the test above's (the processes
    do the same whoever signalled them) and tools/bench/preempt.py's, which resumes every launcher's runs."""
    [process] = start(tmp_path, "preempted", TWO_PROCESS_EPOCHS, launcher=launcher_of_two(launcher))
    wait_for_step(tmp_path / "preempted", 3, [process])
    process.send_signal(signal.SIGTERM)  # the launcher only, as docker stop, Kubernetes and kill PID do
    # Its output ends when every process it started has ended: they inherited its stdout and stderr.
    [(code, _, stderr)] = finish([process])
    assert code in launcher_statuses, stderr[-3000:]
    step = assert_saved_once(stderr, tmp_path / "preempted")
    assert 3 <= step < 264


def test_stop_signals_are_checked_by_name_in_one_line(tmp_path, capsys):
    from sslkit.cli.pretrain import main

    assert main([str(QUICKSTART), f"run.output_dir={tmp_path}", "train.stop_signals=[SIGTERM,SIGNOPE]"]) == 2
    err = capsys.readouterr().err
    assert "train.stop_signals has 'SIGNOPE'" in err and "SIGUSR1" in err and len(err.strip().splitlines()) == 1
    assert main([str(QUICKSTART), f"run.output_dir={tmp_path}", "train.stop_signals=[KILL]"]) == 2
    assert "'KILL'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_the_loader_workers_leave_stop_signals_to_the_main_process():
    from sslkit.loop.build import ignore_signals

    previous = signal.getsignal(signal.SIGUSR2)
    try:
        ignore_signals(("USR2",), 0)
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR2)  # would end the process with the default action
    finally:
        signal.signal(signal.SIGUSR2, previous)


EXIT_WITH_WORKERS = """
import functools, sys
from torch.utils.data import DataLoader
from sslkit.loop.build import ignore_signals, stop_workers_before_exit
loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True,
                    worker_init_fn=functools.partial(ignore_signals, ("SIGTERM", "SIGUSR1")))
batches = iter(loader)
next(batches)
stop_workers_before_exit(loader)
"""


@pytest.mark.slow
def test_a_process_whose_persistent_workers_ignore_sigterm_still_exits():
    """multiprocessing stops daemonic children at exit with SIGTERM, which the workers ignore: without
    stop_workers_before_exit this process waits for them forever."""
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_WORKERS], timeout=120, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
