"""Test-wide settings.

One intra-op thread: the tests' tensors are tiny, where a second OpenMP thread buys nothing and,
on a busy 2-core machine, spin-waiting threads made small convolutions 10-30x slower.

The longest test files run first (their seconds in ``durations.json``, written by
``tools/test_durations.py``): with ``-n 3 --dist loadfile --no-loadscope-reorder`` pytest-xdist hands
the files to the workers in this order, so the workers finish together rather than one running
the quick start alone while the others wait.

Three workers on two cores: the end-to-end tests spend much of their time waiting (on their training
processes, on SLURM's scheduler, on a signal's effect), and a third worker uses a core meanwhile. On a
2-core AMD EPYC the whole suite took 699 s with three workers against 777 s with two, the same hour.
"""

import json
from pathlib import Path

import torch

torch.set_num_threads(1)

DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(config, items):
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    items.sort(key=lambda item: -seconds.get(item.nodeid.partition("::")[0], 0.0))  # stable: a file keeps its order
