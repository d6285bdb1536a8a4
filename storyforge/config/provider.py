"""Structured config schemas for the ``provider`` group (registered by storyforge.config).

Takes: nothing. Gives: the schema dataclasses behind ``conf/provider/*.yaml`` and
:func:`register`, which stores them as ``base_provider`` (no model server: prompts only),
``base_provider_openai``, ``base_provider_ollama`` and ``base_provider_llama_cpp``. Cross-field rules live in each
schema's ``check()``; :func:`storyforge.providers.build_provider` calls it right after
``OmegaConf.to_object`` so a bad value fails before any request, naming its key.

Secrets never live here: ``api_key_env`` holds the *name* of an environment variable, so
the composed config (and Hydra's ``.hydra/`` snapshot of it) is safe to write out.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from storyforge.config.common import Sealed
from storyforge.config.hydra_errors import unknown_fields_message
from storyforge.errors import ConfigError

__all__ = [
    "CACHE_DIR_ENV",
    "OLLAMA_PREFIX_MODES",
    "OPENAI_PREFIX_MODES",
    "USER_CACHE",
    "CacheSettings",
    "GenerationSettings",
    "LlamaCppProviderConf",
    "OllamaProviderConf",
    "OpenAIProviderConf",
    "ProviderConf",
    "cache_settings",
    "check_replay_cache",
    "describe_user_cache",
    "generation_settings",
    "max_completion_tokens",
    "model_info",
    "provider_conf",
    "provider_enabled",
    "provider_settings",
    "register",
    "user_cache_path",
]

# How a server is told to continue a final ``prefix: true`` assistant message.
#   unsupported            refuse such prompts before sending anything (the safe default)
#   continue_final_message vLLM / Aphrodite / SGLang: body flags continue_final_message=true,
#                          add_generation_prompt=false
#   prefix_field           Mistral / DeepSeek style: keep ``"prefix": true`` on the message
#   trailing_assistant     llama.cpp server, Ollama: a final assistant message is continued
#                          implicitly (depends on the model's chat template; verify first)
OPENAI_PREFIX_MODES = ("unsupported", "continue_final_message", "prefix_field", "trailing_assistant")
OLLAMA_PREFIX_MODES = ("unsupported", "trailing_assistant")
ON_STALE = ("refuse", "redo")
ON_MODEL_MISMATCH = ("error", "warn")
REPLAY = ("off", "only")


@dataclass
class ProviderConf(Sealed):
    """Settings every provider shares; ``name: none`` (no ``_target_``) renders prompts only."""

    _target_: str | None = None
    name: str = "none"
    samples: int = 1
    concurrency: int = 8
    timeout_s: float = 120.0
    max_retries: int = 5
    # Full-jitter exponential backoff: sleep uniform(0, min(backoff_max_s, base * 2**attempt)).
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    # A server's Retry-After is honoured up to this many seconds (a longer one is logged and cut).
    max_retry_after_s: float = 30.0
    # Answers larger than this are refused (recorded as errors, never kept whole in memory).
    # Far above any max_tokens: 512 tokens of text are a few kB.
    max_response_bytes: int = 8 * 1024 * 1024
    # Stop the run when nothing has succeeded for this many seconds and every try failed the
    # same way (connection refused, or the same server error); 0 turns the check off.
    fail_fast_s: float = 10.0
    # The largest share of errors a run may have: requests that still failed after every retry
    # (every attempt) and judged answers with no valid verdict, over all requests and judged
    # answers (storyforge.providers.error_budget). Above it the run exits 4, as soon as that is
    # certain; a rerun into the same directory retries the failed requests.
    max_error_rate: float = 0.05
    # Records in generations.jsonl made under another request body: refuse the run, or
    # move them to generations.replaced.jsonl and generate again.
    on_stale: str = "refuse"
    # Also retry requests recorded as errors by an earlier run into the same directory.
    retry_errors: bool = True
    progress: bool = True
    # Honour HTTP(S)_PROXY / NO_PROXY from the environment.
    trust_env: bool = True
    # An answer whose ``model`` is not provider.model (single-model servers answer any name):
    # error stops the run, warn keeps the answers and records the served model in each record.
    on_model_mismatch: str = "error"
    # off: ask the servers (through the response cache when cache.path is set);
    # only: answer every request from the cache and send nothing (a missing one is an error).
    replay: str = "off"
    # What the response cache files this run's answers under. null: what the server reports
    # (llama.cpp /props, /v1/models, Ollama /api/tags; else the base URL), read once per run.
    # A name shares answers on purpose between servers given the same name; 16 hex digits are
    # a digest a manifest recorded (generation.cache.identity.digest).
    cache_identity: str | None = None
    # samples > 1: one request with n=samples per prompt, so the server reads the prompt once.
    # false (the default: one request per sample, as before), true, or auto (true on the
    # OpenAI-compatible API, false on Ollama's, which has no n). See providers/choices.py.
    n_per_request: Any = False
    # Stop (exit 5, resumable) once the run has spent this much, priced by the pricing group;
    # refuse to start when even the estimate's lower bound is above it. null: no limit.
    max_cost_usd: float | None = None

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the first key that breaks a rule."""
        if self.max_cost_usd is not None and not self.max_cost_usd > 0:
            raise ConfigError(f"provider.max_cost_usd must be null or > 0, got {self.max_cost_usd!r}")
        _at_least("samples", self.samples, 1)
        _at_least("concurrency", self.concurrency, 1)
        _at_least("max_retries", self.max_retries, 0)
        for key in ("timeout_s", "backoff_base_s", "backoff_max_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"provider.{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("max_retry_after_s", "fail_fast_s"):
            if getattr(self, key) < 0:
                raise ConfigError(f"provider.{key} must be >= 0, got {getattr(self, key)!r}")
        _at_least("max_response_bytes", self.max_response_bytes, 1024)
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ConfigError(f"provider.max_error_rate must be between 0 and 1, got {self.max_error_rate!r}")
        _one_of("on_stale", self.on_stale, ON_STALE)
        _one_of("on_model_mismatch", self.on_model_mismatch, ON_MODEL_MISMATCH)
        _one_of("replay", self.replay, REPLAY)
        if self.cache_identity is not None and not str(self.cache_identity).strip():
            raise ConfigError("provider.cache_identity must be null or a non-empty name")
        _one_of("n_per_request", str(self.n_per_request).lower(), ("auto", "true", "false"))
        if self._target_ is not None and not self._target_.startswith("storyforge.providers."):
            raise ConfigError(
                f"provider._target_ must name a class inside storyforge.providers, got {self._target_!r}"
            )


@dataclass
class OpenAIProviderConf(ProviderConf):
    """Any OpenAI-compatible ``POST {base_url}/chat/completions`` server (vLLM, llama.cpp, ...)."""

    _target_: str | None = "storyforge.providers.openai.OpenAIProvider"
    name: str = "openai"
    # One URL, or a list of endpoints serving the same model: requests are spread over them
    # (provider.concurrency each); one that stops answering is taken out and tried again later.
    base_url: Any = "http://localhost:8000/v1"
    model: str = MISSING
    # NAME of the environment variable holding the key; null sends no Authorization header.
    api_key_env: str | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    max_tokens: int | None = 512
    # With a seed, sample k is requested with seed + k so the samples of one prompt differ.
    seed: int | None = None
    prefix_continuation: str = "unsupported"
    # Server-specific fields merged into every request body (e.g. vLLM's min_p).
    extra_body: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        ProviderConf.check(self)
        urls = self.base_urls()
        for n, url in enumerate(urls):
            _http_url("base_url" if isinstance(self.base_url, str) else f"base_url[{n}]", url)
        if len(set(urls)) != len(urls):
            raise ConfigError(f"provider.base_url lists an endpoint twice: {urls!r}")
        _one_of("prefix_continuation", self.prefix_continuation, OPENAI_PREFIX_MODES)
        if self.max_tokens is not None:
            _at_least("max_tokens", self.max_tokens, 1)
        if self.api_key_env is not None and not self.api_key_env.strip():
            raise ConfigError("provider.api_key_env must be an environment variable name or null")
        clash = {"model", "messages", "stream", "n"} & set(self.extra_body)
        if clash:
            raise ConfigError(
                f"provider.extra_body may not set {', '.join(sorted(clash))}: storyforge sets them itself"
            )

    def base_urls(self) -> list[str]:
        """``base_url`` as a list of endpoints (one or more)."""
        value = self.base_url
        if isinstance(value, str):
            return [value]
        if isinstance(value, (list, tuple)) and value and all(isinstance(u, str) for u in value):
            return list(value)
        raise ConfigError(f"provider.base_url must be a URL or a non-empty list of URLs, got {value!r}")


@dataclass
class OllamaProviderConf(ProviderConf):
    """Ollama's native ``POST {host}/api/chat`` (non-streaming)."""

    _target_: str | None = "storyforge.providers.ollama.OllamaProvider"
    name: str = "ollama"
    host: str = "http://localhost:11434"
    model: str = MISSING
    # Passed through as the request's ``options`` (temperature, top_p, num_predict, seed, num_ctx…).
    # With options.seed, sample k is requested with seed + k.
    options: dict[str, Any] = field(default_factory=dict)
    keep_alive: str | None = None
    prefix_continuation: str = "unsupported"

    def check(self) -> None:
        ProviderConf.check(self)
        _http_url("host", self.host)
        _one_of("prefix_continuation", self.prefix_continuation, OLLAMA_PREFIX_MODES)
        seed = self.options.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"provider.options.seed must be an integer, got {seed!r}")


#: ``base_url`` of ``provider=llama_cpp`` until its server runs (the runner sets the real one).
MANAGED_URL = "http://127.0.0.1:0/v1"


@dataclass
class LlamaCppProviderConf(OpenAIProviderConf):
    """A ``llama-server`` that the run starts itself for one GGUF file, and stops when done.

    Requests go through the OpenAI-compatible client exactly as with ``provider=openai``; see
    :mod:`storyforge.providers.llama_cpp` for how the server is started and sized.
    """

    _target_: str | None = "storyforge.providers.llama_cpp.LlamaCppProvider"
    name: str = "llama_cpp"
    base_url: Any = MANAGED_URL
    # The model file served (a path, relative to the directory the run starts in).
    gguf: str = MISSING
    # The name the server answers to (--alias), the requests' model and the pricing key;
    # null: the file's name without .gguf.
    model: Any = None
    # The llama-server program; null: the build in ~/.cache/storyforge (storyforge setup-model).
    server_bin: str | None = None
    # CPU threads per server (-t). 1 holds up on a busy machine (measured: 11-12 tokens/s per slot
    # under load against 0.3-1.2 with 2); raise it on an idle machine with cores to spare.
    threads: int = 1
    # Tokens of context per slot; null: the longest request of each pass plus max_tokens.
    # The server gets concurrency slots (-np) and concurrency times this context (-c).
    context: int | None = None
    # Seconds to wait for the server's /health after starting it (it loads the model first).
    startup_timeout_s: float = 120.0
    # More llama-server arguments, as a list (e.g. [--no-jinja], [-ngl, "99"] for a GPU build).
    server_args: list[str] = field(default_factory=list)
    concurrency: int = 2
    max_tokens: int | None = 256

    def check(self) -> None:
        if self.base_url != MANAGED_URL:
            raise ConfigError(
                "provider.base_url: provider=llama_cpp starts its own server; for a server that is "
                "already running use provider=openai provider.base_url=URL"
            )
        if not isinstance(self.gguf, str) or not self.gguf.strip():
            raise ConfigError("provider.gguf is required: the path of a .gguf model file")
        path = Path(self.gguf).expanduser()
        if not path.is_file():
            raise ConfigError(f"provider.gguf: no such file: {path}")
        self.gguf = str(path.absolute())
        if self.model is None:
            self.model = gguf_alias(self.gguf)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"provider.model must be a non-empty name or null, got {self.model!r}")
        if self.server_bin is not None:
            binary = Path(self.server_bin).expanduser()
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                raise ConfigError(f"provider.server_bin: not an executable file: {binary}")
            self.server_bin = str(binary.absolute())
        _at_least("threads", self.threads, 1)
        if self.context is not None:
            _at_least("context", self.context, 64)
        if not self.startup_timeout_s > 0:
            raise ConfigError(f"provider.startup_timeout_s must be > 0, got {self.startup_timeout_s!r}")
        if self.api_key_env is not None:
            raise ConfigError("provider.api_key_env: the managed llama-server takes no key; leave it null")
        managed = {
            "-m",
            "--model",
            "--alias",
            "-a",
            "--host",
            "--port",
            "-c",
            "--ctx-size",
            "-np",
            "--parallel",
        }
        taken = sorted(managed & {str(arg).split("=", 1)[0] for arg in self.server_args})
        if taken:
            raise ConfigError(
                f"provider.server_args may not set {', '.join(taken)}: provider=llama_cpp sets it "
                "(provider.gguf, provider.model, provider.context, provider.concurrency)"
            )
        OpenAIProviderConf.check(self)


