"""`lockstep-engine` / `python -m engine`: the server's command line (llama-server's flags) and `generate`.

Every failure ends with one line on stderr and an exit code from engine.exits, which the studio
classifies; logs go to stderr with timestamps, so they never read as such a verdict.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

from contract.env import ENGINE_API_KEY, PREEMPT_MODE
from engine.args import EngineArgs
from engine.cli_compat import add_compat_flags, builtin_or_source, explain_unknown, lacking_flags
from engine.exits import BAD_FLAGS, Fatal, bad_flag
from engine.modes import PREEMPT_MODES
from engine.threads import THREADS_HELP, configure_threads, resolve_threads
from lockstep_kernels.base import KV_TYPES, PAGE_SIZE

# Cache types llama-server knows that the engine does not store (yet): named, refused explicitly.
UNSUPPORTED_KV = ("q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
MAX_SLOTS = 256
log = logging.getLogger("engine.cli")
ENV_API_KEY = ENGINE_API_KEY  # as llama-server: the key without putting it in argv


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit code for a bad command line is 2, as ours
        self.print_usage(sys.stderr)
        self.exit(BAD_FLAGS, f"error: {explain_unknown(message)}\n")

    def parse_known_args(self, args=None, namespace=None):
        # before argparse, which would read a lacking "-ngld 99" as "-n gld" and fail on the wrong flag
        if lacking := lacking_flags(sys.argv[1:] if args is None else list(args)):
            self.error("unrecognized arguments: " + " ".join(lacking))
        return super().parse_known_args(args, namespace)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expects an integer >= {low}, got {value}")
        return value

    return parse


def _gpu_layers(text: str) -> str | int:
    if text in ("all", "auto"):
        return text
    value = _int_at_least(-1)(text)
    return "auto" if value == -1 else value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="lockstep-engine",
        description="Lockstep's inference server. Flags follow llama-server's where the meaning is the same.",
        epilog="Quick generation without a server: lockstep-engine generate -m MODEL -p TEXT -n N",
    )
    add = p.add_argument
    add("-m", "--model", required=True, metavar="PATH", help="model: a Hugging Face directory or a GGUF file")
    add("--alias", metavar="NAME[,NAME]", help="model names reported by /v1/models, comma-separated; the id is the "
        "first in sorted order, as llama-server (default: the file or directory name)")
    add("--host", default="127.0.0.1", help="addresses to listen on, comma-separated (default: %(default)s)")
    add("--port", type=_int_at_least(0), default=8080, help="port to listen on (default: %(default)s)")
    add("-c", "--ctx-size", type=_int_at_least(0), default=4096, metavar="N",
        help=f"KV pool size in tokens, rounded up to whole {PAGE_SIZE}-token pages; 0 = the model's native "
             "context (default: %(default)s)")
    add("-np", "--parallel", type=_int_at_least(1), default=4, metavar="N",
        help="slots: sequences decoded at once (default: %(default)s)")
    add("-b", "--batch-size", type=_int_at_least(1), default=2048, metavar="N",
        help="logical batch: most tokens one step takes (default: %(default)s)")
    add("-ub", "--ubatch-size", type=_int_at_least(1), default=512, metavar="N",
        help="physical batch: most tokens one forward pass computes (default: %(default)s)")
    add("-kvu", "--kv-unified", action="store_true",
        help="one KV pool shared by all slots: a sequence may use the whole context (default: the context is "
             "split evenly between the slots)")
    add("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto",
        help="flash attention (default: %(default)s; the paged flash kernel is the only attention path)")
    add("-ngl", "--n-gpu-layers", type=_gpu_layers, default="auto", metavar="N|all|auto",
        help="layers on the GPU: all (or auto) puts the whole model there, 0 runs on the CPU backend; partial "
             "offload is not supported (default: %(default)s)")
    add("-nkvo", "--no-kv-offload", action="store_true",
        help="keep the KV cache in host memory (no effect on the CPU backend; not supported on CUDA yet)")
    kv_help = (f"KV cache type for {{}}: {', '.join(KV_TYPES)} (default: %(default)s; "
               f"{', '.join(UNSUPPORTED_KV)} are not supported)")
    add("-ctk", "--cache-type-k", default="f16", metavar="TYPE", help=kv_help.format("K"))
    add("-ctv", "--cache-type-v", default="f16", metavar="TYPE", help=kv_help.format("V"))
    shift = p.add_mutually_exclusive_group()
    shift.add_argument("--context-shift", dest="context_shift", action="store_true", default=False,
                       help="a sequence that fills its context drops old tokens and goes on, as llama-server: the "
                            "first --keep (or the request's n_keep) stay, half the rest (or n_discard) go, and the "
                            "tokens after the cut are recomputed; a request without a token limit then runs until it "
                            "ends (disabled in exact mode)")
    shift.add_argument("--no-context-shift", dest="context_shift", action="store_false",
                       help="end a sequence that fills its context with finish_reason 'length' (the default)")
    add("--cache-reuse", type=_int_at_least(0), default=0, metavar="N",
        help="reuse cached KV chunks of at least N tokens at shifted positions (not supported yet; disabled in "
             "exact mode); 0 = off (default)")
    add("--spec-type", choices=("none", "ngram", "draft-simple"), default="none",
        help="speculative decoding: none, ngram drafts looked up in the sequence's own tokens, or draft-simple (the "
             "-md model's; -md alone turns it on); drafts only change speed: a draft token is kept only when it "
             "equals the token the model samples (default: %(default)s)")
    add("--spec-draft-n-max", type=_int_at_least(0), default=16, metavar="N",
        help="most draft tokens per step with --spec-type ngram or -md (default: %(default)s)")
    add("-md", "--model-draft", "--spec-draft-model", dest="model_draft", metavar="PATH",
        help="a draft model (same vocabulary) whose greedy continuation is the draft, up to --spec-draft-n-max "
             "tokens; kept only where it equals the model's samples, so answers do not change")
    add("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl", dest="n_gpu_layers_draft",
        metavar="N", help="accepted: the draft model runs wholly on the model's backend")
    add("-s", "--seed", type=_int_at_least(-1), default=-1, metavar="N",
        help="seed for requests that give none; -1 = a random seed per request, returned in its response "
             "(default: %(default)s)")
    add("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on every endpoint but /health "
        f"(visible to other users in the process list: prefer --api-key-file or {ENV_API_KEY})")
    add("--api-key-file", metavar="PATH", help="read the API key from the first line of this file (keep it mode 0600)")
    add("--metrics", action="store_true", help="serve Prometheus metrics at /metrics")
    add("--jinja", action="store_true",
        help="render chat templates with Jinja (always on: accepted for llama-server compatibility)")
    add("--chat-template-file", metavar="PATH", help="a Jinja chat template to use instead of the model's")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto",
        help="compute backend: auto picks CUDA when the CuPy backend imports and a device works, else the CPU "
             "(default: %(default)s)")
    add("--preempt-ram", type=_int_at_least(0), default=4096, metavar="MIB",
        help="host memory for parked KV pages; beyond it a preempted sequence is recomputed later "
             "(default: %(default)s). LOCKSTEP_PREEMPT_MODE=park raises it to the host's free memory, "
             "=recompute never parks, =auto (the default) uses it as given")
    add("--exact-concurrency", choices=("on", "off"), default=None,
        help="byte-identical tokens and logprobs per request whatever runs beside it; when absent, the "
             "environment variable LOCKSTEP_EXACT=1 turns it on (default: off)")
    _add_client_limits(p)
    add_compat_flags(p)
    _add_multi_gpu(p)
    return p


def _add_threads(add) -> None:
    """-t for `generate` (the server's comes with the llama-server flags: engine/cli_compat.py)."""
    add("-t", "--threads", type=_int_at_least(-1), default=None, metavar="N", help=THREADS_HELP)


def _tensor_split(text: str) -> tuple[float, ...]:
    from engine.parallel.plan import PlanError, parse_tensor_split

    try:
        return parse_tensor_split(text)
    except PlanError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_multi_gpu(p: argparse.ArgumentParser) -> None:
    """Tensor parallelism over several GPUs (llama-server's row split), engine/parallel."""
    g = p.add_argument_group("several GPUs")
    g.add_argument("-sm", "--split-mode", choices=("none", "layer", "row"), default=None,
                   help="none: one GPU; row: tensor parallelism, each GPU holds its share of every layer's heads and "
                        "FFN columns; layer (llama-server's default) is not supported yet (default: row with --tp > 1)")
    g.add_argument("-ts", "--tensor-split", type=_tensor_split, default=None, metavar="N0,N1,...",
                   help="proportions of the heads and FFN columns per GPU, e.g. 3,1; a 0 leaves a GPU out "
                        "(default: even)")
    g.add_argument("-mg", "--main-gpu", type=_int_at_least(0), default=0, metavar="INDEX",
                   help="the GPU of rank 0, which also holds the logits (default: %(default)s)")
    g.add_argument("--tp", type=_int_at_least(1), default=None, metavar="N",
                   help="tensor-parallel ranks, one per GPU (default: the non-zero -ts entries with "
                        "--split-mode row, else 1)")


def _add_client_limits(p: argparse.ArgumentParser) -> None:
    """What a client (or a web page) may do to the server: sizes, times, connections, origins."""
    g = p.add_argument_group("client limits")
    g.add_argument("--body-limit", type=_int_at_least(1), default=16, metavar="MIB",
                   help="largest request body, also after decompression (default: %(default)s)")
    g.add_argument("-to", "--timeout", type=_int_at_least(1), default=30, metavar="N",
                   help="seconds a client may take to send a request's headers, and its body (llama-server's "
                        "read timeout; default: %(default)s)")
    g.add_argument("--max-connections", type=_int_at_least(1), default=256, metavar="N",
                   help="open connections at most; more are answered 503 and closed (default: %(default)s)")
    g.add_argument("--cors-origins", metavar="LIST", default="",
                   help="comma-separated origins allowed besides loopback and --host (scheme://host[:port], or * for "
                        "any): they are reflected in CORS headers; other origins get 403 (default: none)")


def build_generate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lockstep-engine generate", description="Generate a completion of a prompt and print it.")
    add = p.add_argument
    add("-m", "--model", required=True, metavar="PATH", help="model: a Hugging Face directory or a GGUF file")
    add("-p", "--prompt", required=True, metavar="TEXT", help="prompt text (completed as is, no chat template)")
    add("-n", "--n-predict", type=_int_at_least(-1), default=128, metavar="N",
        help="most tokens to generate; -1 = until the context is full (default: %(default)s)")
    add("--temp", type=float, default=0.8, help="sampling temperature; 0 = greedy (default: %(default)s)")
    add("-s", "--seed", type=_int_at_least(-1), default=-1, metavar="N", help="seed; -1 = random (default)")
    add("-c", "--ctx-size", type=_int_at_least(0), default=4096, metavar="N",
        help="context in tokens; 0 = the model's native context (default: %(default)s)")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="compute backend (default: %(default)s)")
    add("--exact-concurrency", choices=("on", "off"), default=None, help="use the row-invariant kernels")
    _add_threads(add)
    return p


