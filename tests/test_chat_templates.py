"""Issue 34 item 2: the chat templates of the major model families (tests/data/chat_templates.json, as their
GGUF files carry them) parse and render in the engine's bounded sandbox, loop controls included, exactly as
transformers renders them (its render_jinja_template: the reference for what a template means)."""

import json
from pathlib import Path

import pytest
from jinja2 import TemplateError
from transformers.utils.chat_template_utils import render_jinja_template

from engine.chat_template import ChatTemplate, ChatTemplateError

DATA = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text())["templates"]
BOS, EOS = "<|bos|>", "<|eos|>"
WITH_SYSTEM = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 + 3? Think {{ braces }} through."},
]
FAMILIES = ("llama-3", "qwen-2.5", "qwen-3", "mistral", "gemma", "deepseek", "command-r7b", "phi")


def test_every_major_family_is_in_the_data():
    for family in FAMILIES:
        assert any(name.startswith(family) for name in DATA), family
    assert "{% break %}" in DATA["command-r7b"]["template"].replace("{%- break %}", "{% break %}")


def reference(source: str, messages: list[dict], add_generation_prompt: bool) -> str:
    # transformers knows {% generation %} (Phi-4-reasoning has it) only when asked for the assistant mask
    return render_jinja_template([messages], chat_template=source, add_generation_prompt=add_generation_prompt,
                                 return_assistant_tokens_mask="{% generation %}" in source,
                                 bos_token=BOS, eos_token=EOS)[0][0]


@pytest.mark.parametrize("name", sorted(DATA))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_template_renders_as_transformers_does(name, add_generation_prompt):
    source = DATA[name]["template"]
    ours = ChatTemplate(source, BOS, EOS)
    for messages in (WITH_SYSTEM, WITH_SYSTEM[1:]):  # some families refuse a system turn
        try:
            want = reference(source, messages, add_generation_prompt)
        except TemplateError:
            with pytest.raises(ChatTemplateError):
                ours.render(messages, add_generation_prompt)
            continue
        got = ours.render(messages, add_generation_prompt)
        assert got == want
        assert "And 3 + 3? Think {{ braces }} through." in got
        return
    pytest.fail(f"{name}: no conversation rendered")


def test_loop_controls_work_in_the_sandbox():
    source = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
              "{{ m.content }}|{% if loop.index > 2 %}{% break %}{% endif %}{% endfor %}")
    assert ChatTemplate(source).render(WITH_SYSTEM) == "What is 2 + 2?|4.|"


async def test_an_engine_loads_a_template_with_loop_controls(engine_factory, tiny_llama_noeos, tmp_path):
    """Cohere's command-r7b template made the load fail (exit 4) before loop controls were enabled."""
    import aiohttp

    path = tmp_path / "command-r7b.jinja"
    path.write_text(DATA["command-r7b"]["template"])
    eng = engine_factory(tiny_llama_noeos, "-np", "1", "-c", "256", "--chat-template-file", str(path))
    async with aiohttp.ClientSession() as s:
        async with s.post(eng.base + "/apply-template", json={"messages": WITH_SYSTEM}) as r:
            assert r.status == 200
            prompt = (await r.json())["prompt"]
        async with s.get(eng.base + "/props") as r:
            props = await r.json()
    want = render_jinja_template([WITH_SYSTEM], chat_template=DATA["command-r7b"]["template"],
                                 add_generation_prompt=True, bos_token=props["bos_token"] or "",
                                 eos_token=props["eos_token"] or "")[0][0]
    assert prompt == want
