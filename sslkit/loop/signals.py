"""Preemption: on a stop signal every process finishes its step, all agree on one step, save and exit.

A cluster announces the end of a job with a signal before it kills it: SLURM's
``#SBATCH --signal=USR1@120`` (or ``B:TERM``), a spot instance's SIGTERM. Without a handler the
signal kills the run and everything since the last periodic checkpoint is lost. With
``train.stop_signals`` caught, the handler only records the signal; the loop asks
:meth:`StopSignals.agreed` after every optimizer step, and the processes all-reduce what they
received, so that all of them stop after the same step even when the signal reached one first
(a process that stopped alone would leave the others waiting in the next step's all-reduce).
The run then saves a checkpoint and raises :class:`sslkit.errors.Preempted`; the command exits with
:data:`sslkit.errors.REQUEUE_EXIT_STATUS` (75), and ``run.resume=auto`` continues exactly where it stopped.

A second signal while the checkpoint is written changes nothing: the handler only records it
(and once the run has stopped, the command line ignores the signals until the process exits),
and the checkpoint itself is written into a hidden directory renamed once complete
(:mod:`sslkit.loop.run_directory`), so even a SIGKILL mid-save leaves the previous checkpoint whole.

A launcher that does not pass a signal on (Accelerate's, for a CPU or one-process run) dies of it, and
its training processes would run on unseen, or in a container be killed as it ends. :func:`stop_with_parent`
has the kernel turn the launcher's exit into a stop signal for each of them (:mod:`sslkit.loop.launch`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def signal_of(name: str) -> signal.Signals:
    """``"SIGTERM"`` or ``"TERM"`` (any case) -> ``signal.SIGTERM``."""
    upper = name.upper()
    return signal.Signals[upper if upper.startswith("SIG") else "SIG" + upper]


def stop_with_parent(sig: signal.Signals, parent: int) -> bool:
    """Have the kernel send ``sig`` to this process when its parent ``parent`` (a pid) exits; whether it will.

    Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``), through ctypes: one system call, which no
    library sslkit depends on offers. It is armed after this process started, so a parent that exited
    meanwhile would never send it: then ``sig`` is sent now. Strictly, the kernel sends it when the
    thread that started this process ends: launchers start their processes from their main thread.
    The setting is not inherited by this process's children (DataLoader workers); calling again
    replaces it. Other systems have no such signal (False).
    """
    if not sys.platform.startswith("linux"):
        return False
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # adopted by another process already: the parent is gone
        os.kill(os.getpid(), sig)
    return True


class StopSignals:
    """Catches ``names`` while it is entered; :meth:`agreed` says whether every process should stop now.

    Used as a context manager around the loop, in the main thread (where Python runs signal
    handlers); the previous handlers come back on exit. ``ignore_after_stop`` is for a process that exits
    once the run has stopped (the command line): stopped by a signal or by Ctrl-C, it leaves ``names``
    ignored instead, so that a repeated notice, or its launcher's exit (:func:`stop_with_parent`; Ctrl-C
    reaches the launcher too), cannot turn its exit status (75, 130) and last line into a death by signal.
    A program that goes on after a stopped run (a notebook, a sweep in one process) gets its own handlers
    back either way.
    """

    def __init__(self, names: list[str], ignore_after_stop: bool = False) -> None:
        self.signals = [signal_of(name) for name in names]
        self.ignore_after_stop = ignore_after_stop
        self.received = 0  # 1 + the index in self.signals of the first signal received; 0: none
        self.previous: dict[signal.Signals, object] = {}
        self.group = None
        if dist.is_available() and dist.is_initialized() and self.signals:
            # A CPU tensor on a gloo group: asking never waits for an accelerator's queue. A NCCL job gets
            # a gloo group of its own (made by every process, collectively, here).
            self.group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # Python runs handlers in the main thread only: a run trained from another keeps defaults
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        stopped_and_exiting = self.ignore_after_stop and (bool(self.received) or exc_type is KeyboardInterrupt)
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_IGN if stopped_and_exiting else handler)
        self.previous.clear()

    def _record(self, signum: int, frame) -> None:
        # Only a flag: the step in progress, and a checkpoint being written, carry on untouched.
        if not self.received:
            self.received = 1 + self.signals.index(signal.Signals(signum))

    def agreed(self) -> bool:
        """Whether any process has received a stop signal (every process calls it after the same step)."""
        if not self.signals:
            return False
        if not (dist.is_available() and dist.is_initialized()):
            return bool(self.received)
        flag = torch.tensor([self.received], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        # The answer is what every process contributed before the all-reduce. A signal handled while it ran
        # (a process waits there for the others most of the time) is not in it: ``received`` keeps it for the
        # next step's agreement instead of being overwritten with the agreed 0.
        agreed = int(flag.item())
        if agreed:
            self.received = agreed  # the same signal named on every process
        return bool(agreed)

    @property
    def name(self) -> str:
        """The signal that stopped the run (after :meth:`agreed` returned True)."""
        return self.signals[self.received - 1].name
