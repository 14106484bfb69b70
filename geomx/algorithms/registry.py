"""The algorithms geomx trains through the parameter server, by name (``[training] algorithm``).

GeoMX's README counts "25 machine learning algorithms in 6 categories"; the 9 gradient-
descent ones are the optimizers (``geomx/optim``), the other 16 are here, one module each.
This table is import-light (no module is imported until it is used) so that the scenario
layer can validate names and options without loading numpy-heavy code.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["AlgorithmInfo", "ALGORITHMS", "ALGORITHM_NAMES", "CATEGORIES", "algorithm_module",
           "info_of"]


@dataclass(frozen=True)
class AlgorithmInfo:
    """One algorithm: its name, category, task, what one ``[run] iterations`` step is,
    and which ``[sync] algorithm`` values it supports."""

    name: str
    category: str
    task: str          # "classification" | "regression" | "clustering" | "decomposition"
    iteration: str     # what one iteration is (docs, progress rows)
    syncs: tuple[str, ...] = ("fsa",)
    summary: str = ""


CATEGORIES = ("support_vector", "online", "incremental", "mapreduce", "ensemble")

ALGORITHMS: dict[str, AlgorithmInfo] = {a.name: a for a in (
    AlgorithmInfo("linear_svm", "support_vector", "classification", "SGD step",
                  ("fsa", "mixed"), "linear SVM, hinge loss, one-vs-rest, distributed SGD"),
    AlgorithmInfo("svr", "support_vector", "regression", "SGD step", ("fsa", "mixed"),
                  "linear support-vector regression, epsilon-insensitive loss, distributed SGD"),
    AlgorithmInfo("kernel_svm", "support_vector", "classification", "SGD step",
                  ("fsa", "mixed"), "RBF-kernel SVM via random Fourier features, distributed SGD"),
    AlgorithmInfo("ftrl", "online", "classification", "stream round",
                  summary="FTRL-proximal logistic regression, one pass over the partitioned stream"),
    AlgorithmInfo("passive_aggressive", "online", "classification", "stream round",
                  summary="passive-aggressive (PA-I) classifier, iterative parameter mixing"),
    AlgorithmInfo("incremental_pca", "incremental", "decomposition", "chunk",
                  summary="PCA from merged per-DC moment statistics, one chunk per round"),
    AlgorithmInfo("minibatch_kmeans", "incremental", "clustering", "mini-batch step",
                  summary="mini-batch k-means (Sculley 2010), per-centre learning rates"),
    AlgorithmInfo("kmeans", "mapreduce", "clustering", "Lloyd iteration",
                  summary="k-means (Lloyd), per-DC sums and counts aggregated by a push"),
    AlgorithmInfo("naive_bayes", "mapreduce", "classification", "counting pass",
                  summary="Gaussian naive Bayes from aggregated per-class counts and moments"),
    AlgorithmInfo("gbdt", "ensemble", "classification", "boosting round",
                  summary="gradient-boosted trees, per-DC gradient histograms summed by the PS"),
    AlgorithmInfo("fedavg_ensemble", "ensemble", "classification", "federated round",
                  summary="federated averaging of per-DC softmax models (McMahan et al. 2017)"),
    AlgorithmInfo("random_forest", "ensemble", "classification", "tree",
                  summary="random forest: Poisson bootstrap, feature subsets, histogram trees"),
    AlgorithmInfo("bagging", "ensemble", "classification", "tree",
                  summary="bagged histogram trees (Poisson bootstrap, all features)"),
    AlgorithmInfo("adaboost", "ensemble", "classification", "boosting round",
                  summary="AdaBoost (SAMME) over shallow histogram trees"),
    AlgorithmInfo("voting", "ensemble", "classification", "SGD step",
                  summary="soft voting of naive Bayes, logistic regression and a histogram tree"),
    AlgorithmInfo("stacking", "ensemble", "classification", "SGD step",
                  summary="stacking: base learners on each partition's fit split, a logistic "
                          "meta-learner on their held-out outputs"),
)}

ALGORITHM_NAMES: tuple[str, ...] = tuple(ALGORITHMS)


def info_of(name: str) -> AlgorithmInfo:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; allowed: {', '.join(ALGORITHM_NAMES)}") from None


def algorithm_module(name: str) -> ModuleType:
    """The module implementing ``name`` (``geomx/algorithms/<name>.py``)."""
    info_of(name)
    return importlib.import_module(f"geomx.algorithms.{name}")
