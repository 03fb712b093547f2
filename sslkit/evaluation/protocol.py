"""How a run's encoder is evaluated, by the trainer (monitor and final rows) and by ``sslkit-evaluate``.

:class:`RunEvaluator` prepares the unshuffled loaders of a run's :class:`~.splits.Splits` once
and measures any backbone on them:

- ``knn(backbone)``: weighted kNN top-1 on frozen features, the per-epoch monitor;
- ``evaluate(backbone)``: kNN, the linear probe (``eval.linear_epochs`` > 0) and, with held-out
  classes, retrieval among them (Recall@K, R-Precision, MAP@R, NMI, prefixed ``unseen_``);
- ``raw_pixels()``: the same kNN and probe on flattened pixels, the floor an encoder has to beat;
- ``classifier_top1(method)``: the test top-1 of a method's own classifier (fine-tuning, the heads).

Every test sample counts exactly once, in one process or several (:func:`.extract_features`).
"""

from __future__ import annotations

from torch import nn
from torch.utils.data import DataLoader, Dataset

from sslkit.datasets import ImageTensorDataset, Splits, build_loader
from sslkit.errors import UserError
from sslkit.evaluation.features import extract_features
from sslkit.evaluation.knn import knn_accuracy
from sslkit.evaluation.linear import linear_probe
from sslkit.evaluation.retrieval import retrieval_metrics


def eval_loader(dataset: Dataset, batch_size: int, num_workers: int = 0) -> DataLoader:
    """An unshuffled loader over every sample, for feature extraction."""
    return build_loader(dataset, batch_size, shuffle=False, drop_last=False, num_workers=num_workers)


class RunEvaluator:
    """kNN, linear probe and retrieval of any backbone on one run's evaluation data.

    Args:
        cfg: the run's recipe (``eval.*`` settings, ``run.seed`` for the probe, ``data.num_workers``).
        splits: the run's datasets; ``memory`` and ``test`` must be labelled.
        preprocess: the evaluation transform (uint8 batch -> normalised float input).
        accelerator: places the encoder's batches and shards the loaders across processes.
    """

    def __init__(self, cfg, splits: Splits, preprocess: nn.Module, accelerator) -> None:
        self.cfg, self.splits, self.preprocess, self.accelerator = cfg, splits, preprocess, accelerator
        # kNN and the probe need a labelled memory and test split; class-disjoint data has retrieval only.
        self.classifies = splits.memory is not None and splits.test is not None
        # Unlabelled training data and no eval.data: nothing to measure on (the trainer skips evaluation).
        self.available = self.classifies or splits.unseen is not None
        loader = lambda ds: eval_loader(ds, cfg.eval.batch_size, cfg.data.num_workers)  # noqa: E731
        prepared = lambda ds: accelerator.prepare(loader(ds)) if ds is not None else None  # noqa: E731
        self.memory_loader = prepared(splits.memory) if self.classifies else None
        self.test_loader = prepared(splits.test) if self.classifies else None
        self.unseen_loader, self.gallery_loader = prepared(splits.unseen), prepared(splits.gallery)

    def _features(self, backbone: nn.Module, loader: DataLoader):
        if loader is None:
            raise UserError(
                f"no labelled evaluation set: {self.cfg.data.name} training data has no labels; "
                f"set eval.data.root to a folder with train/<class>/ and test/<class>/ (or eval.data.name)"
            )
        return extract_features(backbone, loader, self.preprocess, self.accelerator)

    def _scores(self, train_x, train_y, test_x, test_y, linear: bool) -> dict[str, float]:
        """kNN top-1, then the linear probe's top-1/top-5 (``linear_*``) unless ``linear`` is off."""
        e, num_classes = self.cfg.eval, self.splits.info.num_classes
        knn = knn_accuracy(train_x, train_y, test_x, test_y, num_classes, k=e.knn_k, temperature=e.knn_temperature)
        results = {"knn_top1": knn}
        if linear and e.linear_epochs > 0:
            probe = linear_probe(
                train_x, train_y, test_x, test_y, num_classes, epochs=e.linear_epochs, lr=e.linear_lr,
                batch_size=e.linear_batch_size, weight_decay=e.linear_weight_decay, seed=self.cfg.run.seed,
            )  # fmt: skip
            results.update({f"linear_{k}": v for k, v in probe.items()})
        return results

    def knn(self, backbone: nn.Module) -> dict[str, float]:
        """``{"knn_top1": ...}``: the monitor's measure, without the probe's training."""
        return self.evaluate(backbone, linear=False, unseen=False)

    def evaluate(self, backbone: nn.Module, linear: bool = True, unseen: bool = True) -> dict[str, float]:
        """kNN, linear probe and (with held-out classes) ``unseen_*`` retrieval metrics of ``backbone``.

        Class-disjoint data (no memory and test split) has the retrieval metrics only: the unseen
        images retrieved from one another, or (In-shop) from the gallery.
        """
        results = {}
        if self.classifies or self.unseen_loader is None:  # the latter: the one-line error of _features
            train_x, train_y = self._features(backbone, self.memory_loader)
            test_x, test_y = self._features(backbone, self.test_loader)
            results = self._scores(train_x, train_y, test_x, test_y, linear)
        if unseen and self.unseen_loader is not None:
            features, labels = self._features(backbone, self.unseen_loader)
            gallery = (None, None)  # without one, the unseen images are retrieved from one another
            if self.gallery_loader is not None:
                gallery = self._features(backbone, self.gallery_loader)
            metrics = retrieval_metrics(features, labels, *gallery, ks=self.cfg.eval.recall_ks)
            results.update({f"unseen_{k}": v for k, v in metrics.items()})
        return results

    def classifier_top1(self, method: nn.Module) -> float:
        """Test top-1 of a method's own classifier: the argmax of ``method.logits`` over the whole test split.

        Every test sample counts exactly once, in one process or several (the logits are gathered as
        features are).
        """
        logits, labels = self._features(_Logits(method), self.test_loader)  # (N, C), (N,)
        return (logits.argmax(dim=1) == labels).double().mean().item()

    def raw_pixels(self, linear: bool = True) -> dict[str, float]:
        """The same kNN (and probe) on flattened pixels in [0, 1]; {} for a dataset not held in memory."""
        memory, test = self.splits.memory, self.splits.test
        if not self.available or not isinstance(memory, ImageTensorDataset):
            return {}
        train_x, test_x = memory.images.flatten(1).float() / 255, test.images.flatten(1).float() / 255
        return self._scores(train_x, memory.labels, test_x, test.labels, linear)


class _Logits(nn.Module):
    """``method.logits`` as an encoder, so logits are extracted (and gathered) as features are."""

    def __init__(self, method: nn.Module) -> None:
        super().__init__()
        self.method = method

    def forward(self, images):
        return self.method.logits(images)