def gguf_alias(gguf: str) -> str:
    """The name a GGUF file is served under by default: its file name without ``.gguf``."""
    name = Path(gguf).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


_SCHEMAS: dict[str, type[ProviderConf]] = {
    "none": ProviderConf,
    "openai": OpenAIProviderConf,
    "ollama": OllamaProviderConf,
    "llama_cpp": LlamaCppProviderConf,
}


def provider_enabled(cfg: DictConfig | Mapping[str, Any]) -> bool:
    """True when the config selects a model server (``provider`` other than ``none``)."""
    provider = cfg.get("provider")
    return provider is not None and provider.get("name", "none") != "none"


def provider_conf(cfg: DictConfig | Mapping[str, Any]) -> ProviderConf:
    """``cfg.provider`` as its checked, sealed schema object (a missing or bad key is a ConfigError)."""
    node = cfg.get("provider")
    if node is None:
        raise ConfigError("no provider in the config; add provider=openai or provider=ollama")
    if isinstance(node, ProviderConf):
        obj: object = node
    else:
        try:
            obj = OmegaConf.to_object(node) if isinstance(node, DictConfig) else dict(node)
        except MissingMandatoryValue as exc:
            full_key = exc.full_key or "model"
            key = full_key if full_key.startswith("provider") else f"provider.{full_key}"
            raise ConfigError(f"{key} is required; set it on the command line ({key}=...)") from None
        except OmegaConfBaseException as exc:
            raise ConfigError(f"provider config is invalid: {exc}") from None
    if isinstance(obj, dict):
        settings = {str(k): v for k, v in obj.items()}
        name = str(settings.get("name", "none"))
        schema = _SCHEMAS.get(name)
        if schema is None:
            raise ConfigError(f"provider.name must be one of {', '.join(_SCHEMAS)}; got {name!r}")
        known = [f.name for f in dataclasses.fields(schema) if f.init]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ConfigError(unknown_fields_message(f"provider.{unknown[0]}", unknown, known, "provider"))
        obj = schema(**settings)
    if not isinstance(obj, ProviderConf):
        raise ConfigError(f"provider config has an unexpected type {type(obj).__name__}")
    obj.check()
    return obj.seal()


