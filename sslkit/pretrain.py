"""``accelerate launch sslkit/pretrain.py RECIPE [key=value ...]``: the launch path of a clone.

The command is :mod:`sslkit.cli.pretrain` (installed as ``sslkit-pretrain``, started by a launcher as
``-m sslkit.cli.pretrain``); this file keeps the path a launcher takes from a clone where the README
of earlier versions, and many job scripts, give it.
"""

import sys

from sslkit.cli.pretrain import main

if __name__ == "__main__":
    sys.exit(main())
