"""Incremental algorithms (incremental PCA from merged moments, mini-batch k-means)
through the parameter server, against scikit-learn."""

import pytest

from tests.algorithms.cases import CASES, run_case


@pytest.mark.parametrize("name", ["incremental_pca", "minibatch_kmeans"])
def test_matches_scikit_learn(tmp_path, name):
    row = run_case(CASES[name], tmp_path)
    assert row["ok"], row


@pytest.mark.slow
def test_codecs_apply_to_the_merged_statistics(tmp_path):
    """The moments travel through the codec like any gradient: FP16 sends a quarter of
    the float64 bytes on both tiers, and the components stay nearly as good."""
    dense = run_case(CASES["incremental_pca"], tmp_path)
    fp16 = run_case(CASES["incremental_pca"], tmp_path, "codec.type=fp16")
    assert fp16["summary"].bytes_wan < 0.4 * dense["summary"].bytes_wan
    assert fp16["geomx"] == pytest.approx(dense["geomx"], abs=0.01)
    assert fp16["geomx"] != dense["geomx"]  # it did go through the codec
