"""llama-server's /infill (fill-in-the-middle): prefix, suffix and the text typed so far, for models with FIM
tokens; without them 501 names what is missing, as llama-server answers."""

from __future__ import annotations

from aiohttp import web

from engine.server.completion import Native
from engine.server.errors import ApiError, bad_request
from engine.server.params import Fields, check_fits, read_json, reject_unsupported
from engine.server.state import state_of

# (prefix, suffix, middle) token spellings: Qwen2.5-Coder / StarCoder / CodeLlama
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<PRE>", "<SUF>", "<MID>"))


def _extra(f: Fields) -> str:
    chunks = f.raw("input_extra", [])
    if not isinstance(chunks, list):
        raise bad_request("'input_extra' must be an array of {filename, text} objects")
    out = []
    for i, c in enumerate(chunks):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise bad_request(f"'input_extra[{i}]' must be an object with a string 'text'")
        if "filename" in c and not isinstance(c["filename"], str):
            raise bad_request(f"'input_extra[{i}].filename' must be a string")
        out.append(f"{c.get('filename', '')}\n{c['text']}" if c.get("filename") else c["text"])
    return "".join(out)


def fim_ids(tok) -> tuple[int, int, int] | None:
    vocab = tok.tok
    for names in FIM_TOKENS:
        ids = [vocab.token_to_id(n) for n in names]
        if all(i is not None for i in ids):
            return ids[0], ids[1], ids[2]
    return None


async def infill(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    f = Fields(await read_json(request))
    reject_unsupported(f)
    extra = _extra(f)
    prefix, suffix, typed = f.str("input_prefix", ""), f.str("input_suffix", ""), f.str("prompt", "")
    tok = state.tokenizer
    fim = fim_ids(tok)
    if fim is None:
        raise ApiError(501, "Infill is not supported by this model: it has no fill-in-the-middle tokens "
                            "(prefix, suffix, middle)")
    pre, suf, mid = fim
    bos = [tok.bos_id] if tok.bos_id is not None and tok.add_bos is not False else []
    def work() -> list[int]:
        check_fits(state, extra + prefix + suffix + typed, "infill prompt")
        return [*bos, pre, *tok.encode(extra + prefix, add_special=False), suf,
                *tok.encode(suffix, add_special=False), mid, *tok.encode(typed, add_special=False)]

    ids = await state.workers.run(work, size=len(extra) + len(prefix) + len(suffix) + len(typed))
    return await Native(state, f, {}).run(request, [ids])
