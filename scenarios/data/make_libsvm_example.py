"""Generate scenarios/data/libsvm_example.svm (+ .svm.t, the test set): a small sparse
3-class problem in LIBSVM format, like bag-of-words data (a few active features per row).

    PYTHONPATH=. python scenarios/data/make_libsvm_example.py

Each class has 12 "topic" features out of 60; a sample activates 8 features, each one of
its class's topics with probability 0.6, else any feature; values are term-frequency-like
in (0.1, 1]. Seeded, so the files are reproducible; kept under 50 KB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from geomx.ml.tabular import write_libsvm

N_FEATURES, N_CLASSES, TOPICS, ACTIVE = 60, 3, 12, 8


def make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    topics = np.arange(N_CLASSES * TOPICS).reshape(N_CLASSES, TOPICS)  # class c: features of row c
    y = rng.integers(0, N_CLASSES, size=n)
    x = np.zeros((n, N_FEATURES), np.float32)
    for i, c in enumerate(y):
        for _ in range(ACTIVE):
            j = rng.choice(topics[c]) if rng.random() < 0.6 else rng.integers(N_FEATURES)
            x[i, j] = np.round(rng.uniform(0.1, 1.0), 2)
    return x, y + 1  # LIBSVM files usually number classes from 1


def main() -> None:
    rng = np.random.default_rng(2024)
    here = Path(__file__).resolve().parent
    for name, n in (("libsvm_example.svm", 480), ("libsvm_example.svm.t", 120)):
        x, y = make(n, rng)
        path = write_libsvm(here / name, x, y, precision=2)
        print(f"{path}: {n} samples, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
