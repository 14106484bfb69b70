"""``[training]``: the model, the data and how they are split, and the optimizers."""

from __future__ import annotations

from dataclasses import dataclass

from geomx.algorithms.data import TABLE_DATASETS
from geomx.algorithms.registry import ALGORITHM_NAMES
from geomx.scenario.errors import ScenarioError, quote_list
from geomx.scenario.kinds import Choice, Integer, ListOf, Real, Section, Text, setting


MODELS = ("softmax", "mlp", "cnn", "phantom")
IMAGE_DATASETS = ("digits", "mnist", "fashion_mnist")
SERVER_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "dcasgd", "dcasgd_shared", "none")
WORKER_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "none")


@dataclass(frozen=True)
class TrainingConfig(Section):
    """The model, the data and how they are split, and the optimizers."""

    model: str = setting(Choice(*MODELS), "mlp",
                         "`phantom`: tensors with sizes only (no data), for emulating large models.")
    hidden: tuple[int, ...] = setting(ListOf(Integer(min=1)), [64], "Hidden layer sizes of the mlp.")
    dataset: str = setting(Choice(*IMAGE_DATASETS, "synthetic", *TABLE_DATASETS), "digits",
                           "`digits`: scikit-learn 8x8 digits; `synthetic`: seeded generated data (see synthetic_*). "
                           "With `algorithm` only: scikit-learn's shipped `iris`, `wine`, `breast_cancer`, "
                           "`diabetes` and generated `blobs`, `classification`, `regression`, `moons` "
                           "(sizes from synthetic_*), standardised (geomx/algorithms/data.py).")
    data_path: str = setting(Text(), "",
                             "mnist / fashion_mnist: directory with the IDX files, or an .npz file.")
    partition: str = setting(Choice("iid", "by_class", "dirichlet"), "iid",
                             "How training data is split across workers.")
    dirichlet_alpha: float = setting(Real(min=0, min_open=True), 0.5,
                                     "Concentration for partition = dirichlet (smaller = more skewed).")
    batch_size: int = setting(Integer(min=1), 32, "Samples per worker per iteration.")
    lr: float = setting(Real(min=0, min_open=True), 0.01, "Learning rate of the global-server optimizer.")
    optimizer: str = setting(Choice(*SERVER_OPTIMIZERS), "adam",
                             "Optimizer run by the global servers (`none`: store the pushed values).")
    momentum: float = setting(Real(min=0, max=1, max_open=True), 0.9, "Momentum for momentum / nesterov.")
    weight_decay: float = setting(Real(min=0), 0.0, "L2 weight decay.")
    worker_optimizer: str = setting(Choice(*WORKER_OPTIMIZERS), "sgd",
                                    "Optimizer for local steps on workers (HFA, ESync).")
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
                           "`package.module:fn`; it defines `async def main(kv, ctx)`. Empty: the "
                           "built-in trainer.")
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

    def _check(self, path: str) -> None:
        if self.algorithm:
            self._check_algorithm(path)
        elif self.dataset in TABLE_DATASETS:
            raise ScenarioError(
                f"dataset {self.dataset!r} is a table for the algorithms; allowed with a model: "
                f"{quote_list((*IMAGE_DATASETS, 'synthetic'))}, or set training.algorithm",
                path=f"{path}.dataset", value=self.dataset,
                allowed=quote_list((*IMAGE_DATASETS, "synthetic")))
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