def check_values(opts: argparse.Namespace) -> None:
    """Flag values argparse cannot judge alone."""
    for flag, kind in (("--cache-type-k", opts.cache_type_k), ("--cache-type-v", opts.cache_type_v)):
        if kind in UNSUPPORTED_KV:
            raise bad_flag(f"{flag} {kind} is not supported (supported: {', '.join(KV_TYPES)})")
        if kind not in KV_TYPES:
            raise bad_flag(f"{flag} {kind!r} is not a cache type (supported: {', '.join(KV_TYPES)})")
    if opts.parallel > MAX_SLOTS:
        raise bad_flag(f"--parallel {opts.parallel}: at most {MAX_SLOTS} slots")
    if opts.port > 65535:
        raise bad_flag(f"--port {opts.port}: not a port number")
    if opts.threads is not None and (opts.threads == 0 or opts.threads < -1):
        raise bad_flag(f"-t/--threads {opts.threads}: expects at least 1, or -1 for the default")
    if opts.seed >= 1 << 64:
        raise bad_flag(f"--seed {opts.seed}: at most 2^64 - 1")
    if opts.temp is not None and not 0.0 <= opts.temp <= 100.0:
        raise bad_flag(f"--temp {opts.temp}: expects a number between 0 and 100")


def engine_args(opts: argparse.Namespace, env: Mapping[str, str] | None = None) -> EngineArgs:
    """The frozen options: the flags checked, with what they point at read and the environment's say."""
    env = os.environ if env is None else env
    check_values(opts)
    ubatch = opts.ubatch_size
    if ubatch > opts.batch_size:
        log.info("-ub %d is larger than -b %d: using -ub %d", ubatch, opts.batch_size, opts.batch_size)
        ubatch = opts.batch_size
    from engine.parallel.plan import PlanError, resolve_tp

    try:
        tp, tp_split = resolve_tp(opts.tp, opts.split_mode, opts.tensor_split)
    except PlanError as e:
        raise bad_flag(str(e)) from None
    threads, threads_source = cpu_threads(opts.threads, env)
    return EngineArgs.from_namespace(opts, chat_template=chat_template(opts), preempt_mode=preempt_mode(env),
                                     api_key=read_api_key(opts, env), ubatch_size=ubatch, tp=tp, tp_split=tp_split,
                                     threads=threads, threads_source=threads_source)


