"""Shared fixtures: tiny random models built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(models_dir):
    """A tiny llama directory (float32, GQA 2) used by engine and studio integration tests."""
    from tests.tiny_models import make_hf_model

    return make_hf_model(models_dir, "llama")
