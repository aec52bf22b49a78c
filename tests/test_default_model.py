"""The bundled default model: its files, its card's claims, and that transformers runs it."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "assets" / "models" / "lockstep-pycode-13m"
SCRIPT = ROOT / "scripts" / "train_default_model.py"
REQUIRED = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "README.md", "training_report.json"]

# Ordinary stdlib-style code the model should find far more predictable than token frequencies do.
SNIPPET = '''import os
import sys


def main(argv=None):
    """Print the names in a directory, one per line."""
    if argv is None:
        argv = sys.argv[1:]
    for name in sorted(os.listdir(argv[0])):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((MODEL_DIR / "training_report.json").read_text())


def safetensors_header(path: Path) -> dict:
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def test_directory_is_complete_and_small():
    for name in REQUIRED:
        assert (MODEL_DIR / name).is_file(), name
    size = sum(p.stat().st_size for p in MODEL_DIR.iterdir() if p.is_file())
    assert size <= 40 * 1024 * 1024


def test_weights_are_16_bit_llama():
    header = safetensors_header(MODEL_DIR / "model.safetensors")
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes <= {"F16", "BF16"}, dtypes
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]


def test_report_beats_unigram_baseline_and_card_says_so(report):
    val, unigram = report["val_loss"], report["unigram_val_loss"]
    assert math.isfinite(val) and math.isfinite(unigram)
    # "A clear margin": at least one nat per token and a quarter of the baseline.
    assert val < unigram - 1.0
    assert val < 0.75 * unigram
    assert 5e6 <= report["parameters"] <= 20e6
    card = (MODEL_DIR / "README.md").read_text()
    assert f"| validation loss | {val:.4f} |" in card
    assert f"| unigram baseline on the validation split | {unigram:.4f} |" in card
    assert f"| train loss | {report['train_loss']:.4f} |" in card


def test_card_shows_a_fibonacci_completion(report):
    card = (MODEL_DIR / "README.md").read_text()
    sample = next(s for s in report["samples"] if s["prompt"] == "def fibonacci(n):")
    assert sample["completion"].strip()
    assert "def fibonacci(n):" + sample["completion"] in card


def test_tokenizer_config_and_chat_template():
    cfg = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert cfg["bos_token"] == "<|bos|>" and cfg["eos_token"] == "<|eos|>"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(cfg["chat_template"])
    messages = [{"role": "system", "content": "# helpers"}, {"role": "user", "content": "def fibonacci(n):"}]
    for add_generation_prompt in (True, False):
        text = template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=cfg["bos_token"], eos_token=cfg["eos_token"])
        assert text == "<|bos|># helpers\ndef fibonacci(n):"


def test_transformers_loads_it_with_sane_float32_logits(report):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    ids = tok(SNIPPET, return_tensors="pt").input_ids
    assert ids[0, 0].item() == tok.bos_token_id
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.float32
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.1
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    assert loss < report["unigram_val_loss"] - 1.0, loss


def test_recipe_smoke_runs_on_cpu(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "tiny"
    subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--steps", "3", "--device", "cpu",
                    "--out-dir", str(out)], check=True, capture_output=True, timeout=240)
    for name in REQUIRED:
        assert (out / name).is_file(), name
    tiny = json.loads((out / "training_report.json").read_text())
    assert tiny["steps"] == 3 and tiny["corpus"]["tiny_subset"]


@pytest.mark.parametrize("exact", [False, True], ids=["fast", "exact"])
def test_engine_logits_match_transformers(report, exact):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    loader = pytest.importorskip("engine.loader")
    runner = pytest.importorskip("engine.runner")
    loaded = loader.load_model(MODEL_DIR)
    ids = loaded.tokenizer.encode(SNIPPET)[:64]
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    got = runner.prompt_logits(loaded, ids, exact=exact)
    # The foundation issue's tolerance for float32 logits against transformers.
    assert abs(got - ref).max() <= 1e-4 * abs(ref).max()
