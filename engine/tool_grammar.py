"""A forced tool call (`tool_choice: "required"` or a named function) as a GBNF grammar.

The call is written in the format the chat template reads back (Hermes/Qwen `<tool_call>`, Mistral
`[TOOL_CALLS]`, else Llama 3.x's bare JSON object), so engine.server.chat_output parses it into `tool_calls`
like a call the model chose itself; the arguments follow the function's `parameters` schema.
"""

from __future__ import annotations

import json

from engine.json_schema import schema_rules

STYLES = ("hermes", "mistral", "json")


def call_style(template_source: str) -> str:
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    return "json"


def _call_schema(tools: list[dict], style: str) -> dict:
    key = "arguments" if style != "json" else "parameters"  # Llama 3.x templates name them "parameters"
    calls = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters")
        calls.append({"type": "object", "required": ["name", key],
                      "properties": {"name": {"const": fn["name"]},
                                     key: params if params not in (None, {}) else {"type": "object"}}})
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def tool_call_grammar(tools: list[dict], style: str, parallel: bool, prefix: str = "") -> str:
    """One call (several with `parallel`) to one of `tools`, after the literal `prefix` (a reasoning block's
    close tag when the prompt left one open). A bad `parameters` schema raises SchemaError."""
    for t in tools:  # each schema alone first, so an error names its function
        params = t["function"].get("parameters")
        schema_rules({} if params is None else params, f"function {t['function']['name']!r} parameters")
    rules, call = schema_rules(_call_schema(tools, style))
    if style == "hermes":
        one, sep, head, tail = '"<tool_call>\\n" ' + call + ' "</tool_call>"', '"\\n"', "", ""
    elif style == "mistral":
        one, sep, head, tail = call, '"," ws', '"[TOOL_CALLS][" ', ' "]"'
    else:
        one, sep, head, tail = call, '";" ws', "", ""
    body = f"{one} ( {sep} {one} )*" if parallel else one
    lead = json.dumps(prefix) + " " if prefix else ""
    return rules + f"\nroot ::= {lead}{head}{body}{tail}\n"
