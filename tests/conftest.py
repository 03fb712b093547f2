"""Test-wide settings.

One intra-op thread: the tests' tensors are tiny, where a second OpenMP thread buys nothing and,
on a busy 2-core machine, spin-waiting threads made small convolutions 10-30x slower.
"""

import torch

torch.set_num_threads(1)
