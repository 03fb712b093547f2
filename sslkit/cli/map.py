"""Pictures of an embeddings folder: a map of the whole set and its nearest neighbours.

    sslkit-map runs/quickstart/embeddings-digits-test              # map.png, map.html, neighbours.png
    sslkit-map embeddings/ --method tsne --sample 3000 --out pictures/
    sslkit-map embeddings/ --method umap                          # pip install "sslkit[umap]"

EMBEDDINGS is a folder written by ``sslkit-embed``. The map places every row (or a seeded sample of
``--sample`` rows) in 2-D by PCA, t-SNE or UMAP, coloured by label. ``map.html`` is one file that
opens offline in any browser: hover a point for its image and label, click it for its nearest
neighbours (``map.html#pick=42`` opens with row 42 picked), wheel to zoom, drag to pan.
``neighbours.png`` shows a few random rows with their ``--k`` nearest and the cosine similarity
under each (green: same label, red: another). Thumbnails are read back from the images
``meta.json`` names; ``--no-thumbnails`` draws without them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sslkit.embeddings.choices import MAP_METHODS

    parser = argparse.ArgumentParser(prog="sslkit-map", description=__doc__.splitlines()[0])
    parser.add_argument("embeddings", help="an embeddings folder written by sslkit-embed")
    parser.add_argument(
        "--method", choices=MAP_METHODS, default="pca", help="how rows are placed in 2-D (default pca)"
    )
    parser.add_argument("--out", type=Path, help="the folder for the pictures (default: the embeddings folder)")
    parser.add_argument("--k", type=int, default=8, help="neighbours shown per row (default 8)")
    parser.add_argument("--sample", type=int, default=5000, help="rows drawn at most, a seeded sample (default 5000)")
    parser.add_argument("--no-thumbnails", action="store_true", help="points only: do not read the images back")
    parser.add_argument("--seed", type=int, default=0, help="the sample, the projection and the grid's rows")
    return parser.parse_args(argv)


def check_early(args: argparse.Namespace) -> None:
    """The sample and the folder, before numpy and torch are imported."""
    from sslkit.cli.early_checks import at_least, embeddings_folder

    at_least(args.sample, 3, "--sample")
    embeddings_folder(args.embeddings)


def main(argv: list[str] | None = None) -> int:
    from sslkit.cli.early_checks import refused

    args = parse_args(argv)
    if refused(check_early, args):
        return 2
    from sslkit.console import console, print_user_error
    from sslkit.embeddings import read_embeddings
    from sslkit.embeddings.maps import draw_pictures
    from sslkit.errors import UserError

    try:
        embeddings = read_embeddings(args.embeddings)
        with console.status(f"drawing {min(args.sample, len(embeddings))} rows ({args.method})"):
            pictures = draw_pictures(
                embeddings, args.out or embeddings.folder, args.method, args.k, args.sample,
                with_images=not args.no_thumbnails, seed=args.seed,
            )  # fmt: skip
    except UserError as error:
        print_user_error(error)
        return 2
    shown = f"{pictures.rows} of {pictures.of} rows" if pictures.rows < pictures.of else f"all {pictures.of} rows"
    written = [pictures.map_html, pictures.map_png, *([pictures.neighbours_png] if pictures.neighbours_png else [])]
    console.print(f"{shown}: " + ", ".join(str(path) for path in written), markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
