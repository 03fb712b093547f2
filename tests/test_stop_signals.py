"""StopSignals: a signal is never lost, whenever it is handled, and only a process on its way out ignores it after."""

from __future__ import annotations

import os
import signal

import pytest
import torch.distributed as dist
from dist_utils import run_in_processes

from sslkit.loop.signals import StopSignals


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
