"""Histogram decision trees grown through the parameter server, level by level.

The pattern of distributed GBDT systems (Chen & Guestrin 2016, XGBoost's histogram
method; Ke et al. 2017, LightGBM's data-parallel mode), over the PS:

1. **Bins.** Every worker pushes its per-feature minimum and maximum into its own row
   (an all-gather), then a fine uniform histogram of its rows over the global range; the
   summed fine histogram gives every worker the same quantile bin edges (``max_bins``
   bins per feature). Rows are then bin indices.
2. **Levels.** For the nodes of one depth, every worker pushes per (tree, node, feature,
   bin) the sums of its rows' statistics (class weights and counts for classification
   trees, gradient, hessian and count for boosting); the local servers add their DC's,
   the global server the DCs'. Every worker pulls the total and makes the *same* split
   decision for each node -- the best bin threshold by the caller's gain -- so the split
   decisions are a deterministic function of the pulled histograms and never travel on
   their own. A child's totals are the parent's sums left and right of the chosen
   threshold, so the last level needs no extra round: a depth-``D`` tree costs ``D``
   rounds, however many trees grow at once.

Trees are complete binary heaps (node ``i`` has children ``2i + 1``, ``2i + 2``); a
node that does not split is a leaf and its rows stop taking part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from geomx.algorithms.job import AlgorithmError, AlgorithmJob

__all__ = ["FINE_BINS", "check_tree_options", "bin_keys", "compute_bins", "binned", "level_keys", "Forest", "grow",
           "gini_gain", "newton_gain", "class_values", "newton_values"]

FINE_BINS = 256


def check_tree_options(opts: Any) -> None:
    """``--depth`` and ``--max-bins``, shared by every algorithm that grows these trees."""
    if not 1 <= opts.depth <= 12:
        raise AlgorithmError(f"--depth {opts.depth}: allowed: 1..12")
    if not 2 <= opts.max_bins <= FINE_BINS:
        raise AlgorithmError(f"--max-bins {opts.max_bins}: allowed: 2..{FINE_BINS}")


# ---------------------------------------------------------------- bins
def bin_keys(job: AlgorithmJob) -> dict[str, np.ndarray]:
    f = job.table.num_features
    return {"bin_range": np.zeros((job.num_workers, 2, f)), "bin_fine": np.zeros((f, FINE_BINS))}


async def compute_bins(job: AlgorithmJob, max_bins: int) -> np.ndarray:
    """Quantile bin edges ``(features, max_bins - 1)`` from the summed fine histograms
    (+inf pads features with fewer distinct edges)."""
    x = job.x
    rng = await job.gather("bin_range", np.stack([x.min(axis=0), x.max(axis=0)]))
    lo, hi = rng[:, 0].min(axis=0), rng[:, 1].max(axis=0)
    width = np.where(hi > lo, (hi - lo) / FINE_BINS, 1.0)
    fine_idx = np.clip(((x - lo) / width).astype(np.int64), 0, FINE_BINS - 1)
    local = np.zeros((x.shape[1], FINE_BINS))
    for j in range(x.shape[1]):
        local[j] = np.bincount(fine_idx[:, j], minlength=FINE_BINS)
    fine = await job.allreduce("bin_fine", local)
    edges = np.full((x.shape[1], max_bins - 1), np.inf)
    for j in range(x.shape[1]):
        cdf = np.cumsum(fine[j]) / fine[j].sum()
        cuts = np.searchsorted(cdf, np.arange(1, max_bins) / max_bins, side="left")
        uniq = np.unique(np.minimum(cuts, FINE_BINS - 2))
        vals = lo[j] + (uniq + 1) * width[j]  # the right edge of a fine bin
        vals = vals[vals < hi[j]]
        edges[j, :len(vals)] = vals
    return edges


def binned(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin index of every value: ``x <= edges[j, b]`` first holds at bin ``b``."""
    out = np.empty(x.shape, dtype=np.int64)
    for j in range(x.shape[1]):
        out[:, j] = np.searchsorted(edges[j], x[:, j], side="left")
    return out