# ``cache.path: user`` (the default): this user's response cache, shared by every run and
# sweep job on the machine; ``cache.path=null`` turns the cache off.
USER_CACHE = "user"
# Overrides the directory of the user's response cache (the test suite points it at a
# temporary directory so no test reads or writes the real one).
CACHE_DIR_ENV = "STORYFORGE_RESPONSE_CACHE_DIR"
CACHE_FILE = "responses.sqlite"


def _platform_cache_root(environ: Mapping[str, str]) -> Path:
    """The platform's per-user cache directory (XDG on Linux and other Unix systems)."""
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "win32":
        local = environ.get("LOCALAPPDATA")
        return Path(local) if local else home / "AppData" / "Local"
    if sys.platform == "darwin":
        return home / "Library" / "Caches"
    xdg = environ.get("XDG_CACHE_HOME", "").strip()
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    return Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".cache"


def user_cache_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``cache.path=user`` points: ``$STORYFORGE_RESPONSE_CACHE_DIR/responses.sqlite``,
    else ``<platform cache dir>/storyforge/responses.sqlite`` (``$XDG_CACHE_HOME``, else
    ``~/.cache`` on Linux)."""
    env = os.environ if environ is None else environ
    given = env.get(CACHE_DIR_ENV, "").strip()
    if given:
        return Path(given).expanduser().absolute() / CACHE_FILE
    return _platform_cache_root(env) / "storyforge" / CACHE_FILE


def describe_user_cache(environ: Mapping[str, str] | None = None) -> str:
    """The user cache's location and size on disk (the file and its WAL), for ``--help``."""
    path = user_cache_path(environ)
    parts = [path, path.with_name(path.name + "-wal")]
    sizes = [p.stat().st_size for p in parts if p.is_file()]
    if not sizes:
        return f"{path}, not created yet"
    return f"{path}, {sum(sizes) / 1e6:.1f} MB"


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSettings:
    """The ``cache`` group: the response cache file (absolute), or ``None`` for no cache."""

    path: Path | None = None


