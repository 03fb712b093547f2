"""Make ``accelerate launch --cpu --num_processes N -m sslkit.cli.pretrain`` start N processes.

Accelerate (1.x) runs ``--cpu`` jobs through its "simple launcher", which starts N processes
only through ``mpirun`` with a host file; without one it silently starts a single process
(``num_processes == 1`` inside the script). On a laptop or a CI box without MPI, that turns
a two-process test of gathered losses into a one-process run that proves nothing.

:func:`relaunch_cpu_processes` notices that case (the launcher asked for several CPU processes,
``MASTER_ADDR`` is set, but no ``WORLD_SIZE`` reached us) and starts the N processes itself with
``torch.distributed.run`` (torchrun, called in this process so that its failure reports do not
follow a worker's one-line error), which Accelerate then sees as a multi-CPU (gloo) run. On one
machine, without ``--main_process_port``, the processes meet on a free port (torchrun's standalone
rendezvous), not Accelerate's fixed 29500, so that several runs can train side by side. Across
machines (``--num_machines M --machine_rank R --main_process_ip ...`` on each), every machine
starts its N / M processes as node R of M.

:func:`cpu_threads` undoes a second launcher default: on a machine without a GPU and with no
``--num_processes``, ``accelerate launch`` sets ``OMP_NUM_THREADS=1`` (its rule that spreads
the cores over the processes only runs when it counts at least one process, and it counts the
GPUs: none). ``accelerate launch -m sslkit.cli.pretrain recipes/fashion_mnist_simclr.yaml`` then
trained far slower than ``sslkit-pretrain ...``: torch used one core of the machine's
several.

:func:`stop_with_launcher` makes a stop signal sent to the launcher alone (``docker stop``, ``kill``,
``timeout``) stop the run as one sent to every process does (:mod:`sslkit.loop.signals`). Accelerate's
simple launcher (``--cpu``, or one process) neither catches nor passes on SIGTERM or SIGUSR1: it dies
at once, and its training processes would train on unseen. torchrun passes SIGTERM, SIGINT, SIGHUP and
SIGQUIT on and waits for its workers (30 s, then SIGKILL), but dies of SIGUSR1 (``--signals_to_handle``
adds it). So every training process that a launcher started has the kernel send it its first stop
signal when that launcher exits; the relaunch below (torchrun in the process that Accelerate started)
receives SIGTERM then, which torchrun passes on, and passes SIGUSR1 and SIGUSR2 on as torchrun passes
SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys

from sslkit.errors import REQUEUE_EXIT_STATUS
from sslkit.loop.signals import signal_of, stop_with_parent


def _option_given(cmdline: list[str], *names: str) -> bool:
    """Whether any of ``names`` appears on a command line, as ``--name value`` or ``--name=value``."""
    return any(arg in names or arg.split("=", 1)[0] in names for arg in cmdline)


def _accelerate_launcher():
    """The parent process (a ``psutil.Process``) when it is ``accelerate launch``, else None.

    Both ``accelerate launch ...`` and ``python -m accelerate.commands.launch ...`` count; None
    also when the parent cannot be read (another OS, no permission).
    """
    try:
        import psutil  # a dependency of accelerate

        parent = psutil.Process(os.getppid())
        if any("accelerate" in part or part == "launch" for part in parent.cmdline()[:4]):
            return parent
    except Exception:
        pass
    return None


def _launcher_pid() -> int | None:
    """The pid of the launcher that started this process and waits for it, else None.

    Accelerate's launcher (its ``--cpu`` or one-process launcher starts the script itself) or torch's
    elastic agent (torchrun, ``accelerate launch --multi_gpu``, the relaunch below), which names its run
    in its workers' environment. A process started otherwise (by hand, srun, a notebook) has no launcher:
    a parent that exits without waiting for it does not stop it.
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return os.getppid()
    launcher = _accelerate_launcher()
    return launcher.pid if launcher is not None else None


def stop_with_launcher(stop_signals: list[str]) -> None:
    """Have this training process receive the first of ``stop_signals`` (SIGTERM if none) when its launcher exits.

    A launcher that died of a stop signal it did not pass on then stops the run as if it had: every
    process saves after one agreed step and exits with 75. With ``train.stop_signals=[]`` the process
    ends with its launcher. Nothing happens for a process that no launcher started, or off Linux.
    """
    launcher = _launcher_pid()
    if launcher is not None:
        stop_with_parent(signal_of(stop_signals[0]) if stop_signals else signal.SIGTERM, launcher)


def _launcher_int(parent_cmdline: list[str], name: str, default: int) -> int:
    """``--name N`` (or ``--name=N``, or hyphenated) from ``accelerate launch``'s command line, else ``default``."""
    spellings = (f"--{name}", f"--{name.replace('_', '-')}")
    for i, arg in enumerate(parent_cmdline):
        if arg in spellings and i + 1 < len(parent_cmdline):
            return int(parent_cmdline[i + 1])
        if arg.startswith(tuple(f"{s}=" for s in spellings)):
            return int(arg.split("=", 1)[1])
    return default


def _own_command_line() -> list[str]:
    """This process's command line as torchrun takes it: ``-m MODULE ARGS`` when it was started with
    ``python -m`` (``accelerate launch -m``), else the script and its arguments."""
    spec = sys.modules["__main__"].__spec__  # None for a script, a console script included
    return ["-m", spec.name, *sys.argv[1:]] if spec is not None else sys.argv


