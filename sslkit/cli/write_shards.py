"""Write the images of a folder into tar shards that ``data.name=webdataset`` streams.

Every image under the folder, at any depth (as ``data.name=imagefolder`` lists them), goes
into a shard as its original bytes, under a key made of its position in that sorted list
(``000123.jpg``); the member ``000123.path`` records its path relative to the folder. Shards
hold ``--per-shard`` images each (the last one the rest) and are written by webdataset's
``ShardWriter``:

    sslkit-write-shards ~/photos shards/photos-%06d.tar --per-shard 1000
    sslkit-pretrain recipes/simclr.yaml data.name=webdataset \\
        data.root='shards/photos-{000000..000009}.tar'

For every sample to be read once an epoch, make the number of shards a multiple of
processes x ``data.num_workers`` and ``--per-shard`` a multiple of the per-process batch size
(see ``sslkit/datasets/shards.py``). The command prints the brace pattern of what it wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sslkit.console import print_user_error
from sslkit.errors import UserError


def write_shards(folder: Path, pattern: str, per_shard: int) -> list[str]:
    """Write the images under ``folder`` into shards named by ``pattern`` (``%06d`` numbers them); returns them."""
    from sslkit.datasets import folders, shards

    wds = shards._webdataset()
    if "%" not in pattern:
        raise UserError(f"the shard pattern {pattern} needs a number placeholder, e.g. shards/train-%06d.tar")
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder of images")
    paths = folders.list_images(folder)
    if not paths:
        raise UserError(f"no images ({', '.join(folders.IMAGE_EXTENSIONS)}) under {folder}")
    Path(pattern).parent.mkdir(parents=True, exist_ok=True)
    written = []
    with wds.ShardWriter(pattern, maxcount=per_shard, verbose=0, post=written.append) as sink:
        for index, path in enumerate(paths):
            extension = path.suffix.lower().lstrip(".")
            sink.write(
                {"__key__": f"{index:06d}", extension: path.read_bytes(), "path": str(path.relative_to(folder))}
            )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sslkit-write-shards", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the image folder (any layout, any depth)")
    parser.add_argument("pattern", help="where the shards go, with a number placeholder: shards/train-%%06d.tar")
    parser.add_argument("--per-shard", type=int, default=1000, help="images per shard (default 1000)")
    args = parser.parse_args(argv)
    try:
        if args.per_shard < 1:
            raise UserError(f"--per-shard must be at least 1, got {args.per_shard}")
        written = write_shards(args.folder.expanduser(), args.pattern, args.per_shard)
    except UserError as error:
        print_user_error(error)
        return 2
    last = len(written) - 1
    print(f"wrote {len(written)} shards: data.root='{args.pattern.replace('%06d', f'{{000000..{last:06d}}}')}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
