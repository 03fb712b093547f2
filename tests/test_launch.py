"""The process count is read from accelerate launch's own command line."""

from sslkit.launch import _requested_processes


def test_requested_processes_forms():
    assert _requested_processes(["accelerate", "launch", "--cpu", "--num_processes", "2", "x.py"]) == 2
    assert _requested_processes(["python", "-m", "accelerate.commands.launch", "--num_processes=3", "x.py"]) == 3
    assert _requested_processes(["accelerate", "launch", "x.py"]) == 1
