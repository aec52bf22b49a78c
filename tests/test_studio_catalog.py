"""The model catalog reads GGUF and Hugging Face metadata from headers, without loading weights."""

import json
import struct
from pathlib import Path

import pytest

import studio
from studio.catalog import Catalog, bundled_models_dir, describe, read_gguf, read_hf, safetensors_header
from tests.test_studio_standin import write_gguf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    model.save_pretrained(path, safe_serialization=True)
    expected = sum(p.numel() for p in model.state_dict().values())
    return path, expected


def test_hf_dir_metadata(hf_dir):
    path, expected_params = hf_dir
    info = read_hf(path)
    assert info.id == "tiny-llama"
    assert info.format == "hf"
    assert info.architecture == "llama"
    assert info.parameters == expected_params
    assert info.tensor_types == ["BF16"]
    assert info.native_context == 512
    assert info.size_bytes == sum(p.stat().st_size for p in path.iterdir())
    assert info.error is None


def test_safetensors_header_is_read_without_the_data(tmp_path):
    header = json.dumps({"w": {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]},
                         "__metadata__": {"format": "pt"}}).encode()
    path = tmp_path / "x.safetensors"
    # Data bytes that are not even valid: only the header may be read.
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\xff" * 12)
    assert safetensors_header(path)["w"]["shape"] == [2, 3]


@pytest.mark.parametrize("blob", [b"", b"\x01", struct.pack("<Q", 1 << 40) + b"{}", struct.pack("<Q", 2) + b"[]"])
def test_bad_safetensors_header_is_an_error(tmp_path, blob):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    with pytest.raises(ValueError):
        safetensors_header(path)


def test_gguf_metadata(tmp_path):
    path = tmp_path / "tiny-q.gguf"
    params = write_gguf(path, context=4096)
    info = read_gguf(path)
    assert info.id == "tiny-q"
    assert info.format == "gguf"
    assert info.architecture == "llama"
    assert info.parameters == params
    assert info.tensor_types == ["F16", "F32"]
    assert info.native_context == 4096
    assert info.size_bytes == path.stat().st_size


def test_damaged_model_is_listed_with_its_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf at all")
    info = describe(bad)
    assert info.error and "magic" in info.error.lower()
    assert (info.id, info.format, info.size_bytes) == ("broken", "gguf", 17)


def test_scan_finds_models_in_nested_folders_and_dedupes_ids(tmp_path, hf_dir):
    hf_path, _ = hf_dir
    (tmp_path / "a" / "deeper").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    write_gguf(tmp_path / "a" / "deeper" / "same.gguf")
    write_gguf(tmp_path / "b" / "same.gguf", arch="qwen2", context=1024)
    (tmp_path / "b" / "notes.txt").write_text("not a model")
    (tmp_path / "b" / ".hidden.gguf").write_bytes(b"skip me")
    catalog = Catalog([tmp_path / "a", tmp_path / "b", hf_path, tmp_path / "missing"], include_bundled=False)
    models = catalog.scan()
    assert [m.id for m in models] == ["same", "same~2", "tiny-llama"]
    assert [m.architecture for m in models] == ["llama", "qwen2", "llama"]
    assert catalog.find("same~2").native_context == 1024
    assert catalog.find(str(tmp_path / "b" / "same.gguf")).architecture == "qwen2"
    assert catalog.find("nothing-like-this") is None


def test_the_same_folder_twice_lists_each_model_once(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    assert [m.id for m in Catalog([tmp_path, tmp_path], include_bundled=False).scan()] == ["m"]


def test_rescan_sees_a_changed_file(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, context=1024)
    catalog = Catalog([tmp_path], include_bundled=False)
    assert catalog.scan()[0].native_context == 1024
    write_gguf(path, context=8192, types=("F32",))
    assert catalog.scan()[0].native_context == 8192


def test_bundled_folder_is_the_repos_assets_models():
    assert bundled_models_dir() == Path(studio.__file__).resolve().parent.parent / "assets" / "models"
    roots = Catalog(["/x"]).roots()
    assert roots[-1] == bundled_models_dir() and len(roots) == 2


@pytest.fixture(scope="module")
def q4km_dir(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.tiny_models import make_q4_k_m_gguf

    where = tmp_path_factory.mktemp("q4km")
    quantized, f32 = make_q4_k_m_gguf(where)
    folder = where / "models"
    folder.mkdir()
    quantized.rename(folder / "tiny-q4_k_m.gguf")
    f32.rename(folder / "tiny-f32.gguf")
    return folder


def test_quant_mix_comes_from_the_gguf_header(q4km_dir):
    info = read_gguf(q4km_dir / "tiny-q4_k_m.gguf")
    # 2 layers: Q6_K for output.weight and layer 1's attn_v / ffn_down (llama.cpp's use_more_bits)
    assert info.tensor_counts == {"Q4_K": 13, "F32": 5, "Q6_K": 3}
    assert info.quant_mix == "Q4_K_M: Q4_K 13, F32 5, Q6_K 3"
    plain = read_gguf(q4km_dir / "tiny-f32.gguf")  # no general.file_type: the counts alone
    assert plain.quant_mix == "F32 21"


async def test_api_models_carries_the_quant_mix(q4km_dir, tmp_path):
    from aiohttp.test_utils import TestClient, TestServer

    from settings import SettingsStore
    from studio.api import build_app
    from studio.manager import LoadManager

    manager = LoadManager(SettingsStore(tmp_path / "config"), catalog=Catalog([q4km_dir], include_bundled=False),
                          logs=tmp_path / "logs")
    client = TestClient(TestServer(build_app(manager)))
    await client.start_server()
    try:
        resp = await client.get("/api/models")
        assert resp.status == 200
        models = {m["id"]: m for m in (await resp.json())["models"]}
    finally:
        await client.close()
    assert models["tiny-q4_k_m"]["quant_mix"] == "Q4_K_M: Q4_K 13, F32 5, Q6_K 3"
    assert models["tiny-q4_k_m"]["tensor_counts"] == {"Q4_K": 13, "F32": 5, "Q6_K": 3}
