"""Preemption battery: stop signals at random steps of a two-process run, through each launcher, to each target.

A reference run trains without interruption. For each case (a launcher, and who receives the signal)
a run is started, signalled at a random step, and started again with ``run.resume=auto``,
``--rounds`` times, then left to finish; its final backbone must be bit-identical to the reference's.
Rounds alternate SIGTERM and SIGUSR1 (both ``train.stop_signals``). Each round records every exit
status this process can see, the step the run stopped after, and the time from the signal to that
step's checkpoint on disk and to the end of the last process.

Launchers: ``ranks``, one process per rank with the rank in the environment (as srun starts a job
step); ``accelerate``, ``accelerate launch --cpu --num_processes N`` (sslkit starts the N itself, under
torchrun, in the process Accelerate started); ``torchrun``, ``torchrun --nproc_per_node N``.
Targets: ``launcher``, its first process only (``kill PID``, ``timeout``); ``all``, every process
(SLURM's ``--signal`` without ``B:``); ``worker``, one training process, the last rank's.

Container cases (``--containers``) stop the launcher as ``docker stop`` and Kubernetes do: it is the
first process (PID 1) of a PID namespace of its own (``unshare``), it receives SIGTERM (only) from
outside, and ``--grace`` seconds later (docker's default 10) SIGKILL, which ends every process in the
namespace.
``pid1`` starts the launcher itself as PID 1, ``tini`` starts it under tini (``docker run --init``).

This process is a child subreaper (Linux's ``PR_SET_CHILD_SUBREAPER``): a training process whose
launcher died is adopted here, so its exit status is seen; one reaped by a launcher that lives shows
as ``-``. Linux only.

    python tools/bench/preempt.py --rounds 5
    python tools/bench/preempt.py --rounds 2 --quick --cases accelerate:launcher torchrun:launcher
    python tools/bench/preempt.py --rounds 3 --epochs 30 --cases --containers accelerate:pid1 torchrun:pid1
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# The quick start at test size: 22 steps an epoch on 2 cores, evaluation reduced to the final kNN.
TINY = ["model.width=4", "model.projector_hidden=32", "model.projector_out=16", "augment.image_size=8"]
TINY += ["train.batch_size=64", "train.log_every_steps=1", "train.threads=1", "train.knn_every_epochs=0"]
TINY += ["eval.linear_epochs=0", "eval.compare_random_init=false", "eval.compare_raw_pixels=false"]
CASES = ["ranks:all", "ranks:worker"] + [f"{launcher}:{target}" for launcher in ("accelerate", "torchrun")
                                         for target in ("launcher", "all", "worker")]  # fmt: skip
CONTAINER_CASES = ["accelerate:pid1", "accelerate:tini", "torchrun:pid1", "torchrun:tini"]
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
STOP_LINE = re.compile(r"stopped by (SIG\w+) after step (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher_command(launcher: str, processes: int, container: str | None) -> list[str]:
    """The command that starts one run's processes (``ranks``: each process's own, without a launcher)."""
    command = {
        "ranks": [sys.executable],
        "accelerate": [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", str(processes)],
        "torchrun": [str(BIN / "torchrun"), "--nproc_per_node", str(processes), "--master_port", str(free_port())],
    }[launcher]
    if launcher == "accelerate":
        command += ["--main_process_port", str(free_port())]
    if container:  # PID 1 of a new PID namespace, as in a container; tini in front of it for docker's --init
        command = [*(["tini", "--"] if container == "tini" else []), *command]
        command = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", *command]
    return command


def start(out: Path, name: str, launcher: str, processes: int, overrides: list[str], log, container=None):
    """The run's processes as this process started them: the launcher, or (``ranks``) one per rank."""
    script = ["-m", "sslkit.cli.pretrain", "quickstart", f"run.output_dir={out}", f"run.name={name}", *TINY]
    command = [*launcher_command(launcher, processes, container), *script, *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", ACCELERATE_USE_CPU="true")
    ranks = [{}]
    if launcher == "ranks" and processes > 1:
        shared = {"WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1"}
        shared.update(MASTER_PORT=str(free_port()))
        ranks = [dict(shared, RANK=str(r), LOCAL_RANK=str(r)) for r in range(processes)]
    return [
        subprocess.Popen(command, env={**env, **rank}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        for rank in ranks
    ]


def logged_steps(run: Path) -> list[int]:
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return [json.loads(line)["step"] for line in lines if '"loss"' in line and line.endswith("}")]


def step_seconds(run: Path) -> float:
    """The median wall time between consecutive logged steps (every step is logged)."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    return statistics.median(64 / r["images_per_s"] for r in lines)


def role(process: psutil.Process) -> str:
    """``launcher``, ``init`` (tini), ``relaunch`` (sslkit's torchrun under Accelerate), ``rank N``, ``container``
    (unshare, outside the namespace as docker's own processes are: its status is PID 1's) or ``other``."""
    try:
        argv = process.cmdline()
        program, script = Path(argv[0]).name, Path(argv[1]).name if len(argv) > 1 else ""
        if program == "unshare":
            return "container"
        if program == "tini":
            return "init"
        if script in ("accelerate", "torchrun"):
            return "launcher"
        if "sslkit.cli.pretrain" not in argv:
            return "other"
        if any("sslkit.cli.pretrain" in child.cmdline() for child in process.children()):
            return "relaunch"
        return f"rank {process.environ().get('RANK', '0')}"
    except psutil.Error:
        return "other"


def targets(tree: list[psutil.Process], roles: dict[int, str], target: str) -> list[psutil.Process]:
    """Who receives the signal: ``launcher`` is the first process of the job (in a container, PID 1)."""
    if target == "worker":
        return sorted((p for p in tree if roles[p.pid].startswith("rank")), key=lambda p: roles[p.pid])[-1:]
    job = [p for p in tree if roles[p.pid] not in ("container", "other")]
    return job if target == "all" else job[:1]


class Watch:
    """Polls the processes of one run after a signal: exit statuses, end time, new checkpoints' arrival."""

    def __init__(self, run: Path, started: list[subprocess.Popen], tree: list[psutil.Process], sent: float):
        self.run, self.started, self.tree, self.sent = run, {p.pid: p for p in started}, tree, sent
        self.status: dict[int, int | str] = {}
        self.arrived: dict[str, float] = {}

    def poll(self) -> bool:
        """Whether every process has ended."""
        for name in complete_checkpoints(self.run):
            self.arrived.setdefault(name, time.perf_counter() - self.sent)
        for process in self.tree:
            if process.pid not in self.status and (code := self.exit_status(process)) is not None:
                self.status[process.pid] = code
        return len(self.status) == len(self.tree)

    def exit_status(self, process: psutil.Process) -> int | str | None:
        if process.pid in self.started:
            return self.started[process.pid].poll()
        try:  # adopted here after its parent died: ours to reap
            pid, status = os.waitpid(process.pid, os.WNOHANG)
            return os.waitstatus_to_exitcode(status) if pid else None
        except ChildProcessError:  # its own parent reaps it
            try:
                return "-" if process.status() == psutil.STATUS_ZOMBIE else None
            except psutil.NoSuchProcess:
                return "-"


def complete_checkpoints(run: Path) -> list[str]:
    return [p.parent.name for p in (run / "checkpoints").glob("step-*/progress.json")]


def wait_for(run: Path, processes: list[subprocess.Popen], step: int) -> bool:
    """Wait until ``step`` is logged; False when the run ended first."""
    while max(logged_steps(run), default=0) < step:
        if any(p.poll() is not None for p in processes):
            return False
        time.sleep(0.01)
    return True


def preempt_once(run: Path, started, after: int, target: str, sig: signal.Signals, log: Path, grace: float | None):
    """Signal the run ``after`` steps past where it stands; what happened. ``grace``: SIGKILL PID 1 that long after."""
    if not wait_for(run, started, max(logged_steps(run), default=0) + after):
        return {"finished_before_signal": True}
    tree = [psutil.Process(p.pid) for p in started]
    tree += [child for p in tree for child in p.children(recursive=True)]
    roles = {p.pid: role(p) for p in tree}
    at_signal, sent = max(logged_steps(run)), time.perf_counter()
    for process in targets(tree, roles, target):
        process.send_signal(sig)
    watch, killed = Watch(run, started, tree, sent), False
    while not watch.poll():
        if grace is not None and not killed and time.perf_counter() - sent > grace:
            targets(tree, roles, "launcher")[0].send_signal(signal.SIGKILL)  # docker stop's end of the grace
            killed = True
        time.sleep(0.005)
    exit_s = time.perf_counter() - sent
    stop = STOP_LINE.findall(log.read_text())
    saved = f"step-{int(stop[-1][1]):08d}" if stop else None
    return {
        "signal": sig.name,
        "step_at_signal": at_signal,
        "stopped_after": int(stop[-1][1]) if stop else None,
        "saved_s": watch.arrived.get(saved) if saved else None,
        "exit_s": exit_s,
        "killed_after_grace": killed,
        "statuses": {roles[pid]: code for pid, code in watch.status.items() if roles[pid] != "other"},
    }


def run_case(out: Path, case: str, rounds: int, processes: int, settings: list[str], seed: int, grace) -> dict:
    """``rounds`` signals to one run of ``case`` (``launcher:target``), each resumed; the final backbone."""
    launcher, target = case.split(":")
    container = target if target in ("pid1", "tini") else None
    name, total = case.replace(":", "-"), max(logged_steps(out / "reference"))
    pick, records, console = random.Random(seed), [], Console()
    for index in range(rounds):
        log = out / f"{name}-{index}.log"
        with log.open("w") as stream:
            resume = ["run.resume=auto"] if index else []
            started = start(out, name, launcher, processes, [*settings, *resume], stream, container)
            after = pick.randint(1, max(1, total // (rounds + 1)))
            stop_at, sig = ("launcher", signal.SIGTERM) if container else (target, SIGNALS[index % 2])
            record = preempt_once(out / name, started, after, stop_at, sig, log, grace)
        records.append(record)
        console.print(f"{case} round {index + 1}: {record}", highlight=False)
        if record.get("finished_before_signal"):
            break
    with (out / f"{name}-rest.log").open("w") as stream:
        rest = start(out, name, launcher, processes, [*settings, "run.resume=auto"], stream)
        finished = [p.wait() for p in rest]
    return {"case": case, "rounds": records, "finished": finished, "bit_identical": same_backbone(out, name)}


def same_backbone(out: Path, name: str) -> bool:
    final = out / name / "backbone.safetensors"
    if not final.is_file():
        return False
    a, b = load_file(out / "reference" / "backbone.safetensors"), load_file(final)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def summary(result: dict) -> dict:
    """One table row's figures."""
    stopped = [r for r in result["rounds"] if "signal" in r]
    saved = [r["saved_s"] for r in stopped if r["saved_s"] is not None]
    exits = [r["exit_s"] for r in stopped]
    statuses: dict[str, set] = {}
    for r in stopped:
        for who, code in r["statuses"].items():
            statuses.setdefault("rank" if who.startswith("rank") else who, set()).add(code)
    return {
        "signals": len(stopped),
        "saved": sum(r["stopped_after"] is not None and r["saved_s"] is not None for r in stopped),
        "statuses": {who: sorted(map(str, codes)) for who, codes in statuses.items()},
        "saved_s": (statistics.median(saved), max(saved)) if saved else None,
        "exit_s": (statistics.median(exits), max(exits)) if exits else None,
    }


def print_table(results: list[dict], processes: int, step_s: float) -> None:
    table = Table(title=f"preemption battery: {processes} processes, step {step_s * 1000:.0f} ms (median)")
    for column in ("launcher: signalled", "signals", "saved at one agreed step", "exit statuses seen"):
        table.add_column(column)
    for column in ("bit-identical", "signal to saved (median / max)", "signal to exit (median / max)"):
        table.add_column(column)
    for result in results:
        row = summary(result)
        seen = "; ".join(f"{who} {'/'.join(codes)}" for who, codes in sorted(row["statuses"].items()))
        table.add_row(
            result["case"],
            str(row["signals"]),
            f"{row['saved']} of {row['signals']}",
            seen,
            "yes" if result["bit_identical"] else "NO",
            f"{row['saved_s'][0]:.2f} / {row['saved_s'][1]:.2f} s" if row["saved_s"] else "-",
            f"{row['exit_s'][0]:.2f} / {row['exit_s'][1]:.2f} s" if row["exit_s"] else "-",
        )
    Console(width=200).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="signals sent per case, each followed by resume=auto")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="22 steps an epoch")
    parser.add_argument("--cases", nargs="*", default=CASES, help="launcher:target, of " + " ".join(CASES))
    parser.add_argument(
        "--containers", nargs="*", default=[], help="launcher:pid1|tini, of " + " ".join(CONTAINER_CASES)
    )
    parser.add_argument("--grace", type=float, default=10.0, help="container cases: SIGKILL this long after SIGTERM")
    parser.add_argument("--seed", type=int, default=0, help="seeds when the signals are sent")
    parser.add_argument("--quick", action="store_true", help="one epoch (a smoke run)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit("this battery needs Linux (a child subreaper sees the exit status of a launcher's orphans)")
    if args.containers and not (shutil.which("unshare") and shutil.which("tini")):
        sys.exit("the container cases need unshare (util-linux) and tini")
    settings = [f"train.epochs={1 if args.quick else args.epochs}"]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        with (out / "reference.log").open("w") as log:
            reference = start(out, "reference", "ranks", args.processes, settings, log)
            assert [p.wait() for p in reference] == [0] * args.processes, (out / "reference.log").read_text()[-2000:]
        step_s = step_seconds(out / "reference")
        results = [run_case(out, case, args.rounds, args.processes, settings, args.seed, None) for case in args.cases]
        results += [run_case(out, case, args.rounds, args.processes, settings, args.seed, args.grace)
                    for case in args.containers]  # fmt: skip
    print_table(results, args.processes, step_s)
    if args.out:
        machine = {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
        args.out.write_text(json.dumps({"machine": machine, "step_s": step_s, "results": results}, indent=2))


if __name__ == "__main__":
    main()
