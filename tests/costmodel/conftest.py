"""Shared fixtures for the calibration tests: the shipped profiles, and the presets refitted
from them (once per session, about 7 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsim.costmodel.calibrate import fit_presets
from kvsim.costmodel.coefficients import (
    StepCoefficients,
    preset_coefficient_names,
    preset_coefficients,
)
from kvsim.costmodel.profiles import ProfileSet, load_profile_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shipped_profiles() -> Path:
    return ROOT / "profiles" / "vidur"


@pytest.fixture(scope="session")
def shipped(shipped_profiles: Path) -> ProfileSet:
    return load_profile_dir(shipped_profiles)


@pytest.fixture(scope="session")
def refitted(shipped: ProfileSet) -> dict[str, StepCoefficients]:
    """The five GPU presets' coefficients, fitted / scaled again from the shipped profiles."""
    return fit_presets(shipped)


@pytest.fixture(scope="session")
def presets() -> dict[str, StepCoefficients]:
    """The shipped coefficient files (package data), by GPU preset."""
    return {name: preset_coefficients(name) for name in preset_coefficient_names()}