# ---------------------------------------------------------------- gains and leaf values
def gini_gain(left: np.ndarray, right: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Weighted Gini decrease; stats are [class weights..., count] (last = row count)."""
    def score(s: np.ndarray) -> np.ndarray:
        w = s[..., :-1]
        n = w.sum(axis=-1)
        return np.where(n > 0, (w * w).sum(axis=-1) / np.where(n > 0, n, 1.0), 0.0)
    return score(left) + score(right) - score(parent)


def class_values(stats: np.ndarray) -> np.ndarray:
    """A leaf's class distribution."""
    w = stats[..., :-1]
    n = w.sum(axis=-1, keepdims=True)
    return np.where(n > 0, w / np.where(n > 0, n, 1.0), 1.0 / w.shape[-1])


def newton_gain(l2: float) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """XGBoost's gain ``GL^2/(HL+l2) + GR^2/(HR+l2) - G^2/(H+l2)``; stats [g, h, count]."""
    def gain(left: np.ndarray, right: np.ndarray, parent: np.ndarray) -> np.ndarray:
        s = lambda a: a[..., 0] ** 2 / (a[..., 1] + l2)  # noqa: E731
        return s(left) + s(right) - s(parent)
    return gain


def newton_values(l2: float) -> Callable[[np.ndarray], np.ndarray]:
    def value(stats: np.ndarray) -> np.ndarray:
        return (-stats[..., 0] / (stats[..., 1] + l2))[..., None]
    return value


# ---------------------------------------------------------------- the forest
@dataclass
class Forest:
    """``T`` trees as heaps of ``2^(depth+1) - 1`` nodes."""

    feature: np.ndarray     # (T, M) int, -1 for a leaf
    threshold: np.ndarray   # (T, M) int: bin <= threshold goes left
    value: np.ndarray       # (T, M, V)
    depth: int

    def leaves(self, xb: np.ndarray) -> np.ndarray:
        """The leaf each row of binned ``xb`` reaches in each tree: (T, n)."""
        t_count = self.feature.shape[0]
        node = np.zeros((t_count, len(xb)), dtype=np.int64)
        rows = np.arange(len(xb))
        for _ in range(self.depth):
            for t in range(t_count):
                f = self.feature[t, node[t]]
                split = f >= 0
                go_right = xb[rows, np.maximum(f, 0)] > self.threshold[t, node[t]]
                node[t] = np.where(split, 2 * node[t] + 1 + go_right, node[t])
        return node

    def predict(self, xb: np.ndarray) -> np.ndarray:
        """Leaf values of every row in every tree: (T, n, V)."""
        node = self.leaves(xb)
        return np.stack([self.value[t, node[t]] for t in range(node.shape[0])])


def level_keys(name: str, trees: int, depth: int, features: int, bins: int,
               channels: int, *, sampled: bool = False) -> dict[str, np.ndarray]:
    """One key per level: the histograms of its ``2^level`` nodes per tree -- of only the
    left children below the root unless each node draws its own features (``sampled``):
    a right child's histogram is its parent's minus its sibling's (LightGBM's histogram
    subtraction), which halves what travels."""
    return {f"{name}{lvl}": np.zeros((trees, 2 ** lvl if sampled or lvl == 0 else 2 ** (lvl - 1),
                                      features, bins, channels))
            for lvl in range(depth)}


async def grow(job: AlgorithmJob, key: str, xb: np.ndarray, stats: np.ndarray, *, depth: int,
               bins: int, gain: Callable[..., np.ndarray], value: Callable[..., np.ndarray],
               min_leaf: float = 1.0, min_gain: float = 1e-12,
               feature_sets: Callable[[int, int], np.ndarray] | None = None,
               before_round: Callable[[], Any] | None = None) -> Forest:
    """Grow ``T = stats.shape[0]`` trees at once on this worker's binned rows ``xb``
    (n, F) with per-tree row statistics ``stats`` (T, n, C; the last channel the row
    count or weight that ``min_leaf`` bounds). Keys ``key0..key{depth-1}``
    (:func:`level_keys`, with ``m`` features) must be declared. ``feature_sets(level,
    nodes)`` gives the ``m`` features each (tree, node) of a level may split on,
    (T, nodes, m) ints, the same on every worker (a random forest's draws); only those
    features' histograms travel. None: every feature (m = F)."""
    t_count, n, channels = stats.shape
    f_count = xb.shape[1]
    nodes = 2 ** (depth + 1) - 1
    feature = np.full((t_count, nodes), -1, dtype=np.int64)
    threshold = np.zeros((t_count, nodes), dtype=np.int64)
    value_all: np.ndarray | None = None
    pos = np.zeros((t_count, n), dtype=np.int64)  # heap index, -1 when in a leaf
    previous: np.ndarray | None = None            # the last level's summed histograms
    for lvl in range(depth):
        width, offset = 2 ** lvl, 2 ** lvl - 1
        sets = (np.broadcast_to(np.arange(f_count), (t_count, width, f_count))
                if feature_sets is None else feature_sets(lvl, width))
        m = sets.shape[2]
        subtract = feature_sets is None and previous is not None
        step = 2 if subtract else 1                # push left children only, or every node
        hist = np.zeros((t_count, width // step, m, bins, channels))
        for t in range(t_count):
            live = np.nonzero(pos[t] >= 0)[0]
            local = pos[t, live] - offset
            if subtract:
                keep = local % 2 == 0
                live, local = live[keep], local[keep]
            if len(live) == 0:
                continue
            chosen = sets[t, local]                                   # (n_live, m)
            xsel = np.take_along_axis(xb[live], chosen, axis=1)
            slot = local // step
            flat = ((slot[:, None] * m + np.arange(m)[None, :]) * bins + xsel).ravel()
            for c in range(channels):
                hist[t, ..., c] = np.bincount(flat, weights=np.repeat(stats[t, live, c], m),
                                              minlength=(width // step) * m * bins
                                              ).reshape(width // step, m, bins)
        if before_round is not None:
            await before_round()
        hist = await job.allreduce(f"{key}{lvl}", hist)
        if subtract:
            assert previous is not None
            full = np.zeros((t_count, width, m, bins, channels))
            full[:, 0::2] = hist
            parent_split = feature[:, 2 ** (lvl - 1) - 1:2 ** lvl - 1] >= 0     # (T, width/2)
            full[:, 1::2] = np.where(parent_split[..., None, None, None], previous - hist, 0.0)
            hist = full
        previous = hist
        parent = hist[:, :, 0].sum(axis=2)  # (T, width, C): any feature's bins add up
        if value_all is None:
            root = value(parent)                                      # (T, 1, V)
            value_all = np.zeros((t_count, nodes, root.shape[-1]))
            value_all[:, 0] = root[:, 0]
        left = np.cumsum(hist, axis=3)[:, :, :, :-1]                  # (T, width, m, bins-1, C)
        right = parent[:, :, None, None, :] - left
        g = gain(left, right, parent[:, :, None, None, :])
        ok = (left[..., -1] >= min_leaf) & (right[..., -1] >= min_leaf)
        g = np.where(ok, g, -np.inf).reshape(t_count, width, -1)
        best = g.argmax(axis=2)
        best_gain = np.take_along_axis(g, best[..., None], axis=2)[..., 0]
        best_j, best_b = np.divmod(best, bins - 1)
        tt, ww = np.nonzero(best_gain > min_gain)
        heap = offset + ww
        feature[tt, heap] = sets[tt, ww, best_j[tt, ww]]
        threshold[tt, heap] = best_b[tt, ww]
        lsum = left[tt, ww, best_j[tt, ww], best_b[tt, ww]]
        rsum = parent[tt, ww] - lsum
        value_all[tt, 2 * heap + 1] = value(lsum[:, None])[:, 0]
        value_all[tt, 2 * heap + 2] = value(rsum[:, None])[:, 0]
        for t in range(t_count):
            live = np.nonzero(pos[t] >= 0)[0]
            here = pos[t, live]
            f = feature[t, here]
            right_side = xb[live, np.maximum(f, 0)] > threshold[t, here]
            pos[t, live] = np.where(f >= 0, 2 * here + 1 + right_side, -1)
    assert value_all is not None
    return Forest(feature, threshold, value_all, depth)
