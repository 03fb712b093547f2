"""StopSignals: a signal is never lost, whenever it is handled, and only a process on its way out ignores it after;
a launcher's exit is a stop signal for the process it started."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist
from dist_utils import run_in_processes

from sslkit.loop.signals import PR_SET_PDEATHSIG, StopSignals, stop_with_parent


def _signal_during_the_agreement(rank: int, world: int) -> list[bool]:
    """Rank 1 receives SIGTERM while the first agreement's all-reduce runs (after its flag was sent):
    that step is not stopped, and the next one is, on both processes."""
    all_reduce = dist.all_reduce

    def all_reduce_then_signal(*args, **kwargs):
        all_reduce(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, before agreed() reads the result

    answers = []
    with StopSignals(["SIGTERM"]) as stop:
        if rank == 1:
            dist.all_reduce = all_reduce_then_signal
        answers.append(stop.agreed())
        dist.all_reduce = all_reduce
        answers.append(stop.agreed())
    return answers


@pytest.mark.slow
def test_a_signal_handled_during_the_all_reduce_stops_every_process_after_the_next_step():
    assert run_in_processes(_signal_during_the_agreement) == [[False, True], [False, True]]


@pytest.mark.parametrize("ignore_after_stop", [False, True])
def test_after_a_stop_the_signal_is_ignored_only_by_a_process_on_its_way_out(ignore_after_stop):
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with StopSignals(["SIGUSR2"], ignore_after_stop=ignore_after_stop) as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.agreed() and stop.name == "SIGUSR2"
        assert signal.getsignal(signal.SIGUSR2) is (signal.SIG_IGN if ignore_after_stop else previous)
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_without_a_stop_the_previous_handlers_come_back():
    previous = signal.getsignal(signal.SIGUSR2)
    with StopSignals(["SIGUSR2"], ignore_after_stop=True) as stop:
        assert signal.getsignal(signal.SIGUSR2) is not previous and not stop.agreed()
    assert signal.getsignal(signal.SIGUSR2) is previous


def test_ctrl_c_leaves_the_stop_signals_ignored_by_a_process_on_its_way_out():
    """Ctrl-C reaches the launcher too, which then exits: that must not kill the process printing its last line."""
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with pytest.raises(KeyboardInterrupt), StopSignals(["SIGUSR2"], ignore_after_stop=True):
            raise KeyboardInterrupt
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_parent_already_gone_when_the_notice_is_armed_sends_it_at_once():
    received = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    try:
        assert stop_with_parent(signal.SIGUSR2, parent=os.getppid() + 1)  # not our parent: it is gone
        assert received == [signal.SIGUSR2]
    finally:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)  # this test process keeps no notice
        signal.signal(signal.SIGUSR2, previous)


# A launcher that starts a training process, waits until it is ready (a line on its stderr), and dies without a word.
LAUNCHER = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stderr=subprocess.PIPE, text=True)
child.stderr.readline()
"""
TRAINING = """
import os, signal, sys, time
from sslkit.loop.signals import stop_with_parent
signal.signal(signal.SIGUSR2, lambda signum, frame: (print("stop notice", flush=True), sys.exit(75)))
stop_with_parent(signal.SIGUSR2, os.getppid())
print("ready", file=sys.stderr, flush=True)
time.sleep(30)
print("no notice", flush=True)
"""


@pytest.mark.slow
def test_the_launchers_exit_is_a_stop_signal_for_the_process_it_started():
    """The training process outlives its launcher and writes on the stdout it inherited from it, so the
    launcher's output ends when the training process does."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER, TRAINING], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "stop notice\n", done
