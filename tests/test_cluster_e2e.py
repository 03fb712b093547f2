"""sslkit as a cluster runs it, on this machine: two "machines" on 127.0.0.1, and a run resumed on
another number of processes.

Two machines of one process each (two ``accelerate launch --num_machines 2`` commands, machine
ranks 0 and 1, gloo) log the same losses, write the same checkpoint and evaluate the same as one
machine with two processes. Resumed 2 -> 1 and 1 -> 2 processes with the same global batch,
weights, optimizer state, step, schedule and the order of global batches continue; what changes
is per process (each process's random stream, and BatchNorm statistics of per-process batches).
With those two made equal (augmentation that draws nothing visible, BatchNorm over the global
batch), a run resumed on another process count ends where the uninterrupted run ends, up to the
order of floating-point sums; a batch order off by one batch would not (0.18 apart, not 3e-5).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from dist_utils import _free_port, accelerate_cpu_launcher
from safetensors.torch import load_file
from test_preemption_e2e import COMMON, finish, start
from test_pretrain_e2e import QUICKSTART, TINY, env, pretrain_here

# Views that need no random numbers to be equal on every process count; BatchNorm over the global batch.
SAME_EVERYWHERE = ["augment.crop_scale=[1,1]", "augment.crop_ratio=[1,1]", "augment.jitter_p=0"]
SAME_EVERYWHERE += ["model.sync_batchnorm=true", "train.epochs=1", "train.checkpoint_every_steps=5"]
SAME_EVERYWHERE += ["train.keep_checkpoints=10", "train.knn_every_epochs=0"]


def trained(tmp_path, name: str, world: int, *overrides: str) -> dict[str, torch.Tensor]:
    """A run of ``world`` processes; one process is the command's main() in this process."""
    if world == 1:
        result = pretrain_here(tmp_path, f"run.name={name}", *COMMON[len(TINY) :], *SAME_EVERYWHERE, *overrides)
        assert result.returncode == 0, result.stderr[-2000:]
    else:
        results = finish(start(tmp_path, name, *SAME_EVERYWHERE, *overrides, world=world))
        assert [code for code, *_ in results] == [0] * world, [err[-2000:] for *_, err in results]
    return load_file(tmp_path / name / "backbone.safetensors")


def launch(tmp_path, name: str, port: int, machines: int, machine_rank: int = 0) -> subprocess.Popen:
    """``accelerate launch --cpu`` of two processes in all, on ``machines`` machines (this one plays each)."""
    command = accelerate_cpu_launcher(port, machines=machines, machine_rank=machine_rank, quiet=True)
    command += ["-m", "sslkit.cli.pretrain", str(QUICKSTART)]
    command += [f"run.output_dir={tmp_path}", f"run.name={name}", *COMMON, *SAME_EVERYWHERE]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), start_new_session=True
    )


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory) -> Path:
    """Two processes on one machine: the reference of the two-machine run and of the 2 -> 1 resume."""
    out = tmp_path_factory.mktemp("one-machine")
    [result] = finish([launch(out, "one-machine", _free_port(), 1)])
    assert result[0] == 0, result[2][-2000:]
    (out / "stdout.txt").write_text(result[1])
    return out / "one-machine"


@pytest.mark.slow
def test_two_processes_with_global_batchnorm_say_so_and_log_each_step_once(one_machine):
    said = (one_machine.parent / "stdout.txt").read_text()
    assert "2 processes" in said and "BatchNorm over the global batch (model.sync_batchnorm)" in said
    lines = (one_machine / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if '"loss"' in line]
    assert steps == list(range(1, 23)), steps  # written once, by the main process


@pytest.fixture(scope="module")
def resumed_on_one(tmp_path_factory, one_machine) -> Path:
    """The two-process run resumed on one process at step 5 of 22, mid-epoch; it checkpoints every 5 steps
    on its own, so the 1 -> 2 resume below starts from its step 10."""
    out = tmp_path_factory.mktemp("resumed-on-one")
    trained(out, "resumed", 1, f"run.resume={one_machine / 'checkpoints' / 'step-00000005'}")
    return out / "resumed"


def at_step(run: Path, step: int) -> dict[str, torch.Tensor]:
    """The weights of ``run``'s checkpoint at ``step``: the backbone, the projector and BatchNorm's statistics."""
    return load_file(run / "checkpoints" / f"step-{step:08d}" / "model.safetensors")


@pytest.mark.slow
def test_a_run_resumed_on_one_process_trains_as_the_two_process_run(one_machine, resumed_on_one):
    # The resumed run must skip exactly the global batches already trained on. Compared five steps after the resume.
    assert_close_weights(at_step(one_machine, 10), at_step(resumed_on_one, 10))


@pytest.mark.slow
def test_a_run_resumed_on_two_processes_trains_as_the_one_process_run(tmp_path, resumed_on_one):
    trained(tmp_path, "resumed", 2, f"run.resume={resumed_on_one / 'checkpoints' / 'step-00000010'}")
    assert_close_weights(at_step(resumed_on_one, 15), at_step(tmp_path / "resumed", 15))


def assert_close_weights(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> None:
    """Equal up to the order of float32 sums, which differs between one process and two.

    Runs stopped at the same step, five steps after the resume. Measured on this test's runs (seeds 0 and 1,
    2 -> 1 and 1 -> 2): at most 4.8e-7 apart in any weight or statistic, five steps after the resume; the gap
    grows with every step (up to 2.9e-5 at the end of the epoch, 17 steps after it; two runs whose sums differ
    from the first step are 3e-5 apart at step 10). The tolerance is 20 times the five-step gap; five steps of
    training move every tensor by 6.5e-4 to 0.29, so a run that trained one batch twice or skipped one is far
    outside it.
    """
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-5, msg=key)


@pytest.mark.slow
def test_two_machines_of_one_process_train_as_one_machine_of_two(tmp_path, one_machine):
    port = _free_port()
    machines = finish([launch(tmp_path, "two-machines", port, 2, rank) for rank in (0, 1)])
    assert [code for code, *_ in machines] == [0, 0], [err[-2000:] for *_, err in machines]
    assert "2 processes" in machines[0][1]

    def losses(run: Path) -> list[float]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"loss"' in line]

    two = tmp_path / "two-machines"
    assert losses(two) == losses(one_machine) and len(losses(one_machine)) == 22
    weights = "checkpoints/step-00000010/model.safetensors"
    assert (two / weights).read_bytes() == (one_machine / weights).read_bytes()
    results = [json.loads((run / "results.json").read_text())["results"] for run in (two, one_machine)]
    assert results[0] == results[1]


@pytest.mark.slow
def test_two_machines_with_one_rank_is_one_line(tmp_path):
    port = _free_port()
    first = launch(tmp_path, "first", port, 2, 0)
    try:
        time.sleep(3)  # the first machine 0 holds the port, waiting for machine 1
        [second] = finish([launch(tmp_path, "second", port, 2, 0)])
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    code, _, err = second
    assert code != 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "machine 0 of 2 could not join the run at 127.0.0.1" in lines[0], err
    assert "its own --machine_rank (0 to 1)" in lines[0]


def test_a_process_count_that_does_not_divide_the_global_batch_is_one_line():
    from sslkit.config import load_config
    from sslkit.datasets import build_splits
    from sslkit.errors import UserError
    from sslkit.loop.build import check_training_set

    cfg = load_config("quickstart", ["train.batch_size=64"])
    splits = build_splits(cfg)
    assert check_training_set(cfg, splits, 2) == 32
    with pytest.raises(UserError, match=r"processes \(3\); launch a number of processes that divides it"):
        check_training_set(cfg, splits, 3)
