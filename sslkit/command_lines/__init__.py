"""The command lines of the commands an experiment starts: each one's parser and the argv builder beside it.

An experiment (:mod:`sslkit.experiments`) starts its runs as the user's own commands, ``python -m MODULE
ARGV``; it builds each ARGV with the builder of the command it starts, and the command reads it with the
parser beside that builder (tests/test_command_lines.py holds every builder to its parser: ``parse_args(
build_argv(...))`` gives back what was asked). The commands themselves (:mod:`sslkit.cli`) import their
parser from here: the experiments sit below the command line and may not import it, and this package imports
nothing heavy, so ``--help`` and the early mistakes still answer before torch is imported.

- :mod:`sslkit.command_lines.pretrain`  ``sslkit-pretrain RECIPE [key=value ...]``.
- :mod:`sslkit.command_lines.evaluate`  ``sslkit-evaluate TARGET [key=value ...] [--out FILE]``.
- :mod:`sslkit.command_lines.embed`  ``sslkit-embed SOURCE [key=value ...] [--split S] [--out DIR]``.
- :mod:`sslkit.command_lines.label_selection`  ``sslkit-select EMBEDDINGS --budget N --strategy S``.
- :mod:`sslkit.command_lines.tune`  ``sslkit-tune RECIPE --search KEY=SPACE ...``, as it starts its workers.
"""