def cpu_threads(flag: int | None, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    try:
        return resolve_threads(flag, env)
    except ValueError as e:
        raise bad_flag(str(e)) from None


def chat_template(opts: argparse.Namespace) -> str | None:
    """The text of --chat-template-file, else of the named built-in (or the name's own source)."""
    if opts.chat_template_file:
        try:
            with open(opts.chat_template_file, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise bad_flag(f"--chat-template-file {opts.chat_template_file}: cannot be read ({e})") from e
    if opts.chat_template_name:
        return builtin_or_source(opts.chat_template_name)
    return None


def preempt_mode(environ: Mapping[str, str] | None = None) -> str:
    """LOCKSTEP_PREEMPT_MODE (the studio sets it for its child): auto when unset."""
    env = os.environ if environ is None else environ
    mode = env.get(PREEMPT_MODE, "").strip().lower() or "auto"
    if mode not in PREEMPT_MODES:
        raise bad_flag(f"{PREEMPT_MODE}={env[PREEMPT_MODE]!r} is not a preemption mode "
                       f"(one of: {', '.join(PREEMPT_MODES)})")
    return mode


def read_api_key(opts: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """--api-key, else the first line of --api-key-file, else LLAMA_API_KEY."""
    if opts.api_key and opts.api_key_file:
        raise bad_flag("--api-key and --api-key-file are exclusive")
    if opts.api_key_file:
        try:
            with open(opts.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise bad_flag(f"--api-key-file {opts.api_key_file}: cannot be read ({e})") from e
        if not key:
            raise bad_flag(f"--api-key-file {opts.api_key_file}: the first line is empty")
        return key
    return opts.api_key or env.get(ENV_API_KEY) or None


def check_supported(opts: EngineArgs, backend: str) -> None:
    """Flags accepted for compatibility whose feature does not exist yet: an explicit error, never ignored."""
    if (opts.spec_type != "none" or opts.model_draft) and opts.spec_draft_n_max < 1:
        raise bad_flag(f"--spec-type {opts.spec_type if opts.spec_type != 'none' else 'draft-simple'} needs "
                       "--spec-draft-n-max >= 1")
    if opts.spec_type == "draft-simple" and not opts.model_draft:
        raise bad_flag("--spec-type draft-simple needs a draft model: -md PATH")
    if opts.spec_type == "ngram" and opts.model_draft:
        raise bad_flag("--spec-type ngram with -md: one kind of draft at a time; drop -md, or use --spec-type "
                       "draft-simple")
    if opts.flash_attn == "off":
        raise bad_flag("-fa off is not supported yet (the paged flash kernel is the only attention); "
                       "use -fa on or auto")
    if opts.no_kv_offload and backend == "cuda":
        raise bad_flag("--no-kv-offload is not supported yet on CUDA")
    if opts.cache_reuse:
        raise bad_flag("--cache-reuse is not supported yet; prompt caching at the same positions is always on")


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    setup_logging()
    try:
        if argv[:1] == ["generate"]:
            from engine.generate import run_generate

            gen_opts = build_generate_parser().parse_args(argv[1:])
            gen_opts.threads = cpu_threads(gen_opts.threads)[0]
            configure_threads(gen_opts.threads)
            return run_generate(gen_opts)
        args = engine_args(build_parser().parse_args(argv))
        configure_threads(args.threads)
        from engine.server.startup import serve

        return serve(args)
    except Fatal as e:
        sys.stderr.flush()
        print(e.line, file=sys.stderr, flush=True)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
