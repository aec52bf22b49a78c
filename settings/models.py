"""Pydantic models of every studio setting and of a load request."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

ExactMode = Literal["auto", "off", "on"]
# auto: park sequences to host memory, recompute when that memory is exhausted (the engine's default).
PreemptMode = Literal["auto", "park", "recompute"]
FlashAttn = Literal["auto", "on", "off"]
SpecType = Literal["none", "ngram"]
SplitMode = Literal["none", "layer", "row"]
# -ts: up to 8 proportions, e.g. "1,1" or "3/1" (llama-server's two spellings)
TENSOR_SPLIT = r"^\d+(\.\d+)?([,/]\d+(\.\d+)?){0,7}$"
MAX_THREADS = 256


def threads_value(value: object) -> object:
    """'auto' or a thread count (a digit string is read as one); anything else is a ValueError saying so."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if value == "auto" or (type(value) is int and 1 <= value <= MAX_THREADS):
        return value
    raise ValueError(f"expects 'auto' (the engine's default: one per physical core) or a whole number of "
                     f"threads from 1 to {MAX_THREADS}, got {value!r}")


# CPU threads: "auto" passes no -t (the engine's default: its physical cores), a number passes -t N.
Threads = Annotated[Literal["auto"] | int, BeforeValidator(threads_value)]
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]

EXACT_MODES: tuple[str, ...] = get_args(ExactMode)
PREEMPT_MODES: tuple[str, ...] = get_args(PreemptMode)
CACHE_TYPES: tuple[str, ...] = get_args(CacheType)
# The paged exact kernels read unquantized keys and values only.
EXACT_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16")

DEFAULT_EXACT: ExactMode = "off"
DEFAULT_PREEMPT: PreemptMode = "auto"


class LoadDefaults(BaseModel):
    """The load settings used when a load request does not give its own."""

    model_config = ConfigDict(extra="forbid")

    # 0 means the model's native context.
    ctx_size: int = Field(4096, ge=0, le=1 << 24)
    parallel: int = Field(4, ge=1, le=256)
    batch_size: int = Field(2048, ge=1, le=1 << 20)
    ubatch_size: int = Field(512, ge=1, le=1 << 20)
    flash_attn: FlashAttn = "auto"
    # None leaves the engine's default (every layer on the GPU).
    n_gpu_layers: int | None = Field(None, ge=0, le=100_000)
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    spec_type: SpecType = "none"
    spec_draft_n_max: int = Field(16, ge=0, le=256)
    extra_args: list[str] = Field(default_factory=list)
    # tensor parallelism; None leaves the engine's default (one GPU)
    tp: int | None = Field(None, ge=1, le=8)
    tensor_split: str | None = Field(None, pattern=TENSOR_SPLIT)
    split_mode: SplitMode | None = None
    threads: Threads = "auto"


class ApiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(8765, ge=1, le=65535)
    api_key: str | None = None
    # Browser origins granted CORS (e.g. "http://localhost:3000"); none by default.
    cors_origins: list[str] = Field(default_factory=list)


class Settings(BaseModel):
    """Everything the studio stores in settings.json."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    model_folders: list[str] = Field(default_factory=list)
    # None means "not set": the precedence falls through to an inherited LOCKSTEP_EXACT, then off.
    exact_concurrency: ExactMode | None = None
    preempt_mode: PreemptMode | None = None
    load: LoadDefaults = Field(default_factory=LoadDefaults)
    api: ApiSettings = Field(default_factory=ApiSettings)
    health_timeout_s: float = Field(180.0, gt=0, le=3600)
    # A /v1 request naming a catalog model that is not loaded loads it (Ollama's way) instead of a 404.
    auto_load: bool = False


class LoadRequest(BaseModel):
    """The body of POST /api/load; unset fields take the stored load defaults."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str = Field(min_length=1, max_length=4096)
    ctx_size: int | None = Field(None, ge=0, le=1 << 24)
    parallel: int | None = Field(None, ge=1, le=256)
    batch_size: int | None = Field(None, ge=1, le=1 << 20, validation_alias=AliasChoices("batch_size", "batch"))
    ubatch_size: int | None = Field(
        None, ge=1, le=1 << 20, validation_alias=AliasChoices("ubatch_size", "ubatch")
    )
    flash_attn: FlashAttn | None = None
    n_gpu_layers: int | None = Field(None, ge=0, le=100_000)
    cache_type_k: CacheType | None = None
    cache_type_v: CacheType | None = None
    spec_type: SpecType | None = None
    spec_draft_n_max: int | None = Field(None, ge=0, le=256)
    # None takes the stored extra args; a list (even empty) replaces them.
    extra_args: list[str] | None = None
    exact_concurrency: ExactMode | None = None
    preempt_mode: PreemptMode | None = None
    tp: int | None = Field(None, ge=1, le=8)
    tensor_split: str | None = Field(None, pattern=TENSOR_SPLIT)
    split_mode: SplitMode | None = None
    threads: Threads | None = None

    def with_defaults(self, defaults: LoadDefaults) -> LoadDefaults:
        given = {k: v for k, v in self.model_dump(exclude={"model", "exact_concurrency", "preempt_mode"}).items()
                 if v is not None}
        return defaults.model_copy(update=given)
