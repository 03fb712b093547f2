"""The strategies :mod:`sslkit.selection` offers, by name, with what each picks: importable without numpy.

``sslkit-select --help`` lists them before it imports anything that computes, and
``sslkit-label-efficiency`` crosses them with its roads; :func:`sslkit.selection.select` checks its
argument against the same names.
"""

STRATEGIES = {
    "random": "uniformly at random among the unlabelled images",
    "kmeans": "the image nearest each of N k-means centres",
    "typiclust": "the most typical image of each of N clusters (Hacohen et al. 2022)",
    "probcover": "the greedy cover by delta-balls of a purity-chosen delta (Yehuda et al. 2022)",
    "kcenter": "farthest-first from the labelled images, greedy k-center (Coreset, Sener & Savarese 2018)",
}
