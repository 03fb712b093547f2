"""StopSignals' agreement in two real processes: a signal is never lost, whenever it is handled."""

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
