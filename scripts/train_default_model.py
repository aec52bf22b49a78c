#!/usr/bin/env python3
"""Train Lockstep's bundled default model: a small Llama code-completion model on the Python stdlib.

The corpus is the standard library source of the Python running this script, so the recipe needs
nothing from the network. One run trains a byte-level BPE tokenizer, trains the model from scratch,
evaluates it against a unigram baseline on held-out files and writes a Hugging Face directory with a
model card and a machine-readable `training_report.json`.

    python scripts/train_default_model.py --out-dir assets/models/lockstep-pycode-13m   # one GPU
    python scripts/train_default_model.py --tiny --steps 5 --out-dir /tmp/tiny          # CPU smoke test

The step count is sized from measured throughput unless `--steps` is given; the report records the
steps actually run, and passing them back as `--steps` reproduces the run on the same hardware.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

# cuBLAS reads this when its first handle is created; deterministic algorithms refuse to run without it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD]

# Trees that are tests, IDE/tooling code or third-party packages rather than library code.
EXCLUDED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__"}

# The model only ever saw raw source, so a "chat" is just the text to continue: contents are joined
# with newlines and the generation prompt is empty (the flag is accepted so chat clients work as-is).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ message['content'] }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{% endif %}"
)

SAMPLE_PROMPTS = [
    "def fibonacci(n):",
    "import os\n\n\ndef list_python_files(path):",
    "class Stack:\n    def __init__(self):",
    "def read_json(path):\n    with open(path",
]


@dataclass
class ModelShape:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq_len: int


@dataclass
class SourceFile:
    rel: str
    text: str


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=Path, default=None, help="default: assets/models/<name>")
    p.add_argument("--name", default=None, help="model name (default depends on --tiny)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tiny", action="store_true", help="tiny corpus and model for a CPU smoke test")
    p.add_argument("--steps", type=int, default=None, help="fixed step count (default: from --time-budget)")
    p.add_argument("--time-budget", type=float, default=360.0, help="seconds of training when --steps is unset")
    p.add_argument("--max-epochs", type=float, default=30.0, help="cap on passes over the training tokens")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--val-every", type=int, default=20, help="every Nth file (sorted) is held out")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--dropout", type=float, default=0.15,
                   help="residual/embedding dropout during training only (the corpus is small)")
    p.add_argument("--evals", type=int, default=20, help="validation checks during training")
    p.add_argument("--sample-tokens", type=int, default=128)
    args = p.parse_args(argv)
    if args.tiny:
        # Small enough for a couple of shared CPU cores in well under a minute.
        args.vocab_size, args.hidden, args.layers, args.heads, args.kv_heads = 384, 64, 2, 4, 2
        args.intermediate, args.seq_len, args.batch_size, args.warmup = 128, 128, 4, 2
        args.sample_tokens = min(args.sample_tokens, 16)
        args.steps = args.steps or 5
    args.name = args.name or ("lockstep-pycode-tiny" if args.tiny else "lockstep-pycode-13m")
    args.out_dir = args.out_dir or Path(__file__).resolve().parents[1] / "assets" / "models" / args.name
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return args


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- corpus


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def collect_corpus(root: Path, tiny: bool) -> tuple[list[SourceFile], int]:
    """Every stdlib `.py` outside EXCLUDED_DIRS, sorted by relative path; returns (files, skipped)."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        paths.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    rels = sorted(p.relative_to(root).as_posix() for p in paths)
    if tiny:
        # A fixed slice of small files keeps the smoke test fast but still exercises the split.
        rels = [r for r in rels if (root / r).stat().st_size <= 16_000][:60]
    files, skipped = [], 0
    for rel in rels:
        try:
            # tokenize.open honours PEP 263 coding cookies and normalises newlines.
            with tokenize.open(root / rel) as fh:
                files.append(SourceFile(rel, fh.read()))
        except (SyntaxError, UnicodeDecodeError, OSError):
            skipped += 1
    return files, skipped


def split_files(files: list[SourceFile], val_every: int) -> tuple[list[SourceFile], list[SourceFile]]:
    train = [f for i, f in enumerate(files) if (i + 1) % val_every != 0]
    val = [f for i, f in enumerate(files) if (i + 1) % val_every == 0]
    return train, val


