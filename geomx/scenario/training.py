"""``[training]``: the model, the data and how they are split, and the optimizers."""

from __future__ import annotations

from dataclasses import dataclass

import math
from typing import Any

from geomx.optim.registry import OPTIMIZER_NAMES, SERVER_ONLY, create_optimizer
from geomx.algorithms.data import TABLE_DATASETS
from geomx.algorithms.registry import ALGORITHM_NAMES
from geomx.scenario.errors import ScenarioError, quote_list
from geomx.scenario.kinds import Choice, Integer, ListOf, Real, Section, Text, setting


MODELS = ("softmax", "mlp", "cnn", "phantom")
IMAGE_DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10")
#: Tabular datasets read from the file in ``data_path``.
FILE_DATASETS = ("libsvm", "csv")
SERVER_OPTIMIZERS = (*OPTIMIZER_NAMES, "none")
WORKER_OPTIMIZERS = (*(n for n in OPTIMIZER_NAMES if n not in SERVER_ONLY), "none")
#: Optimizers that take the scenario's ``momentum`` setting.
MOMENTUM_OPTIMIZERS = ("momentum", "nesterov", "signum")

_OPTION_PATTERN = r"[a-z_][a-z0-9_]*=\S+"
_OPTION_DOC = ("`name=value` strings with MXNet's option names and JSON-like values "
               "(numbers, true, false, none), e.g. `[\"gamma1=0.95\", \"centered=true\"]`; "
               "see docs/optimizers.md")


def parse_optimizer_options(items: tuple[str, ...], path: str) -> dict[str, Any]:
    """``("beta1=0.8", "centered=true")`` -> ``{"beta1": 0.8, "centered": True}``."""
    options: dict[str, Any] = {}
    for i, item in enumerate(items):
        key, _, text = item.partition("=")
        lowered = text.lower()
        value: Any
        if lowered in ("true", "false"):
            value = lowered == "true"
        elif lowered == "none":
            value = None
        else:
            try:
                value = float(text)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value):
                raise ScenarioError(
                    f"optimizer option {key} = {text!r} is not a finite number, true, false or none",
                    path=f"{path}[{i}]", value=item, allowed="numbers, true, false, none")
            if value.is_integer() and "." not in text and "e" not in lowered:
                value = int(value)
        if key in options:
            raise ScenarioError(f"optimizer option {key} is given twice", path=f"{path}[{i}]", value=item)
        options[key] = value
    return options


