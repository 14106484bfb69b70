"""Where the repository's files are, independent of how deep a test file sits."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
EXAMPLES = ROOT / "examples"
QUICKSTART = SCENARIOS / "quickstart.toml"
