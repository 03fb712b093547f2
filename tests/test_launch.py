"""The process count is read from accelerate launch's own command line."""

from sslkit.loop.launch import _launcher_int


def test_launcher_options_in_every_spelling():
    assert _launcher_int(["accelerate", "launch", "--cpu", "--num_processes", "2", "x.py"], "num_processes", 1) == 2
    command = ["python", "-m", "accelerate.commands.launch", "--num_processes=3", "--machine-rank", "1", "x.py"]
    assert _launcher_int(command, "num_processes", 1) == 3
    assert _launcher_int(command, "machine_rank", 0) == 1
    assert _launcher_int(["accelerate", "launch", "x.py"], "num_processes", 1) == 1


# --------------------------------------------------------------------------- CPU threads
# `accelerate launch` on a machine with no GPU and no --num_processes sets OMP_NUM_THREADS=1
# (sslkit/loop/launch.py); cpu_threads() gives the process its cores back, unless the user chose.

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from subprocess import PIPE  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from dist_utils import accelerate_cpu_launcher  # noqa: E402

from sslkit.loop.launch import _option_given, cpu_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]


def test_option_given_forms():
    assert _option_given(
        ["accelerate", "launch", "--num_cpu_threads_per_process", "1", "x.py"], "--num_cpu_threads_per_process"
    )
    assert _option_given(
        ["accelerate", "launch", "--num_cpu_threads_per_process=1", "x.py"], "--num_cpu_threads_per_process"
    )
    assert not _option_given(["accelerate", "launch", "--cpu", "x.py"], "--num_cpu_threads_per_process")


def test_requested_threads_win():
    before = torch.get_num_threads()
    try:
        assert cpu_threads(1) == (1, "train.threads")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _threads_under_accelerate(tmp_path: Path, *launcher_args: str, omp: str | None = None) -> tuple[int, str]:
    script = tmp_path / "threads.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from sslkit.loop.launch import cpu_threads\n"
        "n, why = cpu_threads(None)\n"
        "print(f'THREADS {n} {why}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    result = subprocess.run(
        [*ACCELERATE, "--cpu", *launcher_args, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("THREADS"))
    _, count, why = line.split(" ", 2)
    return int(count), why


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a GPU accelerate counts one process and spreads the cores itself"
)
def test_accelerate_launch_gets_the_cores_back(tmp_path):
    count, why = _threads_under_accelerate(tmp_path)
    assert count == len(os.sched_getaffinity(0)), why
    # Accelerate gives each process OMP_NUM_THREADS = physical cores / processes: 1 where the cores are two
    # hyperthreads of one (sslkit then takes them back), every core where they are physical (a 2-core AMD EPYC:
    # torch's default, OMP_NUM_THREADS=2, is then right).
    assert why in ("torch default", "cores per process; accelerate launch had set OMP_NUM_THREADS=1"), why


@pytest.mark.slow
def test_users_one_thread_is_kept(tmp_path):
    assert _threads_under_accelerate(tmp_path, omp="1") == (1, "torch default")
    assert _threads_under_accelerate(tmp_path, "--num_cpu_threads_per_process", "1") == (1, "torch default")


@pytest.mark.slow
def test_after_accelerate_config_default_the_launcher_starts_sslkit_quietly(tmp_path):
    """README: after ``accelerate config default``, ``accelerate launch --num_cpu_threads_per_process N -m
    sslkit.cli.pretrain`` lists no defaulted settings (without them, Accelerate lists four before every run)."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    launch = (*ACCELERATE, "-m", "sslkit.cli.pretrain", "--help")
    unconfigured = run(*launch)
    assert "were not passed to `accelerate launch`" in unconfigured.stderr  # what the README says it does
    assert run(sys.executable, "-m", "accelerate.commands.accelerate_cli", "config", "default").returncode == 0
    configured = run(*ACCELERATE, "--num_cpu_threads_per_process", "2", *launch[len(ACCELERATE) :])
    assert configured.returncode == 0 and configured.stdout.startswith("usage: sslkit-pretrain"), configured.stderr
    assert "were not passed" not in configured.stderr, configured.stderr


RANKS = """
import os, sys, time
from sslkit.loop.launch import relaunch_cpu_processes
if (code := relaunch_cpu_processes()) is not None:  # accelerate's --cpu launcher alone starts one process
    sys.exit(code)
import torch
from accelerate import PartialState
PartialState()  # as the trainer starts its processes' group
total = torch.ones(1)
torch.distributed.all_reduce(total)
time.sleep(2)  # both runs hold their rendezvous at once
print(f"rank {torch.distributed.get_rank()} of {int(total.item())} at port {os.environ['MASTER_PORT']}")
"""


@pytest.mark.slow
def test_two_runs_of_two_cpu_processes_side_by_side_meet_on_ports_of_their_own(tmp_path):
    """As an experiment's ``--jobs 2`` with ``--launcher "accelerate launch --cpu --num_processes 2"`` runs them:
    without ``--main_process_port`` each run's processes meet on a free port, not both on Accelerate's 29500."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    started = [[*accelerate_cpu_launcher(port=None), str(script)] for _ in range(2)]
    runs = [subprocess.Popen(command, stdout=PIPE, stderr=PIPE, text=True, cwd=tmp_path) for command in started]
    outputs = [run.communicate(timeout=180) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [stderr[-2000:] for _, stderr in outputs]
    ports = []
    for stdout, _ in outputs:
        # Found by pattern, not by line: the two ranks share the launcher's stdout, and a line of one can
        # arrive before the other's newline.
        ranks = sorted(re.findall(r"rank (\d) of (\d) at port (\d+)", stdout))
        assert [(rank, size) for rank, size, _ in ranks] == [("0", "2"), ("1", "2")], stdout
        ports.append({port for _, _, port in ranks})
    assert all(len(port) == 1 for port in ports) and ports[0] != ports[1] and {"29500"} not in ports, ports
