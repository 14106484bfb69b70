import os
from pathlib import Path

import pytest

from geomx.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


@pytest.fixture
def scenario_of(tmp_path):
    """Load a built-in scenario with overrides; runs go to the test's tmp folder."""

    def load(name: str, *overrides: str):
        return load_scenario(SCENARIOS / name,
                             [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false", *overrides])

    return load