def relaunch_cpu_processes() -> int | None:
    """If ``accelerate launch --cpu --num_processes N>1`` started one process, run N; return their exit code."""
    env = os.environ
    if (
        env.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true")
        or "WORLD_SIZE" in env
        or "MASTER_ADDR" not in env
    ):
        return None
    launcher = _accelerate_launcher()
    if launcher is None:  # no parent information, or not accelerate's: behave as accelerate does
        return None
    cmdline = launcher.cmdline()
    processes, machines = _launcher_int(cmdline, "num_processes", 1), _launcher_int(cmdline, "num_machines", 1)
    if processes <= 1:
        return None
    # --num_processes counts every machine's processes, as for GPUs; each machine starts its share.
    per_machine, machine_rank = max(1, processes // machines), _launcher_int(cmdline, "machine_rank", 0)
    # torchrun in this process rather than as a command: its own failure report (a ChildFailedError
    # or SignalException traceback after a worker's one-line error or a Ctrl-C) would follow every
    # user mistake. The workers have said what went wrong; this returns the exit code of the first
    # that failed (2 for a user's mistake, 130 for Ctrl-C) and prints nothing of its own.
    import logging

    from torch.distributed import DistError
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    for name in list(logging.root.manager.loggerDict):  # each module's logger has a level of its own
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Accelerate's launcher dies of a stop signal without passing it on: its exit is one for this process,
    # as SIGTERM, which torchrun's agent passes on to the workers; SIGUSR1 and SIGUSR2 it passes on as well.
    stop_with_parent(signal.SIGTERM, launcher.pid)
    if os.name == "posix":  # stop signals (SLURM's) that torchrun's agent does not pass on by default
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, _pass_on_to_workers)
    if machines == 1 and not _option_given(cmdline, "--main_process_port"):
        # Accelerate's default port, 29500, is every run's: two runs side by side on one machine (an experiment's
        # --jobs 2, two SLURM tasks on one node) would meet there. torchrun's standalone rendezvous takes a free one.
        rendezvous = ["--standalone"]
    else:
        rendezvous = ["--nnodes", str(machines), "--node_rank", str(machine_rank), "--master_addr", env["MASTER_ADDR"]]
        rendezvous += ["--master_port", env.get("MASTER_PORT", "29500")]
    args = torchrun.parse_args(["--nproc_per_node", str(per_machine), *rendezvous, *_own_command_line()])
    try:
        torchrun.run(args)
    except DistError as error:  # the rendezvous: a port in use, an address that does not answer, a rank twice
        from sslkit.console import print_user_error

        print_user_error(
            f"machine {machine_rank} of {machines} could not join the run at {env['MASTER_ADDR']}:"
            f"{env.get('MASTER_PORT', '29500')} ({str(error).strip().splitlines()[0]}); give every machine the same "
            f"--main_process_ip and --main_process_port, a free port, and its own --machine_rank (0 to {machines - 1})"
        )
        return 2
    except ChildFailedError as failed:
        return next((f.exitcode for _, f in sorted(failed.failures.items()) if f.exitcode), 1)
    except KeyboardInterrupt:  # Ctrl-C reached the workers too: they printed one line
        return 130
    except SignalException as stopped:  # passed on to the workers, which save and stop (train.stop_signals)
        return 130 if stopped.sigval == signal.SIGINT else REQUEUE_EXIT_STATUS
    return 0


def _pass_on_to_workers(signum: int, frame) -> None:
    """A signal handler that has torchrun's agent pass ``signum`` on to its workers and wait for them.

    What torchrun's own handler does for SIGTERM: the agent catches the exception, sends the signal to
    each worker and waits for it (30 s, then SIGKILL).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException

    raise SignalException(f"process {os.getpid()} got signal {signum}", sigval=signal.Signals(signum))


def _launcher_pinned_one_thread() -> bool:
    """Whether ``OMP_NUM_THREADS=1`` came from ``accelerate launch``'s default, not from the user."""
    env = os.environ
    if env.get("OMP_NUM_THREADS") != "1" or "ACCELERATE_MIXED_PRECISION" not in env:
        return False
    launcher = _accelerate_launcher()
    if launcher is None:  # started by torchrun (see relaunch_cpu_processes), by hand, or unreadable
        return False
    try:
        if "OMP_NUM_THREADS" in launcher.environ():
            return False  # the user set it for the launcher
    except Exception:  # its environment cannot be read: keep what we were given
        return False
    return not _option_given(launcher.cmdline(), "--num_cpu_threads_per_process", "--num-cpu-threads-per-process")


def cpu_threads(requested: int | None) -> tuple[int, str]:
    """Set torch's CPU threads for this process; return the count and why, for the log.

    ``requested`` (``train.threads``) wins. Otherwise, when ``accelerate launch`` pinned one
    thread by its own default (see the module docstring), use the cores this process may run
    on divided by the processes on this machine; otherwise leave torch's choice
    (``OMP_NUM_THREADS`` if set, else the physical cores).
    """
    import torch

    if requested:
        torch.set_num_threads(requested)
        return requested, "train.threads"
    if _launcher_pinned_one_thread():
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        torch.set_num_threads(threads)
        return threads, "cores per process; accelerate launch had set OMP_NUM_THREADS=1"
    return torch.get_num_threads(), "torch default"