def corpus_digest(files: list[SourceFile]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.rel.encode() + b"\0" + f.text.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    # Byte-level: every byte sequence is encodable, so there is no unknown token.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Training documents start with BOS, so prompts encoded with special tokens should too.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def encode_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents as one stream: BOS text EOS, BOS text EOS, ..."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def unigram_cross_entropy(train: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Nats/token of the train split's token frequencies (add-one smoothed) on `targets`."""
    counts = torch.bincount(train, minlength=vocab_size).double() + 1.0
    logp = counts.log() - counts.sum().log()
    return float(-logp[targets].mean())


# ---------------------------------------------------------------- model


def build_model(shape: ModelShape, tok: Tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.seq_len,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def add_training_dropout(model, p: float) -> None:
    """Residual and embedding dropout as forward hooks.

    LlamaConfig has no residual dropout, and with a few million tokens seen dozens of times the
    model overfits without it. Hooks keep the saved architecture plain Llama: they are not part of
    the checkpoint and do nothing in eval mode.
    """
    if p <= 0:
        return

    def hook(module, _inputs, output):
        if isinstance(output, tuple):
            return (F.dropout(output[0], p, module.training), *output[1:])
        return F.dropout(output, p, module.training)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def lr_at(step: int, total: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def epoch_starts(n_tokens: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Window starts for one epoch: a random phase, then a random order of non-overlapping windows."""
    offset = int(torch.randint(0, seq_len, (1,), generator=gen))
    n = (n_tokens - 1 - offset) // seq_len
    starts = offset + torch.arange(n) * seq_len
    return starts[torch.randperm(n, generator=gen)]


def windows(stream: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    return stream[starts[:, None].to(stream.device) + torch.arange(length, device=stream.device)]


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, batch_size: int, autocast) -> tuple[float, int]:
    """Summed nats and count over every target of `stream` (token 0 is context only)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    n_full = (len(stream) - 1) // seq_len
    starts = torch.arange(n_full) * seq_len
    batches = [windows(stream, starts[i : i + batch_size], seq_len + 1) for i in range(0, n_full, batch_size)]
    tail = n_full * seq_len
    if tail < len(stream) - 1:
        batches.append(stream[tail:][None])
    for w in batches:
        with autocast():
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += w[:, 1:].numel()
    model.train(was_training)
    return total, count


# ---------------------------------------------------------------- saving


def save_tokenizer(tok: Tokenizer, out: Path, seq_len: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": seq_len,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def save_model(model, tok: Tokenizer, out: Path) -> None:
    from transformers import GenerationConfig

    # float16 rather than bfloat16: NumPy reads it natively and it keeps 3 more mantissa bits;
    # the weights of a model this size are far inside its range.
    half = copy.deepcopy(model).to(torch.float16)
    half.config.use_cache = True
    half.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        do_sample=False,
    ).save_pretrained(out)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def greedy_samples(model, hf_tok, device: str, max_new_tokens: int) -> list[dict]:
    out = []
    for prompt in SAMPLE_PROMPTS:
        enc = hf_tok(prompt, return_tensors="pt").to(device)
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=hf_tok.pad_token_id)
        completion = hf_tok.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out.append({"prompt": prompt, "completion": completion})
    return out


def write_card(out: Path, report: dict) -> None:
    r, c, h, t = report, report["corpus"], report["hyperparameters"], report["timings_s"]
    samples = "\n\n".join(
        f"Prompt `{json.dumps(s['prompt'])}`:\n\n```python\n{s['prompt']}{s['completion']}\n```" for s in r["samples"]
    )
    selection = ""
    if r["shipped_step"] != r["steps"]:
        selection = (f" Choosing it by the same validation split biases the reported validation loss down"
                     f" slightly (one pick among {len(r['val_curve'])} checkpoints).")
    # Filled in by hand after an independent rerun; the script cannot check itself.
    reproduced = f" {r['reproduction_check']}" if r.get("reproduction_check") else ""
    curve = "\n".join(f"| {e['step']} | {e['val_loss']:.4f} |" for e in r["val_curve"])
    card = f"""---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [llama, code, python, lockstep]
---

# {r['name']}

A {r['parameters'] / 1e6:.1f}M-parameter Llama model trained from scratch on the Python {c['python_version']}
standard library, shipped with Lockstep so the studio has something to run offline. It is a
**code-completion** model: give it the start of some Python and it continues it. It has never seen
a conversation; its chat template only joins the messages' contents.

## Results

Losses are in nats per token over every token of the split (shipped float16 weights, float32 compute).

| | nats/token |
|---|---|
| train loss | {r['train_loss']:.4f} |
| validation loss | {r['val_loss']:.4f} |
| unigram baseline on the validation split | {r['unigram_val_loss']:.4f} |

Validation bits per byte of source: {r['val_bits_per_byte']:.4f}. The unigram baseline is the
cross-entropy of the train split's token frequencies (add-one smoothed) on the same validation
targets. {r['checkpoint_note']}{selection}

## Corpus

- Source: every `.py` file under `sysconfig.get_paths()["stdlib"]` of CPython {c['python_version']}
  ({c['platform']}), skipping the directories {', '.join(f'`{d}`' for d in c['excluded_dirs'])}.
- Files sorted by relative path; every {c['val_every']}th file held out for validation.
- {c['files_total']} files read ({c['files_skipped']} unreadable skipped): {c['train_files']} train files
  ({c['train_bytes']:,} bytes, {c['train_tokens']:,} tokens), {c['val_files']} validation files
  ({c['val_bytes']:,} bytes, {c['val_tokens']:,} tokens). Each file is one document: `{BOS}` text `{EOS}`.
- Corpus SHA-256 (paths and texts): `{c['sha256']}`.
- License: the Python standard library is under the PSF License Agreement.

## Tokenizer

Byte-level BPE trained with `tokenizers` on the train split only: vocabulary {h['vocab_size']},
special tokens {', '.join(f'`{s}`' for s in SPECIAL_TOKENS)}. Encoding with special tokens prepends `{BOS}`,
as in training.

## Model and training

| | |
|---|---|
| architecture | `LlamaForCausalLM`, {h['layers']} layers, hidden {h['hidden']}, {h['heads']} heads / {h['kv_heads']} KV heads (head dim {h['hidden'] // h['heads']}), MLP {h['intermediate']}, RoPE θ 10000, tied embeddings |
| parameters | {r['parameters']:,} |
| context | {h['seq_len']} tokens (training windows of {h['seq_len']}, documents packed) |
| batch | {h['batch_size']} × {h['seq_len']} = {h['batch_size'] * h['seq_len']:,} tokens per step |
| optimizer | AdamW (β 0.9, 0.95), weight decay {h['weight_decay']}, grad clip 1.0 |
| learning rate | {h['lr']} peak, {h['warmup']} warmup steps, cosine to {h['min_lr']} |
| dropout | {h['dropout']} on embeddings and residual branches, training only |
| steps | {r['steps']} ({r['epochs']:.1f} epochs, {r['tokens_seen']:,} tokens) |
| precision | {r['precision']} |
| seed | {r['seed']} |
| determinism | {r['determinism']} |
| device | {r['device']} |
| wall time | {t['total']:.0f} s total: tokenizer {t['tokenizer']:.0f} s, training {t['train']:.0f} s, evaluation and samples {t['eval']:.0f} s |
| software | torch {r['versions']['torch']}, transformers {r['versions']['transformers']}, tokenizers {r['versions']['tokenizers']} |

Validation loss during training (training precision, dropout off):

| step | val loss |
|---|---|
{curve}

Reproduce: `{r['command']}` (same stdlib, same GPU model and software stack).{reproduced}

## Sample completions (greedy, {r['sample_tokens']} new tokens at most)

{samples}

## Limits

Trained on about {c['train_tokens'] / 1e6:.1f}M tokens of one codebase's style: expect plausible-looking but often
wrong code, repetition under greedy decoding, and nothing useful outside Python.
"""
    (out / "README.md").write_text(card)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    device = args.device
    use_cuda = device.startswith("cuda")
    torch.manual_seed(args.seed)
    if not use_cuda:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
    strict = True
    torch.use_deterministic_algorithms(True)
    if use_cuda:
        # The deterministic flag does not cover these choices.
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False

    # Corpus.
    root = stdlib_root()
    files, skipped = collect_corpus(root, args.tiny)
    train_files, val_files = split_files(files, args.val_every)
    log(f"stdlib {root} (Python {platform.python_version()}): {len(train_files)} train / "
        f"{len(val_files)} val files, {skipped} skipped")

    # Tokenizer (train split only, so validation text stays unseen by every trained component).
    t0 = time.perf_counter()
    tok = train_tokenizer([f.text for f in train_files], args.vocab_size)
    train_stream = encode_stream(tok, [f.text for f in train_files])
    val_stream = encode_stream(tok, [f.text for f in val_files])
    timings["tokenizer"] = time.perf_counter() - t0
    vocab = tok.get_vocab_size()
    log(f"tokenizer: vocab {vocab}, {len(train_stream):,} train / {len(val_stream):,} val tokens "
        f"in {timings['tokenizer']:.1f}s")

    unigram = unigram_cross_entropy(train_stream, val_stream[1:], vocab)
    log(f"unigram baseline on val: {unigram:.4f} nats/token")

    shape = ModelShape(vocab, args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.seq_len)
    model = build_model(shape, tok).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters")
    add_training_dropout(model, args.dropout)
    model.train()

    if use_cuda:
        def autocast():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        def autocast():
            return torch.autocast("cpu", enabled=False)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=use_cuda,
    )

    train_dev, val_dev = train_stream.to(device), val_stream.to(device)
    gen = torch.Generator().manual_seed(args.seed)
    steps_per_epoch = ((len(train_stream) - 1) // args.seq_len - 1) // args.batch_size
    max_steps = max(1, int(args.max_epochs * steps_per_epoch))
    total = min(args.steps, max_steps) if args.steps else max_steps
    measure_from, measure_to = 10, 40  # after the first steps' allocator and kernel warm-up
    sized_by = "--steps" if args.steps else "pending"
    eval_every = max(1, total // max(1, args.evals))

    best_val, best_state, best_step = float("inf"), None, -1
    val_curve: list[dict] = []
    tokens_per_step = args.batch_size * args.seq_len
    step, epoch, order, cursor = 0, 0, torch.empty(0, dtype=torch.long), 0
    t_train = time.perf_counter()
    t_measure = None
    stopped_early = False
    running = None
    while step < total:
        if cursor + args.batch_size > len(order):
            order, cursor = epoch_starts(len(train_stream), args.seq_len, gen), 0
            epoch += 1
        w = windows(train_dev, order[cursor : cursor + args.batch_size], args.seq_len + 1)
        cursor += args.batch_size
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, args)
        try:
            with autocast():
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten())
            loss.backward()
        except RuntimeError as e:
            # Some kernels have no deterministic variant on some builds; keep going, but say so.
            if not (strict and "deterministic" in str(e)):
                raise
            log(f"strict determinism unavailable ({str(e).splitlines()[0]}); continuing with warn_only")
            strict = False
            torch.use_deterministic_algorithms(True, warn_only=True)
            opt.zero_grad(set_to_none=True)
            cursor -= args.batch_size
            continue
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1

        if step % 25 == 0 or step == total:
            running = float(loss.detach())
        if not args.steps and step == measure_from:
            if use_cuda:
                torch.cuda.synchronize()
            t_measure = time.perf_counter()
        if not args.steps and step == measure_to:
            if use_cuda:
                torch.cuda.synchronize()
            rate = (measure_to - measure_from) / (time.perf_counter() - t_measure)
            remaining = args.time_budget - (time.perf_counter() - t_train)
            # 0.9: leave room for the periodic validation passes.
            by_time = step + int(0.9 * remaining * rate)
            total = max(step + 1, min(max_steps, by_time))
            sized_by = "epoch cap" if total == max_steps else "time budget"
            eval_every = max(1, total // max(1, args.evals))
            log(f"{rate:.1f} steps/s ({rate * tokens_per_step / 1e3:.0f}k tok/s): {total} steps ({sized_by})")
        if step % eval_every == 0 or step == total:
            nats, n = evaluate(model, val_dev, args.seq_len, args.batch_size, autocast)
            v = nats / n
            val_curve.append({"step": step, "val_loss": round(v, 4)})
            if v < best_val:
                best_val, best_step = v, step
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
            log(f"step {step}/{total} epoch {epoch} lr {lr_at(step - 1, total, args):.2e} "
                f"train {running if running is not None else float(loss.detach()):.4f} val {v:.4f} "
                f"({time.perf_counter() - t_train:.0f}s)")
        if not args.steps and time.perf_counter() - t_train > 1.25 * args.time_budget:
            # A guard against a slowdown after sizing; the schedule then ends unannealed.
            log(f"stopping at step {step}: over 1.25x the time budget")
            stopped_early = True
            break
    if use_cuda:
        torch.cuda.synchronize()
    timings["train"] = time.perf_counter() - t_train
    steps_run = step

    checkpoint_note = f"The weights are those at the last step ({steps_run})."
    if best_state is not None and best_step != steps_run:
        # The last point of the curve overfits: ship the best one and say which it is.
        model.load_state_dict(best_state)
        checkpoint_note = (f"Validation loss rose late in training, so the shipped weights are those of step "
                           f"{best_step} of {steps_run}, the lowest validation loss on the curve.")
    log(checkpoint_note)

    # Save, then evaluate and sample from the saved 16-bit files, so the numbers describe what ships.
    t0 = time.perf_counter()
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out, args.seq_len)
    save_model(model, tok, out)
    del model, opt, best_state
    torch.use_deterministic_algorithms(False)  # inference only from here; generate() uses ops without the flag

    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    no_autocast = (lambda: torch.autocast("cuda", enabled=False)) if use_cuda else autocast
    train_nats, train_n = evaluate(shipped, train_dev, args.seq_len, args.batch_size, no_autocast)
    val_nats, val_n = evaluate(shipped, val_dev, args.seq_len, args.batch_size, no_autocast)
    train_loss, val_loss = train_nats / train_n, val_nats / val_n
    val_bytes = sum(len(f.text.encode("utf-8", "surrogatepass")) for f in val_files)
    log(f"shipped weights: train {train_loss:.4f} val {val_loss:.4f} unigram {unigram:.4f} nats/token")
    hf_tok = AutoTokenizer.from_pretrained(out)
    samples = greedy_samples(shipped, hf_tok, device, args.sample_tokens)
    for s in samples:
        log(f"sample {s['prompt']!r} -> {s['completion']!r}")
    timings["eval"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    import tokenizers
    import transformers

    device_name = torch.cuda.get_device_name(0) if use_cuda else f"CPU ({platform.processor() or platform.machine()})"
    report = {
        "name": args.name,
        "parameters": n_params,
        "train_loss": round(train_loss, 4),
        "val_loss": round(val_loss, 4),
        "unigram_val_loss": round(unigram, 4),
        "val_bits_per_byte": round(val_nats / val_bytes / math.log(2), 4),
        "loss_unit": "nats/token",
        "steps": steps_run,
        "steps_sized_by": sized_by,
        "stopped_early": stopped_early,
        "shipped_step": best_step if best_step != steps_run and best_step > 0 else steps_run,
        "checkpoint_note": checkpoint_note,
        "epochs": round(steps_run / steps_per_epoch, 2),
        "tokens_seen": steps_run * tokens_per_step,
        "val_curve": val_curve,
        "seed": args.seed,
        "precision": "bf16 autocast, fp32 master weights; saved as float16" if use_cuda
        else "float32; saved as float16",
        "determinism": ("torch.use_deterministic_algorithms(True), fixed data order from the seed"
                        if strict else "torch.use_deterministic_algorithms(True, warn_only=True): some "
                        "kernels had no deterministic variant"),
        "device": device_name,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "hyperparameters": {
            **asdict(shape),
            "batch_size": args.batch_size, "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup,
            "weight_decay": args.weight_decay, "dropout": args.dropout, "max_epochs": args.max_epochs,
            "time_budget_s": args.time_budget,
        },
        "corpus": {
            "python_version": platform.python_version(),
            "platform": f"{platform.system()} {platform.machine()}",
            "stdlib": str(root),
            "excluded_dirs": sorted(EXCLUDED_DIRS),
            "val_every": args.val_every,
            "files_total": len(files),
            "files_skipped": skipped,
            "train_files": len(train_files),
            "val_files": len(val_files),
            "train_bytes": sum(len(f.text.encode("utf-8", "surrogatepass")) for f in train_files),
            "val_bytes": val_bytes,
            "train_tokens": len(train_stream),
            "val_tokens": len(val_stream),
            "sha256": corpus_digest(files),
            "tiny_subset": args.tiny,
        },
        "samples": samples,
        "sample_tokens": args.sample_tokens,
        "weights_sha256": sha256_file(out / "model.safetensors"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
        "command": "python scripts/train_default_model.py " + " ".join(
            [*(["--tiny"] if args.tiny else []), f"--seed {args.seed}", f"--steps {steps_run}"]),
    }
    (out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_card(out, report)
    size = sum(p.stat().st_size for p in out.iterdir())
    log(f"wrote {out} ({size / 1e6:.1f} MB, {len(list(out.iterdir()))} files) in {timings['total']:.0f}s")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
