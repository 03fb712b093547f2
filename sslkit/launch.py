"""Make ``accelerate launch --cpu --num_processes N script.py`` start N processes.

Accelerate (1.x) runs ``--cpu`` jobs through its "simple launcher", which starts N processes
only through ``mpirun`` with a host file; without one it silently starts a single process
(``num_processes == 1`` inside the script). On a laptop or a CI box without MPI, that turns
a two-process test of gathered losses into a one-process run that proves nothing.

:func:`relaunch_cpu_processes` notices that case (the launcher asked for several CPU processes,
``MASTER_ADDR`` is set, but no ``WORLD_SIZE`` reached us) and starts the N processes itself with
``torch.distributed.run`` (torchrun), which Accelerate then sees as a multi-CPU (gloo) run.
"""

from __future__ import annotations

import os
import subprocess
import sys


def _requested_processes(parent_cmdline: list[str]) -> int:
    """``--num_processes N`` (or ``=N``) from ``accelerate launch``'s own command line, else 1."""
    for i, arg in enumerate(parent_cmdline):
        if arg in ("--num_processes", "--num-processes") and i + 1 < len(parent_cmdline):
            return int(parent_cmdline[i + 1])
        if arg.startswith(("--num_processes=", "--num-processes=")):
            return int(arg.split("=", 1)[1])
    return 1


def relaunch_cpu_processes() -> int | None:
    """If started by ``accelerate launch --cpu --num_processes N>1`` as one process, run N and return their exit code."""
    env = os.environ
    if env.get("ACCELERATE_USE_CPU", "").lower() not in ("1", "true") or "WORLD_SIZE" in env or "MASTER_ADDR" not in env:
        return None
    try:
        import psutil  # a dependency of accelerate

        parent = psutil.Process(os.getppid()).cmdline()
    except Exception:  # no parent information: behave as accelerate does
        return None
    if not any("accelerate" in part or part == "launch" for part in parent[:4]):  # `accelerate launch`, `python -m accelerate.commands.launch`
        return None
    processes = _requested_processes(parent)
    if processes <= 1:
        return None
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", env["MASTER_ADDR"], "--master_port", env.get("MASTER_PORT", "29500"), *sys.argv]
    return subprocess.call(command, env={**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1")})
