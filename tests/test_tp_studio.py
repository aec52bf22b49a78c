"""The split in the studio: /api/load and the Load form take tp / tensor_split / split_mode, the flags
reach the real engine child (CPU backend), and the memory estimate divides by the split."""

import pytest
from pydantic import ValidationError

from settings import LoadDefaults, LoadRequest
from studio.catalog import weights_per_gpu
from studio.flags import ExtraArgsError, options_from_settings, parse_extra_args
from studio.tui.load_form import check_load_form, form_values
from tests.test_studio_integration import load, studio  # noqa: F401  (the real-engine studio fixture)


def test_load_fields_become_engine_flags():
    options = options_from_settings(LoadDefaults(tp=2, tensor_split="3,1", split_mode="row"))
    assert (options["--tp"], options["--tensor-split"], options["--split-mode"]) == ("2", "3,1", "row")
    assert "--tp" not in options_from_settings(LoadDefaults())  # unset: the engine's one GPU


@pytest.mark.parametrize("body", [{"tp": 9}, {"tp": 0}, {"tensor_split": "a,b"}, {"tensor_split": "1,,1"},
                                  {"split_mode": "rows"}])
def test_bad_split_fields_are_refused(body):
    with pytest.raises(ValidationError):
        LoadRequest(model="m", **body)


@pytest.mark.parametrize("args, message", [(["-ts", "1,x"], "proportions per GPU"), (["-ts", "0,0"], "proportions"),
                                           (["--split-mode", "rows"], "rows"), (["--tp", "0"], "--tp")])
def test_bad_split_extra_args_are_refused(args, message):
    with pytest.raises(ExtraArgsError, match=message):
        parse_extra_args(args)


def test_memory_estimate_divides_by_the_split():
    gib = 1 << 30
    assert weights_per_gpu(16 * gib) == 16 * gib
    assert weights_per_gpu(16 * gib, tp=2) == 8 * gib
    assert weights_per_gpu(16 * gib, tensor_split="3,1") == 12 * gib  # the most loaded GPU
    assert weights_per_gpu(16 * gib, tp=2, tensor_split="0,1,1") == 8 * gib  # a zero leaves a GPU out


def test_load_form_takes_the_split_and_shows_the_share():
    base = dict(defaults=LoadDefaults(), stored_exact=None, env={}, size_bytes=8 << 30)
    values = {**form_values(LoadDefaults()), "model": "m", "tp": "2", "tensor_split": "1,1"}
    check = check_load_form(values, **base)
    assert check.ok, check.errors
    assert (check.request.tp, check.request.tensor_split) == (2, "1,1")
    assert check.per_gpu == 4 << 30
    bad = check_load_form({**values, "tensor_split": "1;1"}, **base)
    assert not bad.ok and "tensor_split" in bad.errors
    assert form_values(LoadDefaults(tensor_split="3,1"))["tensor_split"] == "3,1"


async def test_api_load_with_a_split_runs_a_tp2_engine(studio):  # noqa: F811
    code, body = await load(studio, tp=2, tensor_split="1,1", exact_concurrency="on")
    assert code == 200, body
    assert body["exact_concurrency"] == "on"
    i = body["argv"].index("--tp")
    assert body["argv"][i : i + 4] == ["--tp", "2", "--tensor-split", "1,1"]
    resp = await studio.post("/v1/completions", json={"model": studio.model, "prompt": "Hello", "max_tokens": 4,
                                                      "temperature": 0})
    assert resp.status == 200 and (await resp.json())["usage"]["completion_tokens"] == 4


async def test_api_load_with_a_split_the_model_cannot_take_is_a_named_failure(studio):  # noqa: F811
    code, body = await load(studio, tp=4)
    assert 400 <= code < 500, body
    assert "--tp 4 does not divide the model's 2 KV heads" in body["error"]["message"]
