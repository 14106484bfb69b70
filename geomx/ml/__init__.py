"""Numpy models, datasets, partitioners and phantom (size-only) models.

Everything here is plain numpy so the same maths runs in the virtual-time emulator and
in real per-node processes (docs/architecture.md).
"""

from geomx.ml.datasets import (
    DATASET_NAMES,
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    iter_batches,
    load_dataset,
)
from geomx.ml.models import MODEL_NAMES, Model, SequentialModel, build_model, softmax_cross_entropy
from geomx.ml.partition import PARTITION_SCHEMES, class_histogram, partition
from geomx.ml.phantom import (
    PHANTOM_PRESETS,
    PhantomModel,
    phantom_layer_sizes,
    phantom_model,
    resnet50_layer_sizes,
)

__all__ = [
    "DATASET_NAMES",
    "Dataset",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "MODEL_NAMES",
    "Model",
    "PARTITION_SCHEMES",
    "PHANTOM_PRESETS",
    "PhantomModel",
    "SequentialModel",
    "build_model",
    "class_histogram",
    "iter_batches",
    "load_dataset",
    "partition",
    "phantom_layer_sizes",
    "phantom_model",
    "resnet50_layer_sizes",
    "softmax_cross_entropy",
]
