"""The commands a user runs, each installed as a console script and runnable as a module.

==============================  ==========================================  =============================
command                         what it does                                module
==============================  ==========================================  =============================
``sslkit-pretrain``             train an encoder from a recipe              :mod:`sslkit.cli.pretrain`
``sslkit-evaluate``             kNN, linear probe, retrieval of an encoder  :mod:`sslkit.cli.evaluate`
``sslkit-export``               the backbone as safetensors, timm, ONNX     :mod:`sslkit.cli.export`
``sslkit-embed``                embeddings of a dataset or image folder     :mod:`sslkit.cli.embed`
``sslkit-ablate``               a grid of runs (sweeps x seeds), tabulated  :mod:`sslkit.cli.ablate`
``sslkit-label-efficiency``     pretrained against scratch at few labels    :mod:`sslkit.cli.label_efficiency`
``sslkit-compare``              recipes at equal training time, tabulated   :mod:`sslkit.cli.compare`
``sslkit-tune``                 a recipe's settings searched with Optuna    :mod:`sslkit.cli.tune`
``sslkit-report``               a run's report.md with its curves           :mod:`sslkit.cli.report`
``sslkit-show-augmentations``   a PNG grid of a recipe's views              :mod:`sslkit.cli.show_augmentations`
``sslkit-write-shards``         an image folder as webdataset tar shards    :mod:`sslkit.cli.write_shards`
``sslkit-neighbours``           each item's k nearest in an embeddings set  :mod:`sslkit.cli.neighbours`
``sslkit-duplicates``           near-duplicates (SemDeDup), near-copies     :mod:`sslkit.cli.duplicates`
``sslkit-map``                  a map of an embeddings set, and neighbours  :mod:`sslkit.cli.map`
``sslkit-select``               which images to label, from embeddings      :mod:`sslkit.cli.label_selection`
==============================  ==========================================  =============================

``python -m sslkit.cli.<module>`` is the same command. A launcher starts the training commands
as modules: ``accelerate launch -m sslkit.cli.pretrain RECIPE`` (or ``torchrun -m``), and
``sslkit-ablate``, ``sslkit-label-efficiency`` and ``sslkit-compare`` start every run they make that way, through one
runner (:mod:`sslkit.experiments.runner`) on the executor ``--executor`` and ``--jobs N`` ask for (N runs at once;
``sslkit-tune`` starts N workers of its study there, each running trials one after another);
the arguments of each command they start are built beside that command's parser (:mod:`sslkit.command_lines`).

Every command builds its parser from light modules and imports the library (torch) once its arguments are
parsed and checked: ``--help``, and the mistakes that need no torch (a path that is not there, a misspelled
recipe or recipe key, a number out of its range), answer in about a tenth of a CPU-second
(:mod:`sslkit.cli.early_checks`).
"""
