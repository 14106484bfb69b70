"""The algorithms of ``geomx/algorithms`` against scikit-learn, case by case.

Each :class:`Case` names a scenario (the quickstart shape: a central DC with the global
server, two parties of two workers), the overrides that pick the algorithm, its data and
its options, scikit-learn's *centralised* equivalent fitted on the same training split,
and how close geomx must come on the same test split. ``tests/algorithms/test_*.py``
assert it; ``bench/algorithms.py`` prints the table of docs/algorithms.md from the same
cases, so the two cannot drift apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tests.helpers.paths import ROOT

SCENARIOS = ROOT / "scenarios"


@dataclass(frozen=True)
class Case:
    algorithm: str
    scenario: str
    overrides: tuple[str, ...]
    reference: Callable[[Any, list[str]], float]   # (table, program_args) -> sklearn score
    metric: str               # "accuracy" | "r2" | "inertia" | "explained_variance"
    tolerance: float          # higher-is-better: geomx >= ref - tol; inertia: geomx <= ref * (1 + tol)
    why: str = ""             # the reference and the tolerance, in words
    test: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lower_is_better(self) -> bool:
        return self.metric == "inertia"

    def within(self, geomx: float, ref: float) -> bool:
        if self.lower_is_better:
            return geomx <= ref * (1 + self.tolerance)
        return geomx >= ref - self.tolerance


def _opt(args: list[str], name: str, default: Any, kind: Callable[[str], Any] = int) -> Any:
    return kind(args[args.index(name) + 1]) if name in args else default


# ---------------------------------------------------------------- references
def _kmeans_inertia(table, args):
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=_opt(args, "--clusters", 8), n_init=10, random_state=0)
    km.fit(table.x_train)
    d2 = ((table.x_test[:, None, :] - km.cluster_centers_[None]) ** 2).sum(axis=2)
    return float(d2.min(axis=1).mean())


def _gaussian_nb(table, args):
    from sklearn.naive_bayes import GaussianNB

    return float(GaussianNB().fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _c(table, args, alpha):
    return 1.0 / (_opt(args, "--alpha", alpha, float) * len(table.y_train))


def _linear_svc(table, args):
    from sklearn.svm import LinearSVC

    m = LinearSVC(loss="hinge", C=_c(table, args, 1e-3), max_iter=20000, random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _linear_svr(table, args):
    from sklearn.svm import LinearSVR

    m = LinearSVR(epsilon=_opt(args, "--epsilon", 0.1, float), C=_c(table, args, 1e-3),
                  loss="epsilon_insensitive", max_iter=20000, random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _rbf_svc(table, args):
    from sklearn.svm import SVC

    m = SVC(kernel="rbf", gamma=_opt(args, "--gamma", 1.0, float), C=_c(table, args, 1e-4))
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _logistic(table, args):
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(max_iter=2000)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _passive_aggressive(table, args):
    from sklearn.linear_model import PassiveAggressiveClassifier

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in scikit-learn 1.8
        m = PassiveAggressiveClassifier(C=_opt(args, "--C", 1.0, float), average=True,
                                        random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _pca_kept_variance(table, args):
    from sklearn.decomposition import PCA

    pca = PCA(n_components=_opt(args, "--components", 10)).fit(table.x_train)
    c = table.x_test - pca.mean_
    return float(np.sum((c @ pca.components_.T) ** 2) / np.sum(c * c))


def _minibatch_kmeans_inertia(table, args):
    from sklearn.cluster import MiniBatchKMeans

    km = MiniBatchKMeans(n_clusters=_opt(args, "--clusters", 8), batch_size=4 * 64, n_init=3,
                         random_state=0).fit(table.x_train)
    d2 = ((table.x_test[:, None, :] - km.cluster_centers_[None]) ** 2).sum(axis=2)
    return float(d2.min(axis=1).mean())


def _hist_gbdt(table, args):
    from sklearn.ensemble import HistGradientBoostingClassifier

    m = HistGradientBoostingClassifier(
        max_iter=50, max_depth=_opt(args, "--depth", 3),
        learning_rate=_opt(args, "--learning-rate", 0.1, float),
        max_bins=_opt(args, "--max-bins", 32), l2_regularization=_opt(args, "--l2", 1.0, float),
        min_samples_leaf=_opt(args, "--min-leaf", 20), early_stopping=False, random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _logistic_l2(table, args):
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=_c(table, args, 1e-3), max_iter=5000)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _random_forest(table, args):
    from sklearn.ensemble import RandomForestClassifier

    m = RandomForestClassifier(n_estimators=20, max_depth=_opt(args, "--depth", 6),
                               max_features="sqrt", random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _bagging(table, args):
    from sklearn.ensemble import BaggingClassifier
    from sklearn.tree import DecisionTreeClassifier

    m = BaggingClassifier(DecisionTreeClassifier(max_depth=_opt(args, "--depth", 5)),
                          n_estimators=10, random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _adaboost(table, args):
    from sklearn.ensemble import AdaBoostClassifier
    from sklearn.tree import DecisionTreeClassifier

    m = AdaBoostClassifier(DecisionTreeClassifier(max_depth=_opt(args, "--depth", 1)),
                           n_estimators=50, learning_rate=_opt(args, "--learning-rate", 1.0, float),
                           random_state=0)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _base_estimators(table, args):
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.tree import DecisionTreeClassifier

    return [("nb", GaussianNB()), ("lr", LogisticRegression(C=_c(table, args, 1e-3), max_iter=5000)),
            ("tree", DecisionTreeClassifier(max_depth=_opt(args, "--depth", 4), random_state=0))]


def _voting(table, args):
    from sklearn.ensemble import VotingClassifier

    m = VotingClassifier(_base_estimators(table, args), voting="soft")
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


def _stacking(table, args):
    from sklearn.ensemble import StackingClassifier
    from sklearn.linear_model import LogisticRegression

    m = StackingClassifier(_base_estimators(table, args), final_estimator=LogisticRegression(),
                           stack_method="predict_proba", cv=5)
    return float(m.fit(table.x_train, table.y_train).score(table.x_test, table.y_test))


# a 500-row test split: one row is 0.2 pp (breast cancer's 143 rows make it 0.7 pp)
_THREE_CLASSES = ("training.dataset=classification", "training.synthetic_features=20",
                  "training.synthetic_classes=3")

CASES: dict[str, Case] = {c.algorithm: c for c in (
    Case("voting", "algo_ensemble.toml", ("training.algorithm=voting", "run.iterations=200", *_THREE_CLASSES),
         _voting, "accuracy", 0.02,
         "VotingClassifier(soft; GaussianNB, LogisticRegression, DecisionTree(same depth))",
         "algorithms/test_ensemble.py"),
    Case("stacking", "algo_ensemble.toml", ("training.algorithm=stacking", "run.iterations=200", *_THREE_CLASSES),
         _stacking, "accuracy", 0.02,
         "StackingClassifier(the same three, LogisticRegression meta, 5-fold CV); geomx "
         "holds out 25 % of each partition instead of cross-validating",
         "algorithms/test_ensemble.py"),
    Case("random_forest", "algo_ensemble.toml",
         ("training.algorithm=random_forest", "run.iterations=20"), _random_forest, "accuracy",
         0.02, "RandomForestClassifier(20 trees, same depth, sqrt features)",
         "algorithms/test_ensemble.py"),
    Case("bagging", "algo_ensemble.toml", ("training.algorithm=bagging", "run.iterations=10"),
         _bagging, "accuracy", 0.02, "BaggingClassifier(10 x DecisionTreeClassifier(same depth))",
         "algorithms/test_ensemble.py"),
    Case("adaboost", "algo_ensemble.toml", ("training.algorithm=adaboost", "run.iterations=50"),
         _adaboost, "accuracy", 0.02, "AdaBoostClassifier(50 x stumps, SAMME)",
         "algorithms/test_ensemble.py"),
    Case("fedavg_ensemble", "algo_ensemble.toml",
         ("training.algorithm=fedavg_ensemble", "training.dataset=digits", "run.iterations=20"),
         _logistic_l2, "accuracy", 0.02,
         "LogisticRegression(C=1/(alpha n)), centralised, to convergence",
         "algorithms/test_ensemble.py"),
    Case("gbdt", "algo_ensemble.toml", (), _hist_gbdt, "accuracy", 0.02,
         "HistGradientBoostingClassifier(50 rounds, same depth, bins, l2, min leaf)",
         "algorithms/test_ensemble.py"),
    Case("incremental_pca", "algo_incremental.toml", (), _pca_kept_variance,
         "explained_variance", 0.001,
         "PCA on the whole training set: the test variance kept, within 0.001 (exact after the pass)",
         "algorithms/test_incremental.py"),
    Case("minibatch_kmeans", "algo_incremental.toml",
         ("training.algorithm=minibatch_kmeans", "training.dataset=blobs",
          'training.program_args=["--clusters", "6"]', "run.iterations=100"),
         _minibatch_kmeans_inertia, "inertia", 0.03,
         "MiniBatchKMeans(batch 4 x 64, n_init=3): test inertia at most 3 % above",
         "algorithms/test_incremental.py"),
    Case("ftrl", "algo_online.toml", (), _logistic, "accuracy", 0.02,
         "LogisticRegression (batch, L-BFGS): one FTRL pass within 2 pp",
         "algorithms/test_online.py"),
    Case("passive_aggressive", "algo_online.toml", ("training.algorithm=passive_aggressive",),
         _passive_aggressive, "accuracy", 0.02,
         "PassiveAggressiveClassifier(average=True), epochs to convergence: one pass within 2 pp",
         "algorithms/test_online.py"),
    Case("linear_svm", "algo_svm.toml", (), _linear_svc, "accuracy", 0.02,
         "LinearSVC(loss='hinge', C=1/(alpha n))", "algorithms/test_svm.py"),
    Case("svr", "algo_svm.toml", ("training.algorithm=svr", "training.dataset=diabetes"),
         _linear_svr, "r2", 0.02, "LinearSVR(C=1/(alpha n)): R^2 at most 0.02 below",
         "algorithms/test_svm.py"),
    Case("kernel_svm", "algo_svm.toml", ("training.algorithm=kernel_svm", "training.dataset=moons"),
         _rbf_svc, "accuracy", 0.02, "SVC(kernel='rbf', gamma, C=1/(alpha n)), exact kernel",
         "algorithms/test_svm.py"),
    Case("kmeans", "algo_mapreduce.toml", (), _kmeans_inertia, "inertia", 0.02,
         "KMeans(n_init=10): test inertia at most 2 % above", "algorithms/test_mapreduce.py"),
    Case("naive_bayes", "algo_mapreduce.toml",
         ("training.algorithm=naive_bayes", "training.dataset=breast_cancer",
          "training.program_args=[]"), _gaussian_nb, "accuracy", 0.02,
         "GaussianNB: the same closed form", "algorithms/test_mapreduce.py"),
)}


def load_case(case: Case, out_dir: Path, *more: str):
    from geomx.scenario import load_scenario

    return load_scenario(SCENARIOS / case.scenario,
                         [f"run.out_dir={out_dir}", "run.progress=false", "metrics.plot=false",
                          "metrics.trace=false", *case.overrides, *more])


def table_of_scenario(s):
    from geomx.algorithms.program import table_of
    from geomx.cluster import plan_job

    spec = plan_job(s).train
    return table_of(spec.dataset, seed=spec.seed, options=spec.dataset_kwargs,
                    path=spec.data_path), list(spec.program_args)


def run_case(case: Case, out_dir: Path, *more: str, runtime: str | None = None) -> dict[str, Any]:
    """Run the case through geomx and scikit-learn; the figures of one table row. BLAS
    runs one thread: the small matrices here only lose time to thread start-up, and on a
    shared machine oversubscription made one reference fit 60x slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        return _run_case(case, out_dir, *more, runtime=runtime)


def _run_case(case: Case, out_dir: Path, *more: str, runtime: str | None = None) -> dict[str, Any]:
    from geomx.experiment import run_scenario

    s = load_case(case, out_dir, *more)
    t0 = time.process_time()
    r = run_scenario(s, runtime=runtime)
    geomx_cpu = time.process_time() - t0
    final = r.summary.extra["final_eval"]
    table, args = table_of_scenario(s)
    t0 = time.process_time()
    ref = case.reference(table, args)
    return {"algorithm": case.algorithm, "metric": final["metric"], "geomx": float(final["score"]),
            "sklearn": ref, "ok": case.within(float(final["score"]), ref), "final": final,
            "summary": r.summary, "run_dir": r.run_dir, "geomx_cpu_s": geomx_cpu,
            "sklearn_cpu_s": time.process_time() - t0}