def check_replay_cache(replay: str, cache: CacheSettings, *, unanswered: str | None) -> None:
    """``provider.replay=only`` answers from the response cache: without one (``cache.path=null``)
    only a journal that already holds every answer can serve the run. ``unanswered`` says what
    the journal lacks (None: nothing, or not known yet)."""
    if replay == "only" and cache.path is None and unanswered is not None:
        raise ConfigError(
            f"provider.replay=only answers from the response cache, which cache.path=null turns off "
            f"({unanswered}); set cache.path=FILE (or leave the default, cache.path=user)"
        )


def cache_settings(cfg: DictConfig | Mapping[str, Any]) -> CacheSettings:
    """``cfg.cache.path`` made absolute against the directory the run started in;
    ``user`` (the default) is this user's cache (:func:`user_cache_path`), ``null`` is none."""
    from hydra.utils import to_absolute_path

    node = cfg.get("cache")
    path = node.get("path") if node is not None else None
    if path is None:
        return CacheSettings()
    if str(path) == USER_CACHE:
        return CacheSettings(path=user_cache_path())
    return CacheSettings(path=Path(to_absolute_path(str(Path(str(path)).expanduser()))))


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationSettings:
    """What generation reads: the provider, the response cache, ``strict`` and ``resume``."""

    provider: ProviderConf
    cache: CacheSettings = field(default_factory=CacheSettings)
    strict: bool = False
    resume: bool = False