@dataclass(frozen=True)
class TrainingConfig(Section):
    """The model, the data and how they are split, and the optimizers."""

    model: str = setting(Choice(*MODELS), "mlp",
                         "`phantom`: tensors with sizes only (no data), for emulating large models.")
    hidden: tuple[int, ...] = setting(ListOf(Integer(min=1)), [64], "Hidden layer sizes of the mlp.")
    dataset: str = setting(Choice(*IMAGE_DATASETS, "synthetic", *FILE_DATASETS, *TABLE_DATASETS),
                           "digits",
                           "`digits`: scikit-learn 8x8 digits; `synthetic`: seeded generated data (see "
                           "synthetic_*); `cifar10`: the CIFAR-10 python batches; `libsvm` / `csv`: your "
                           "tabular file in data_path (features scaled to [0, 1], labels mapped to 0..K-1). "
                           "With `algorithm` only: scikit-learn's shipped `iris`, `wine`, `breast_cancer`, "
                           "`diabetes` and generated `blobs`, `classification`, `regression`, `moons` "
                           "(sizes from synthetic_*), standardised (geomx/algorithms/data.py).")
    data_path: str = setting(Text(), "",
                             "mnist / fashion_mnist: directory with the IDX files, or an .npz file; "
                             "cifar10: cifar-10-batches-py/ or cifar-10-python.tar.gz; libsvm / csv: the "
                             "file (required; a LIBSVM `<file>.t` beside it is the test set). Relative to "
                             "the scenario file.")
    label_column: str = setting(Text(r"-?[0-9]+|[^0-9-].*", "an integer index or a column name"), "-1",
                                "csv: the label column, an index (negative: from the end) or a header name.")
    libsvm_features: int = setting(Integer(min=0), 0,
                                   "libsvm: the number of features (0: the largest index in the file).")
    partition: str = setting(Choice("iid", "by_class", "dirichlet"), "iid",
                             "How training data is split across workers.")
    dirichlet_alpha: float = setting(Real(min=0, min_open=True), 0.5,
                                     "Concentration for partition = dirichlet (smaller = more skewed).")
    batch_size: int = setting(Integer(min=1), 32, "Samples per worker per iteration.")
    lr: float = setting(Real(min=0, min_open=True), 0.01, "Learning rate of the global-server optimizer.")
    optimizer: str = setting(Choice(*SERVER_OPTIMIZERS), "adam",
                             "Optimizer run by the global servers (`none`: store the pushed values). "
                             "The built-in trainer installs it; a training program's "
                             "servers store the pushed values (as GeoMX's and MXNet's do) "
                             "until its master worker calls `kv.set_optimizer` -- "
                             "`kv.set_optimizer(ctx.optimizer_config)` installs this one.")
    momentum: float = setting(Real(min=0, max=1, max_open=True), 0.9, "Momentum for momentum / nesterov / signum.")
    weight_decay: float = setting(Real(min=0), 0.0, "L2 weight decay.")
    optimizer_options: tuple[str, ...] = setting(ListOf(Text(_OPTION_PATTERN, "name=value")), [],
                                                 "Further options of the global optimizer: " + _OPTION_DOC
                                                 + ". They override lr, weight_decay and momentum.")
    worker_optimizer: str = setting(Choice(*WORKER_OPTIMIZERS), "sgd",
                                    "Optimizer for local steps on workers (HFA, ESync).")
    worker_optimizer_options: tuple[str, ...] = setting(ListOf(Text(_OPTION_PATTERN, "name=value")), [],
                                                        "Further options of the worker optimizer, as "
                                                        "optimizer_options.")
    worker_lr: float = setting(Real(min=0), 0.0, "Learning rate of local steps; 0 = same as `lr`.")
    phantom_params: int = setting(Integer(min=0, counts=True), 0,
                                  "Phantom model: total parameter count, e.g. \"25.6M\".")
    phantom_layers: tuple[int, ...] = setting(ListOf(Integer(min=1, counts=True)), [],
                                              "Phantom model: explicit tensor sizes (elements).")
    phantom_preset: str = setting(Choice("", "resnet50", "vgg16", "vgg19"), "",
                                  "Phantom model: tensor sizes (and per-layer FLOPs at 224x224) of a known network.")
    layer_compute: str = setting(Choice("off", "flops", "shares"), "off",
                                 "Per-layer compute model (geomx/node/layered.py): `off` charges an iteration's "
                                 "compute in one piece, then pushes every gradient; `flops` / `shares` split it "
                                 "over the layers -- backward produces gradients last layer first and pushes "
                                 "each as soon as it exists, and the next forward of a layer starts only once "
                                 "its parameters are pulled. `flops`: shares from the model's per-layer FLOPs "
                                 "(phantom presets, numpy models); `shares`: from layer_compute_shares. "
                                 "fsa and mixed only.")
    layer_compute_shares: tuple[float, ...] = setting(ListOf(Real(min=0)), [],
                                                      "layer_compute = 'shares': relative compute of each "
                                                      "parameter tensor (kvstore key), one number per key; "
                                                      "normalised to sum to 1.")
    layer_backward_fraction: float = setting(Real(min=0, max=1, min_open=True, max_open=True), 0.667,
                                             "Per-layer compute: the backward pass's share of an iteration's "
                                             "compute (about 2/3: it computes two products per layer where "
                                             "forward computes one); the rest is forward.")
    synthetic_samples: int = setting(Integer(min=1, counts=True), 4000, "Samples of the synthetic dataset.")
    synthetic_features: int = setting(Integer(min=1), 32, "Features of the synthetic dataset.")
    synthetic_classes: int = setting(Integer(min=2), 10, "Classes of the synthetic dataset.")
    program: str = setting(Text(), "",
                           "Your own training program run on every worker and the master worker: "
                           "`path/to/train.py` (relative to the scenario file), `train.py:fn` or "
                           "`package.module:fn`; it defines `def main(kv, ctx)` (its calls block) "
                           "or `async def main(kv, ctx)`. Empty: the built-in trainer.")
    program_args: tuple[str, ...] = setting(ListOf(Text()), [],
                                            "Arguments for the program (`ctx.args`), as on a command "
                                            "line: `geomx run S --program p.py -- --lr 0.1`.")
    algorithm: str = setting(Choice("", *ALGORITHM_NAMES), "",
                             "A machine-learning algorithm trained through the kvstore instead of a model "
                             "(docs/algorithms.md); its options go in program_args (`[\"--clusters\", \"5\"]`), "
                             "`[run] iterations` counts its iterations. Empty: train `model`.")
    global_grad_scale: str = setting(Choice("mean", "sum"), "mean",
                                     "What the global optimizer gets: `mean`: the workers' summed "
                                     "gradients / num_all_workers; `sum`: GeoMX's sum of the "
                                     "workers' mean gradients (rescale_grad = 1).")

    @property
    def effective_worker_lr(self) -> float:
        """Learning rate for local steps (``worker_lr``, or ``lr`` when 0)."""
        return self.worker_lr or self.lr

    def optimizer_config(self, which: str, lr: float, extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The JSON config of the global (``which="optimizer"``) or worker optimizer:
        name, lr, weight decay, momentum where it applies, ``extra`` (what the job adds,
        e.g. DC-ASGD's lamda, rescale_grad), then the ``*_options`` on top. None for 'none'."""
        name = getattr(self, which)
        if name == "none":
            return None
        cfg: dict[str, Any] = {"name": name, "lr": lr, "wd": self.weight_decay}
        if name in MOMENTUM_OPTIMIZERS:
            cfg["momentum"] = self.momentum
        cfg.update(extra or {})
        cfg.update(parse_optimizer_options(getattr(self, f"{which}_options"), f"training.{which}_options"))
        return cfg

    def _check_optimizers(self, path: str) -> None:
        for which, lr in (("optimizer", self.lr), ("worker_optimizer", self.effective_worker_lr)):
            cfg = self.optimizer_config(which, lr)
            if cfg is None:
                continue
            options = {k: v for k, v in cfg.items() if k != "name"}
            try:
                create_optimizer(cfg["name"], **options)
            except ValueError as exc:
                raise ScenarioError(f"{which} = {cfg['name']!r}: {exc}", path=f"{path}.{which}_options",
                                    value=list(getattr(self, f"{which}_options"))) from None

    @property
    def dataset_options(self) -> dict[str, Any]:
        """Loader options of the file datasets (``load_dataset`` keywords)."""
        if self.dataset == "libsvm":
            return {"n_features": self.libsvm_features} if self.libsvm_features else {}
        if self.dataset == "csv":
            column = self.label_column
            return {"label_column": int(column) if column.lstrip("-").isdigit() else column}
        return {}

    def _check(self, path: str) -> None:
        self._check_optimizers(path)
        if self.dataset in FILE_DATASETS and not self.data_path:
            raise ScenarioError(
                f"dataset = {self.dataset!r} reads your file and needs data_path; allowed: a path to a "
                f"{self.dataset} file (relative to the scenario file)",
                path=f"{path}.data_path", value=self.data_path, allowed=f"a {self.dataset} file")
        if self.algorithm:
            self._check_algorithm(path)
        elif self.dataset in TABLE_DATASETS:
            raise ScenarioError(
                f"dataset {self.dataset!r} is a table for the algorithms; allowed with a model: "
                f"{quote_list((*IMAGE_DATASETS, 'synthetic', *FILE_DATASETS))}, or set "
                "training.algorithm",
                path=f"{path}.dataset", value=self.dataset,
                allowed=quote_list((*IMAGE_DATASETS, "synthetic", *FILE_DATASETS)))
        if self.model == "phantom":
            given = [k for k, v in (("phantom_params", self.phantom_params),
                                    ("phantom_layers", self.phantom_layers),
                                    ("phantom_preset", self.phantom_preset)) if v]
            if len(given) != 1:
                problem = ("model = 'phantom' needs its tensor sizes" if not given
                           else f"set only one of them, got {', '.join(given)}")
                raise ScenarioError(
                    f"{problem}; allowed: exactly one of phantom_params, phantom_layers, phantom_preset",
                    path=f"{path}.model", value=self.model,
                    allowed="exactly one of phantom_params, phantom_layers, phantom_preset")
        if self.model == "cnn" and self.dataset not in IMAGE_DATASETS:
            raise ScenarioError(
                f"model = 'cnn' needs an image dataset, got {self.dataset!r}; allowed: {quote_list(IMAGE_DATASETS)}",
                path=f"{path}.dataset", value=self.dataset, allowed=quote_list(IMAGE_DATASETS))


    def _check_algorithm(self, path: str) -> None:
        """``algorithm`` replaces ``model`` and ``program``: setting both is refused."""
        for key, value, default in (("model", self.model, "mlp"), ("program", self.program, ""),
                                    ("layer_compute", self.layer_compute, "off")):
            if value != default:
                raise ScenarioError(
                    f"set either training.algorithm ({self.algorithm!r}) or training.{key} "
                    f"({value!r}), not both; allowed with an algorithm: {key} = {default!r}",
                    path=f"{path}.{key}", value=value, allowed=repr(default))
        from geomx.algorithms.data import REGRESSION
        from geomx.algorithms.job import AlgorithmError
        from geomx.algorithms.program import check_options
        from geomx.algorithms.registry import info_of

        task = info_of(self.algorithm).task
        is_regression = self.dataset in REGRESSION
        if task in ("classification", "regression") and is_regression != (task == "regression"):
            fits = (quote_list(REGRESSION) if task == "regression"
                    else f"any other than {quote_list(REGRESSION)}")
            raise ScenarioError(
                f"algorithm {self.algorithm!r} needs a {task} data set, {self.dataset!r} is "
                f"{'regression' if is_regression else 'classification'}; allowed: {fits}",
                path=f"{path}.dataset", value=self.dataset, allowed=fits)

        try:
            check_options(self.algorithm, self.program_args)
        except AlgorithmError as e:
            raise ScenarioError(str(e), path=f"{path}.program_args", value=list(self.program_args),
                                allowed="the algorithm's options (docs/algorithms.md)") from None
