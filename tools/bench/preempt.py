"""Preemption battery: random stop signals during a two-process run, each followed by ``run.resume=auto``.

A reference run trains without interruption. The preempted run is started, signalled with
SIGTERM (``train.stop_signals``) at a random step, and started again with ``run.resume=auto``,
``--rounds`` times, then left to finish; its final backbone must be bit-identical to the
reference's. Each round records the time from the signal to the checkpoint (the step in
progress, the agreement between processes, the save) and to the exit of every process (the
interpreter's own teardown added: seconds for torch alone on a busy 2-core machine), against
the run's step time.

The processes are started as a SLURM job step starts them (one per rank, the rank in the
environment), so each one's exit status (75: requeue) is seen. ``--target rank1`` signals one
process only (the signal may reach one first); ``all`` signals every process, as a cluster does.

    python tools/bench/preempt.py --rounds 5
    python tools/bench/preempt.py --rounds 2 --processes 1 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
# The quick start at test size: 22 steps an epoch on 2 cores, evaluation reduced to the final kNN.
TINY = ["model.width=4", "model.projector_hidden=32", "model.projector_out=16", "augment.image_size=8"]
TINY += ["train.batch_size=64", "train.log_every_steps=1", "train.threads=1", "train.knn_every_epochs=0"]
TINY += ["eval.linear_epochs=0", "eval.compare_random_init=false", "eval.compare_raw_pixels=false"]
REQUEUE = 75


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out: Path, name: str, processes: int, overrides: list[str]) -> list[subprocess.Popen]:
    """One process per rank, each told its rank in the environment (as srun and a batch script do)."""
    command = [sys.executable, "-m", "sslkit.cli.pretrain", "quickstart", f"run.output_dir={out}", f"run.name={name}"]
    base = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    ranks = [{}]
    if processes > 1:
        shared = {"WORLD_SIZE": str(processes), "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1"}
        shared.update(MASTER_PORT=str(free_port()), ACCELERATE_USE_CPU="true")
        ranks = [dict(shared, RANK=str(r), LOCAL_RANK=str(r)) for r in range(processes)]
    return [
        subprocess.Popen(
            [*command, *TINY, *overrides],
            env={**base, **rank},
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
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


def preempt_once(run: Path, processes: list[subprocess.Popen], after: int, target: str) -> dict:
    """Signal the run ``after`` steps past where it stands; returns what happened."""
    first = max(logged_steps(run), default=0)
    while max(logged_steps(run), default=0) < first + after:
        if any(p.poll() is not None for p in processes):
            return {"finished_before_signal": True}
        time.sleep(0.01)
    signalled = processes if target == "all" else processes[-1:]
    before = set(complete_checkpoints(run))
    sent = time.perf_counter()
    for process in signalled:
        process.send_signal(signal.SIGTERM)
    saved_s = None
    while any(p.poll() is None for p in processes):
        if saved_s is None and set(complete_checkpoints(run)) - before:
            saved_s = time.perf_counter() - sent
        time.sleep(0.005)
    exit_s = time.perf_counter() - sent
    codes = [p.returncode for p in processes]
    errors = [p.stderr.read() for p in processes]
    last_line = errors[0].strip().splitlines()[-1:] if errors[0] else []
    return {"codes": codes, "saved_s": saved_s, "exit_s": exit_s, "stderr": last_line}


def complete_checkpoints(run: Path) -> list[str]:
    return [p.parent.name for p in (run / "checkpoints").glob("step-*/progress.json")]


def battery(out: Path, rounds: int, processes: int, epochs: int, target: str, seed: int) -> dict:
    settings = [f"train.epochs={epochs}"]
    console = Console()
    reference = start(out, "reference", processes, settings)
    assert [p.wait() for p in reference] == [0] * processes, reference[0].stderr.read()[-2000:]
    total = max(logged_steps(out / "reference"))
    step_s = step_seconds(out / "reference")
    pick, records, first = random.Random(seed), [], True
    for round_index in range(rounds):
        processes_now = start(out, "preempted", processes, [*settings, *([] if first else ["run.resume=auto"])])
        first = False
        record = preempt_once(out / "preempted", processes_now, pick.randint(1, max(1, total // (rounds + 1))), target)
        record["round"] = round_index + 1
        record["stopped_at"] = max(logged_steps(out / "preempted"), default=0)
        records.append(record)
        console.print(f"round {round_index + 1}: {record}", highlight=False)
        if record.get("finished_before_signal"):
            break
    rest = start(out, "preempted", processes, [*settings, "run.resume=auto"])
    assert [p.wait() for p in rest] == [0] * processes, rest[0].stderr.read()[-2000:]
    a, b = load_file(out / "reference" / "backbone.safetensors"), load_file(out / "preempted" / "backbone.safetensors")
    identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    stopped = [r for r in records if "codes" in r]
    return {
        "processes": processes,
        "target": target,
        "total_steps": total,
        "step_s": step_s,
        "rounds": records,
        "preempted": len(stopped),
        "all_exited_75": all(r["codes"] == [REQUEUE] * processes for r in stopped),
        "bit_identical": identical,
        "saved_s_median": statistics.median(r["saved_s"] for r in stopped if r["saved_s"]) if stopped else None,
        "exit_s_median": statistics.median(r["exit_s"] for r in stopped) if stopped else None,
        "exit_s_max": max(r["exit_s"] for r in stopped) if stopped else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="signals sent, each followed by run.resume=auto")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4, help="22 steps an epoch")
    parser.add_argument("--target", choices=["rank1", "all"], default="rank1", help="who gets the signal")
    parser.add_argument("--seed", type=int, default=0, help="seeds when the signals are sent")
    parser.add_argument("--quick", action="store_true", help="one epoch (a smoke run)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        result = battery(
            Path(scratch), args.rounds, args.processes, 1 if args.quick else args.epochs, args.target, args.seed
        )
    result["machine"] = platform.processor() or platform.machine()
    table = Table(title=f"preemption battery: {args.processes} processes, SIGTERM to {args.target}")
    columns = ("signals", "exit 75 on every process", "bit-identical", "signal to checkpoint saved (median)")
    for column in (*columns, "signal to exit (median / max)", "step"):
        table.add_column(column)
    table.add_row(
        f"{result['preempted']}",
        "yes" if result["all_exited_75"] else "no",
        "yes" if result["bit_identical"] else "NO",
        f"{result['saved_s_median']:.2f} s" if result["saved_s_median"] else "-",
        f"{result['exit_s_median']:.2f} s / {result['exit_s_max']:.2f} s" if result["preempted"] else "-",
        f"{result['step_s'] * 1000:.0f} ms",
    )
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
