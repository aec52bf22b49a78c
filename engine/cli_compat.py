"""llama-server flags whose meaning the engine shares (defaults, reasoning, slots, names, saving), and the
llama-server flags it lacks, each named with the reason when a command line uses one."""

from __future__ import annotations

import argparse

from engine.threads import THREADS_HELP

# the draft model (-md) runs on the model's backend with its settings: its own ones are not supported
DRAFT_MODEL = ("settings of the draft model are not supported: -md PATH runs it on the model's backend with the "
               "model's KV cache types and --threads")
DRAFT_FLAGS = ("-devd", "--device-draft",
               "--spec-draft-device", "-ctkd", "--cache-type-k-draft", "--spec-draft-type-k", "-ctvd",
               "--cache-type-v-draft", "--spec-draft-type-v", "-td", "--threads-draft", "--spec-draft-threads", "-tbd",
               "--threads-batch-draft", "--spec-draft-threads-batch", "--spec-draft-p-min", "--draft-p-min")

# llama-server flags without an equivalent here: an unrecognized one is named with its reason.
LACKING = {
    **dict.fromkeys(DRAFT_FLAGS, DRAFT_MODEL),
    **dict.fromkeys(("-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf"),
                    "the engine reads local model files only (use -md PATH)"),
    "--lora": "LoRA adapters are not supported",
    "--lora-scaled": "LoRA adapters are not supported",
    "--grp-attn-n": "self-extend (group attention) is not supported",
    "--grp-attn-w": "self-extend (group attention) is not supported",
    "--mmproj": "multimodal projectors are not supported",
    "--mmproj-url": "multimodal projectors are not supported",
    "--embedding": "embeddings are not served",
    "--embeddings": "embeddings are not served",
    "--reranking": "reranking is not served",
    "--pooling": "embeddings are not served",
    "-hf": "the engine reads local model files only (use -m PATH)",
    "--hf-repo": "the engine reads local model files only (use -m PATH)",
    "--hf-file": "the engine reads local model files only (use -m PATH)",
    "--model-url": "the engine reads local model files only (use -m PATH)",
    "--models-dir": "router mode is not supported (one engine serves one model)",
    "--models-preset": "router mode is not supported (one engine serves one model)",
    "--rope-scaling": "rope scaling comes from the model's config",
    "--rope-freq-base": "rope settings come from the model's config",
    "--mlock": "the CPU backend memory-maps weights; locking is not supported",
}

# --chat-template NAME: llama-server's built-in names for the formats most models follow (BOS comes from the
# tokenizer, as with llama-server's own renderers).
BUILTIN_TEMPLATES = {
    "chatml": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "llama3": "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
              "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
              "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "llama2": "{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>\n{{ m['content'] }}\n"
              "<</SYS>>\n\n{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %}"
              "{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
    "mistral-v7": "{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT] "
                  "{{ m['content'] }}[/SYSTEM_PROMPT]{% elif m['role'] == 'user' %}[INST] {{ m['content'] }}"
                  "[/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
    "command-r": "{% for m in messages %}<|START_OF_TURN_TOKEN|>"
                 "{% if m['role'] == 'system' %}<|SYSTEM_TOKEN|>{% elif m['role'] == 'user' %}<|USER_TOKEN|>"
                 "{% else %}<|CHATBOT_TOKEN|>{% endif %}{{ m['content'] }}<|END_OF_TURN_TOKEN|>{% endfor %}"
                 "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}",
    "gemma": "{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
             "'user' }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
             "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
    "phi3": "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
    "zephyr": "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
              "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
}


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def add_compat_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("llama-server compatibility")
    add = g.add_argument
    add("--temp", type=float, default=None, metavar="T",
        help="default temperature for requests that give none (default: 0.8)")
    add("-n", "--n-predict", type=int, default=-1, metavar="N",
        help="most tokens a request generates when it sets no limit of its own; -1 = until the context is full "
             "(default)")
    add("-t", "--threads", type=int, default=None, metavar="N", help=THREADS_HELP)
    add("-tb", "--threads-batch", type=int, default=None, metavar="N",
        help="accepted: prompt processing uses the --threads pools")
    add("-cb", "--cont-batching", action="store_true", help="accepted: batching is always continuous")
    slots = g.add_mutually_exclusive_group()
    slots.add_argument("--slots", dest="slots_endpoint", action="store_true", default=True,
                       help="serve /slots (the default)")
    slots.add_argument("--no-slots", dest="slots_endpoint", action="store_false", help="answer /slots with 501")
    add("--tags", type=_names, default=[], metavar="A,B", help="tags reported by /v1/models")
    add("--no-jinja", action="store_true", help="accepted: templates are always rendered with Jinja")
    add("--chat-template", dest="chat_template_name", metavar="NAME|JINJA",
        help=f"a built-in template ({', '.join(BUILTIN_TEMPLATES)}) or Jinja source, instead of the model's")
    add("--reasoning-format", choices=("none", "deepseek", "deepseek-legacy", "auto"), default="auto",
        help="where a reasoning model's <think> text goes: deepseek/auto = message.reasoning_content, "
             "none = left in content (default: %(default)s)")
    add("--reasoning", choices=("on", "off", "auto"), default="auto",
        help="thinking for templates that support it: off renders enable_thinking=false (default: %(default)s)")
    add("--no-webui", "--no-ui", dest="no_webui", action="store_true",
        help="accepted: the engine serves no web UI (the studio is the UI)")
    add("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true",
        help="debug logging, and `__verbose` (the rendered prompt) in every completion response")
    add("--slot-save-path", metavar="DIR",
        help="directory for /slots/{id}?action=save|restore (off without it)")
    add("--cache-ram", type=int, default=None, metavar="MIB",
        help="accepted: prompt caches live in the KV pool with their slots; 0 matches (no host-memory cache)")
    add("--sleep-idle-seconds", type=int, default=-1, metavar="N",
        help="free the model's weights and KV cache after N seconds without a request, and load them again for "
             "the next one (the process stays up; /props says is_sleeping); -1 = never (default)")
    add("--keep", type=int, default=0, metavar="N",
        help="with --context-shift, the first N prompt tokens a shift keeps (-1 = the whole prompt; a request's "
             "n_keep wins) (default: %(default)s)")
    add("--swa-full", action="store_true", help="accepted: the KV cache always keeps every position")
    add("--spec-draft-n-min", type=int, default=0, metavar="N", help="accepted: drafts stop at --spec-draft-n-max")
    add("--backend-sampling", "--backend_sampling", dest="backend_sampling", action="store_true",
        help="accepted: tokens are sampled from each row on the host, the same with or without it")


def builtin_or_source(name: str) -> str:
    return BUILTIN_TEMPLATES.get(name, name)


def lacking_flags(argv: list[str]) -> list[str]:
    return [a for a in argv if a.split("=", 1)[0] in LACKING]


def explain_unknown(message: str) -> str:
    """argparse's 'unrecognized arguments: ...' with the reason for each llama-server flag we lack."""
    if not message.startswith("unrecognized arguments:"):
        return message
    flags: dict[str, list[str]] = {}  # reason -> the flags it covers, in the order given
    for a in message.split(":", 1)[1].split():
        flag = a.split("=", 1)[0]
        if flag in LACKING and flag not in flags.setdefault(LACKING[flag], []):
            flags[LACKING[flag]].append(flag)
    reasons = [f"{', '.join(names)}: {why}" for why, names in flags.items()]
    return message + ("" if not reasons else " (" + "; ".join(reasons) + ")")
