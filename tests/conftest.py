"""Fixtures for every test folder. Plain functions and constants shared between tests
are in ``tests/helpers``."""

import pytest

from geomx.runtime import security
from geomx.scenario import load_scenario

from tests.helpers.paths import SCENARIOS


@pytest.fixture
def scenario_of(tmp_path):
    """Load a built-in scenario with overrides; runs go to the test's tmp folder."""

    def load(name: str, *overrides: str):
        return load_scenario(SCENARIOS / name,
                             [f"run.out_dir={tmp_path / 'runs'}", "run.progress=false", *overrides])

    return load


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    """A self-signed certificate and its key (paths), made once per test module; the test
    is skipped where neither the 'cryptography' package nor the openssl command exists."""
    if security.tls_tooling() is None:
        pytest.skip("TLS test needs the 'cryptography' package or the 'openssl' command; "
                    "neither is available")
    return security.generate_self_signed(tmp_path_factory.mktemp("tls"))
