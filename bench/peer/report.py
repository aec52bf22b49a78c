"""The peer-suite report: junit XML from llama.cpp's server tests -> JSON and Markdown per file.

Counts per file: passed, failed (with the first line of each reason), skipped (by the suite itself),
out of scope (deselected: multimodal, embeddings, rerank, router, MCP, built-in tools) and
model-specific (tests that assert the text or files of llama.cpp's tinyllama test models: counted apart
whatever their outcome, and never tuned for). `--deselect` prints the pytest arguments for the
out-of-scope tests.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT_OF_SCOPE = {
    "test_security.py::test_cors_origins_defaults_to_localhost_with_tools_enabled": "built-in tools",
    "test_security.py::test_cors_proxy_only_forwards_explicit_proxy_headers": "MCP proxy",
    "test_security.py::test_local_media_file": "multimodal",
    "test_slot_save.py::test_slot_save_restore_text_only_on_multimodal": "multimodal",
    "test_slot_save.py::test_slot_save_restore_with_image": "multimodal",
    "test_slot_save.py::test_slot_save_restore_with_two_images": "multimodal",
    "test_slot_save.py::test_slot_save_restore_with_image_across_restart": "multimodal",
    "test_slot_save.py::test_slot_save_restore_image_payload_larger_than_context": "multimodal",
    "test_slot_save.py::test_slot_restore_media_file_without_mmproj": "multimodal",
    "test_stream.py::test_stream_resume_and_stop_with_slashed_model_name": "router",
    "test_stream.py::test_stream_stop_during_model_load": "router",
    "test_stream.py::test_stream_resumes_after_reload_during_model_load": "router",
    "test_metrics.py::test_metrics_embedding_prompt_is_counted": "embeddings",
}

PARAMETRIZED = {"test_security.py::test_local_media_file": 5}  # deselected ids that stand for several tests

# test (file::name, parameters dropped) -> what of llama.cpp's test model it asserts
_TEXT = "asserts the text that llama.cpp's tinyllama test model writes"
_COUNT = "asserts token counts of llama.cpp's tinyllama tokenizer"
_DRAFT = "downloads llama.cpp's stories15M draft model (no network here) for draft-model speculation (-md)"
MODEL_SPECIFIC: dict[str, str] = {
    "test_basic.py::test_server_props": "asserts the model file is a .gguf (the bundled model is safetensors)",
    "test_basic.py::test_load_split_model": "downloads llama.cpp's split stories15M GGUF and asserts its text",
    "test_tokenize.py::test_tokenize_with_bos": "asserts BOS is token 1 (the bundled model's is 0)",
    "test_chat_completion.py::test_chat_completion": _TEXT + " and " + _COUNT,
    "test_chat_completion.py::test_chat_completion_cached_tokens": _COUNT,
    "test_chat_completion.py::test_chat_completion_stream": _TEXT + " and " + _COUNT,
    "test_chat_completion.py::test_chat_completion_with_openai_library": _TEXT,
    "test_chat_completion.py::test_chat_template": "asserts tinyllama's detokenized BOS '<s> ' in the prompt",
    "test_chat_completion.py::test_return_progress": "asserts the number of prompt batches of tinyllama's tokens",
    "test_completion.py::test_completion": _TEXT + " and " + _COUNT,
    "test_completion.py::test_completion_stream": _TEXT + " and " + _COUNT,
    "test_completion.py::test_completion_with_openai_library": _TEXT,
    "test_completion.py::test_completion_stream_with_openai_library": _TEXT,
    "test_completion.py::test_n_probs_post_sampling": "asserts at least 10 tokens survive the default samplers "
        "after its prompt: a property of tinyllama's distribution",
    "test_ctx_shift.py::test_ctx_shift_disabled_long_prompt": _COUNT + " (LONG_TEXT is over 256 of its tokens)",
    "test_completion.py::test_completion_prompt_cache": _COUNT + " ((40 + r) * 5 + 2 prompt tokens)",
    "test_completion.py::test_completion_response_fields[I believe the meaning of life is-32-response_fields1]":
        "asserts tinyllama's detokenized BOS '<s> ' before the prompt",
    "test_compat_oai_responses.py::test_responses_with_openai_library": _TEXT,
    "test_compat_oai_responses.py::test_responses_stream_with_openai_library": _TEXT,
    "test_ctx_shift.py::test_ctx_shift_enabled": _COUNT + " (a 226-token prompt)",
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt": _COUNT + " (8 prompt + 248 generated)",
    "test_infill.py::test_infill_without_input_extra": "needs a model with FIM tokens; " + _TEXT,
    "test_infill.py::test_infill_with_input_extra": "needs a model with FIM tokens; " + _TEXT,
    "test_slot_save.py::test_slot_save_restore": _TEXT + " and " + _COUNT + " (n_saved 84)",
    "test_slot_save.py::test_slot_restore_legacy_token_list": "rewrites llama.cpp's own slot file format; " + _COUNT,
    "test_slot_save.py::test_slot_erase": _TEXT + " and " + _COUNT,
    **{f"test_speculative.py::{t}": _DRAFT for t in (
        "test_with_and_without_draft", "test_different_draft_min_draft_max", "test_synth_is_deterministic",
        "test_synth_ignores_target_tokens", "test_slot_ctx_not_exceeded", "test_with_ctx_shift",
        "test_multi_requests_parallel")},
}


COLLECTED = 207  # the 16 main files without slow tests: 224, less the 17 out of scope
BASELINE = ("Before issues 27/34 (issue 34's idle rerun, the same 14 files, unknown flags dropped): 63 passed, "
            "121 failed, 17 out of scope, 7 model-specific. This branch's own start (main at b73c05c, "
            "PEER_DROP_UNKNOWN=1), stopped after the first 68 tests for machine time (test_basic, "
            "test_chat_completion, 8 of test_completion, model-specific ones included): 18 passed, 50 failed.")


# why a model-independent test still fails (shown beside its failure)
KNOWN = {
    "test_security.py::test_cors_options": "the engine's Origin policy (issue 27.1, hardening): a foreign Origin is "
        "refused unless --cors-origins names it; llama-server's default reflects any",
    "test_security.py::test_cors_origins_localhost_rejects": "the engine refuses the foreign Origin with 403; "
        "llama-server answers 200 without the CORS header",
    "test_security.py::test_access_static_assets_without_api_key": "no web UI is served (the studio is the UI)",
    "test_basic.py::test_no_ui": "no web UI is served (the studio is the UI)",
    "test_completion.py::test_completion_parallel_slots": "-c 512 -np 4 is refused by design (issue 34.5): 128 "
        "tokens a slot is below one 256-token KV page",
    "test_sleep.py::test_server_sleep_token_counting_wake": "its last step counts tokens on /v1/messages/count_tokens: "
        "the Anthropic Messages API is not served (its own test file is outside the main set); the steps before it "
        "(/chat/completions/input_tokens and /v1/responses/input_tokens wake the model) pass",
}


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def read_junit(path: Path) -> list[dict]:
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("classname", "").split(".")[-1] + ".py"
        test_id = f"{file}::{case.get('name')}"
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                text = (node.get("message") or node.text or "").strip()
                reason = text.splitlines()[0][:300] if text else tag
                break
        out.append({"id": test_id, "file": file, "outcome": outcome, "reason": reason,
                    "seconds": float(case.get("time", 0) or 0)})
    return out


_LINE = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED) unit/(\S+)")


def read_log(path: Path) -> list[dict]:
    """Outcomes from a verbose (-vv) xdist log, for a run stopped before pytest wrote its junit; the
    reason of a failure is then not known."""
    out = {}
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line.strip())
        if m:
            kind, test_id = m.groups()
            outcome = {"PASSED": "passed", "SKIPPED": "skipped"}.get(kind, "failed")
            out[test_id] = {"id": test_id, "file": test_id.split("::")[0], "outcome": outcome,
                            "reason": "" if outcome != "failed" else "(run stopped before its junit; see the log)",
                            "seconds": 0.0}
    return list(out.values())


def summarize(cases: list[dict]) -> dict:
    files: dict[str, dict] = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "out_of_scope": 0,
                                                  "model_specific": 0, "model_specific_passed": 0})
    failures, model_specific = [], []
    for c in cases:
        f = files[c["file"]]
        why = MODEL_SPECIFIC.get(c["id"]) or MODEL_SPECIFIC.get(_base(c["id"]))
        if why:
            f["model_specific"] += 1
            f["model_specific_passed"] += c["outcome"] == "passed"
            model_specific.append({**c, "why": why})
            continue
        f[c["outcome"]] += 1
        if c["outcome"] == "failed":
            failures.append(c)
    for test_id in OUT_OF_SCOPE:
        files[test_id.split("::")[0]]["out_of_scope"] += PARAMETRIZED.get(test_id, 1)
    total = {k: sum(f[k] for f in files.values()) for k in next(iter(files.values()))} if files else {}
    in_scope = total.get("passed", 0) + total.get("failed", 0)
    return {"files": dict(sorted(files.items())), "total": total,
            "pass_rate_in_scope": round(total.get("passed", 0) / in_scope, 4) if in_scope else None,
            "failures": failures, "model_specific": model_specific,
            "out_of_scope": [{"id": k, "why": v} for k, v in OUT_OF_SCOPE.items()]}


def _ran(f: dict) -> int:
    return f["passed"] + f["failed"] + f["skipped"] + f["model_specific"]


def merge(base: dict, new: dict) -> dict:
    """`base` (a committed report) with every file `new` ran replaced by new's results for it: a re-run of
    whole files after a change, without running the other files again."""
    ran = {name for name, f in new["files"].items() if _ran(f)}
    files = {**base["files"], **{name: new["files"][name] for name in ran}}
    keep = [c for c in base["failures"] if c["file"] not in ran] + [c for c in new["failures"]]
    specific = [c for c in base["model_specific"] if c["file"] not in ran] + new["model_specific"]
    total = {k: sum(f[k] for f in files.values()) for k in next(iter(files.values()))}
    in_scope = total["passed"] + total["failed"]
    n_reported = base["n_reported"] - sum(_ran(base["files"][n]) for n in ran if n in base["files"]) + \
        sum(_ran(new["files"][n]) for n in ran)
    return {**base, "files": dict(sorted(files.items())), "total": total, "failures": keep, "model_specific": specific,
            "pass_rate_in_scope": round(total["passed"] / in_scope, 4) if in_scope else None,
            "collected": COLLECTED, "n_reported": n_reported}


def markdown(rep: dict) -> str:
    t = rep["total"]
    lines = [f"# llama.cpp server test suite against lockstep-engine --device cpu ({rep['source']})", "",
             f"In scope and model-independent: **{t['passed']} passed, {t['failed']} failed** "
             f"({100 * (rep['pass_rate_in_scope'] or 0):.1f} %); {t['skipped']} skipped by the suite; "
             f"{t['model_specific']} model-specific ({t['model_specific_passed']} of them passed); "
             f"{t['out_of_scope']} out-of-scope tests deselected.", "",
             f"Tests with a result: {rep['n_reported']} of the {rep.get('collected', COLLECTED)} the "
             f"{len(rep['files'])} files collect after deselection"
             + ("" if rep["n_reported"] >= rep.get("collected", COLLECTED)
                else " (the run was stopped for time; the others have none)")
             + ".", "",
             *([rep["note"], ""] if rep.get("note") else []),
             f"Baseline: {BASELINE}", "",
             "| file | passed | failed | skipped | model-specific | out of scope |", "|---|---|---|---|---|---|"]
    for name, f in rep["files"].items():
        lines.append(f"| {name} | {f['passed']} | {f['failed']} | {f['skipped']} | {f['model_specific']} | "
                     f"{f['out_of_scope']} |")
    lines += ["", "## Failures", ""]
    lines += [f"- `{c['id']}`: {c['reason']}" + (f" — {KNOWN[_base(c['id'])]}" if _base(c["id"]) in KNOWN else "")
              for c in rep["failures"]] or ["none"]
    lines += ["", "## Model-specific (counted apart)", ""]
    lines += [f"- `{c['id']}` ({c['outcome']}): {c['why']}" for c in rep["model_specific"]] or ["none"]
    lines += ["", "## Out of scope (deselected)", ""]
    lines += [f"- `{c['id']}`: {c['why']}" for c in rep["out_of_scope"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--deselect", action="store_true")
    p.add_argument("--junit", type=Path, action="append", help="junit files; a later one's results win")
    p.add_argument("--log", type=Path, help="read a -vv xdist log instead of a junit file")
    p.add_argument("--out", type=Path)
    p.add_argument("--version", default="?")
    p.add_argument("--drop-unknown", default="0")
    p.add_argument("--note", default="", help="a line on how the results were gathered (e.g. a re-run)")
    p.add_argument("--base", type=Path, help="a report whose other files' results stay (see merge)")
    a = p.parse_args()
    if a.deselect:
        print(" ".join(f"--deselect=unit/{k}" for k in OUT_OF_SCOPE))  # a prefix: every parametrization
        return 0
    cases = list({c["id"]: c for j in a.junit for c in read_junit(j)}.values()) if a.junit else read_log(a.log)
    rep = summarize(cases)
    rep["n_reported"] = len(cases)
    if a.base:
        base = json.loads(a.base.read_text())
        rep = merge(base, rep)
        a.note = " ".join(x for x in (base.get("note", ""), a.note) if x)
    rep["note"] = a.note
    rep["source"] = f"llama-cpp-python {a.version} sdist, vendor/llama.cpp/tools/server/tests"
    rep["baseline"] = BASELINE
    rep["method"] = ("bundled model lockstep-pycode-13m; wrapper bench/peer/llama-server drops only the flags in "
                     "bench/peer/server.py DROP" + ("; PEER_DROP_UNKNOWN=1 also dropped every flag the engine "
                                                   "lacked" if a.drop_unknown == "1" else ""))
    a.out.with_suffix(".json").write_text(json.dumps(rep, indent=1) + "\n")
    a.out.with_suffix(".md").write_text(markdown(rep))
    t = rep["total"]
    print(f"passed {t['passed']} failed {t['failed']} skipped {t['skipped']} model-specific {t['model_specific']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
