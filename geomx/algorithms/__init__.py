"""Machine-learning algorithms trained through the kvstore.

Each algorithm is one module written against the training-program API
(``async def main(kv, ctx)``, ``geomx/node/program.py``): its shared state -- weights,
sums and counts, histograms, moment statistics, centroids -- is pushed to and pulled from
the parameter servers by the same node code as every model, so the WAN model, the sync
algorithm and the codecs apply and emulated time is charged. A scenario selects one with
``[training] algorithm = "kmeans"``; ``registry.py`` lists them, ``program.py`` runs them,
``docs/algorithms.md`` tables them against scikit-learn.
"""

from geomx.algorithms.registry import (ALGORITHM_NAMES, ALGORITHMS, CATEGORIES, AlgorithmInfo,
                                       algorithm_module, info_of)

__all__ = ["ALGORITHM_NAMES", "ALGORITHMS", "CATEGORIES", "AlgorithmInfo", "algorithm_module",
           "info_of"]
