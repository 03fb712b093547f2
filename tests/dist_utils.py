"""Run a function in two real processes (gloo on the CPU) and collect what each returns.

Tests use this to check that a gathered loss gives, in 2 processes, the same value and
gradient as 1 process on the concatenated batch. The function must live at module level
(it is pickled by reference) and return something ``torch.save`` can write.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_cpu_launcher(
    port: int | None = 0, *, machines: int = 1, machine_rank: int = 0, quiet: bool = False
) -> list[str]:
    """``accelerate launch --cpu`` of two processes in all, every setting spelled out so that no accelerate config
    file of the machine's is read: on ``machines`` machines (127.0.0.1 plays each) with ``--machine_rank``; the
    processes meet on ``port`` (0: a free one; None: no ``--main_process_port``, the launcher picks)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", *(["--quiet"] if quiet else []), "--cpu"]
    command += ["--num_processes", "2", "--num_machines", str(machines), "--mixed_precision", "no"]
    command += ["--dynamo_backend", "no"]
    if machines > 1:
        command += ["--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1"]
    if port is not None:
        command += ["--main_process_port", str(port or _free_port())]
    return command


# Dozens of tests start two processes each. Spawned, every process imports torch and sslkit again (about 2.5
# CPU-seconds); a fork server imports them once and forks each process from itself: a process that has run no
# torch op and started no threads, so the fork is safe (forking the test's own process, threads and all, is not).
PRELOADED = ["torch", "torch.distributed", "pytest", "sslkit.methods"]


def _worker(rank: int, world: int, port: int, out_dir: str, fn, args, environ: dict) -> None:
    os.environ.clear()  # the test's environment, as a spawned process would have it (not the fork server's)
    os.environ.update(environ)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_in_processes(fn, *args, world: int = 2) -> list:
    """Call ``fn(rank, world, *args)`` in ``world`` processes; return their results by rank."""
    multiprocessing.set_forkserver_preload(PRELOADED)  # read when the server starts: the first call
    with tempfile.TemporaryDirectory() as out_dir:
        arguments = (world, _free_port(), out_dir, fn, args, dict(os.environ))
        mp.start_processes(_worker, args=arguments, nprocs=world, join=True, start_method="forkserver")
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def run_as_ranks(
    command: list[str], *, env: dict, cwd: Path, world: int = 2, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``command`` as the ``world`` processes of one run, each told its rank in the environment as srun and torchrun
    tell theirs: what ``accelerate launch --cpu --num_processes N`` starts, without the launcher's own interpreter
    and imports (about 4 CPU-seconds). Where a test is about the run and not the launcher, this is the cheaper start.
    The result holds the ranks' outputs in rank order and the first nonzero exit status (0 where all are 0)."""
    shared = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
    shared["MASTER_PORT"] = str(_free_port())
    # Files, not pipes: a rank blocked on a full pipe that nobody reads would hold the other in a collective.
    with tempfile.TemporaryDirectory() as folder:
        files = [(Path(folder, f"{rank}.out"), Path(folder, f"{rank}.err")) for rank in range(world)]
        processes = []
        for rank, (out, err) in enumerate(files):
            with out.open("w") as stdout, err.open("w") as stderr:
                rank_env = {**env, **shared, "RANK": str(rank), "LOCAL_RANK": str(rank)}
                processes.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, cwd=cwd, env=rank_env))
        codes = [process.wait(timeout=timeout) for process in processes]
        stdout, stderr = ("".join(pair[i].read_text() for pair in files) for i in (0, 1))
    status = next((code for code in codes if code != 0), 0)
    return subprocess.CompletedProcess(command, status, stdout, stderr)
