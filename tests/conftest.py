"""Shared fixtures: tiny random models built once per session."""

from __future__ import annotations

import os

import pytest

from contract.env import THREADS

# The engine's default is one thread per physical core: the suite's many engine children (started
# directly or by the studio, which pass the environment on) would each take every core. One thread
# each, unless a test sets -t or this variable itself (tests/test_engine_threads.py).
os.environ.setdefault(THREADS, "1")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama(models_dir):
    """A tiny llama directory (float32, GQA 2) used by engine and studio integration tests."""
    from tests.tiny_models import make_hf_model

    return make_hf_model(models_dir, "llama")


@pytest.fixture(scope="session")
def tiny_llama_noeos(tiny_llama, models_dir):
    """The tiny llama without an end-of-generation token: random weights would otherwise end some
    completions early at random, and server tests want every completion to run to its length."""
    import shutil

    from tests.tiny_models import strip_eos

    out = models_dir / "llama-noeos"
    if not out.exists():
        shutil.copytree(tiny_llama, out)
        strip_eos(out)
    return out


@pytest.fixture(scope="module")
def engine_factory():
    """Starts real engine children (CPU backend) and stops every one at the end of the module."""
    from tests.engine_helpers import Engine

    started = []

    def start(model, *args, env=None, api_key=None, ready=True):
        eng = Engine(model, *args, env=env, api_key=api_key)
        started.append(eng)
        return eng.wait_ready() if ready else eng

    yield start
    for eng in started:
        eng.stop()


@pytest.fixture(scope="module")
def loaded_llama(tiny_llama):
    """The tiny llama loaded in this process (one per module: tests may swap its end tokens), with no
    end-of-generation token, so that every run of the random weights reaches its length."""
    from engine.loader import load_model

    loaded = load_model(tiny_llama)
    loaded.tokenizer.eos_ids = set()
    return loaded
