"""The training loop: the run (:mod:`~sslkit.loop.run`), its builders, one training step, its state and
schedule, its logs, trackers and checkpoints.

``sslkit.loop.train(cfg)`` pretrains an encoder as a recipe says; ``tools/bench/`` builds its pieces with
the same builders (:mod:`sslkit.loop.build`) and times the same :class:`~sslkit.loop.step.TrainingStep`.
"""

from sslkit.loop.build import make_run_dir
from sslkit.loop.run import Run, train

__all__ = ["Run", "make_run_dir", "train"]
