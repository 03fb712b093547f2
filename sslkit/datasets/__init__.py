"""Datasets: every reader behind one declared interface, the samplers that order them, the splits.

- :mod:`.base`: the interface (:class:`ImageSource`, :class:`ImageDataset`) and what readers share;
- one reader per format: :mod:`.digits`, :mod:`.idx` (Fashion-MNIST), :mod:`.cifar_stl`,
  :mod:`.folders` (image folders), :mod:`.shards` (webdataset tar shards), :mod:`.retrieval`
  (CUB-200, Cars196, SOP, In-shop in their own layouts), with
  :mod:`.memory` holding the small ones whole and :mod:`.batches` the batches of images of
  different sizes;
- :mod:`.build`: ``build_dataset`` by ``data.name`` and ``build_loader``;
- :mod:`.samplers`: the training order of each epoch (a shuffle, or class-balanced P x K batches);
- :mod:`.two_streams`: batches of labelled and unlabelled images drawn together (FixMatch);
- :mod:`.augmented`: the loader workers making the views of each batch (``data.augment_in_workers``);
- :mod:`.label_subset` and :mod:`.splits`: the labelled subset and the datasets a run trains and
  is evaluated on.
"""

from sslkit.datasets.base import DatasetInfo, ImageDataset, ImageSource, WithIndices, collate_batch
from sslkit.datasets.build import DATASETS, build_dataset, build_loader
from sslkit.datasets.memory import ImageTensorDataset
from sslkit.datasets.samplers import SAMPLERS, EpochShuffleSampler, MPerClassSampler, training_sampler
from sslkit.datasets.splits import Splits, build_splits
from sslkit.datasets.two_streams import TwoStreamBatchSampler, two_stream_sampler

__all__ = [
    "DATASETS",
    "SAMPLERS",
    "DatasetInfo",
    "EpochShuffleSampler",
    "ImageDataset",
    "ImageSource",
    "ImageTensorDataset",
    "MPerClassSampler",
    "Splits",
    "TwoStreamBatchSampler",
    "WithIndices",
    "build_dataset",
    "build_loader",
    "build_splits",
    "collate_batch",
    "training_sampler",
    "two_stream_sampler",
]