def generation_settings(cfg: DictConfig | Mapping[str, Any]) -> GenerationSettings:
    """The generation part of ``cfg`` (its provider must name a model server)."""
    return GenerationSettings(
        provider=provider_conf(cfg),
        cache=cache_settings(cfg),
        strict=bool(cfg.get("strict", False)),
        resume=bool(cfg.get("resume", False)),
    )


def provider_settings(cfg: DictConfig) -> ProviderConf | None:
    """The checked provider of a run that sends requests, or ``None`` for ``provider=none``."""
    return provider_conf(cfg) if provider_enabled(cfg) else None


def model_info(provider: Any) -> dict[str, Any]:
    """``ctx.model`` for a provider config node: provider name, model name, prefill support.

    ``prefill`` is false only when the provider sends requests and cannot continue an
    assistant prefix (``prefix_continuation: unsupported``); rendering alone never refuses
    a prefix. A missing ``model`` (``???``) gives ``None``: rendering needs no model.
    """
    if provider is None:
        return {"provider": "none", "name": None, "prefill": True}
    node = provider if isinstance(provider, DictConfig) else OmegaConf.create(dict(provider))
    name = OmegaConf.select(node, "name", default="none", throw_on_missing=False)
    model = OmegaConf.select(node, "model", default=None, throw_on_missing=False)  # ??? gives None
    gguf = OmegaConf.select(node, "gguf", default=None, throw_on_missing=False)
    if model is None and gguf is not None:  # provider=llama_cpp serves the file under its stem
        model = gguf_alias(str(gguf))
    mode = OmegaConf.select(node, "prefix_continuation", default="unsupported", throw_on_missing=False)
    return {
        "provider": str(name),
        "name": None if model is None else str(model),
        "prefill": str(name) == "none" or mode != "unsupported",
    }


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"provider.{key} must be >= {low}, got {value!r}")


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"provider.{key} must be one of {', '.join(allowed)}; got {value!r}")


def _http_url(key: str, value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise ConfigError(f"provider.{key} must start with http:// or https://, got {value!r}")


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="provider", name="base_provider", node=ProviderConf)
    cs.store(group="provider", name="base_provider_openai", node=OpenAIProviderConf)
    cs.store(group="provider", name="base_provider_ollama", node=OllamaProviderConf)
    cs.store(group="provider", name="base_provider_llama_cpp", node=LlamaCppProviderConf)
    # `python run.py --help` shows where the user's response cache is and how big it has grown.
    OmegaConf.register_new_resolver("storyforge_user_cache", lambda: describe_user_cache(), replace=True)


def max_completion_tokens(provider: ProviderConf) -> int | None:
    """The completion cap a request carries (``max_tokens``, Ollama's ``options.num_predict``)."""
    cap = getattr(provider, "max_tokens", None)
    if cap is None:
        options = getattr(provider, "options", None) or {}
        cap = options.get("num_predict")
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
