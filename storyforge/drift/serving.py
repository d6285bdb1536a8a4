"""The serving sides: a GGUF's own template and vocabulary, a running llama-server, and an
OpenAI-compatible server's ``/tokenize`` (vLLM).

Takes: a GGUF path, or a server's URL. Gives: :class:`GGUFSide`, :class:`LlamaServerSide`
and :class:`OpenAITokenizeSide`, each a :class:`~storyforge.drift.sides.Side` that renders
an example as that server would: the prompt turns with the generation prompt, then (for a
training row) the answer as generated and the token generation stops on.

Why each:

- the GGUF is what llama.cpp and Ollama load: its embedded ``tokenizer.chat_template``
  (rendered with the same sandboxed Jinja as ``transformers``), its vocabulary and its
  ``add_bos_token``/``add_eos_token`` flags decide the ids even when no server runs
  (a BOS the template writes is dropped where the vocabulary adds one, as llama.cpp does);
- a running ``llama-server`` is the renderer itself (its own Jinja engine, its built-in
  templates, its fallback when a template fails): ``POST /apply-template`` gives the text and
  ``POST /tokenize`` (special tokens parsed, BOS/EOS added as the server adds them to a
  prompt) the ids. Requests run concurrently on keep-alive connections and ``/tokenize``
  takes many texts per request (a negative id separates them; the server copies ids through).
  ``/apply-template`` costs the server about a millisecond and a half per call, so unless
  ``render_each`` is set it is asked once per conversation shape (the sequence of roles) with
  placeholder contents, and the answer is filled in with each example's text; that shortcut
  is taken only when the template provably copies text as is for that shape (placeholders
  padded with whitespace come back padded, each appears once, and a sample of 32 real
  examples rendered by the server equals the filled-in text), else every example is sent.
  llama.cpp drops a BOS the template writes when the vocabulary adds one itself, so its chat
  endpoint never doubles BOS; a client that renders the prompt itself and sends the text to
  ``/completion`` gets the BOS twice (``prompt_text``: the training template's text,
  tokenized by the server as a prompt is);
- vLLM's ``POST /tokenize`` renders and tokenizes chat messages in one call, with
  ``continue_final_message`` for a training row's answer, and reports ``max_model_len``.

Every answer is read under :data:`MAX_ANSWER_BYTES` (``provider.max_response_bytes``'s
default; ``/tokenize`` requests are sized so that a real answer fits) and checked for the
shape the gate reads; an endless, non-JSON or malformed answer is a
:class:`~storyforge.errors.ProviderError`: the gate could not run.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from storyforge.config.provider import ProviderConf
from storyforge.drift.examples import Example
from storyforge.drift.jinja import TemplateLimitError, render_chat
from storyforge.drift.sides import Rendering
from storyforge.drift.vocab import GGUFVocabulary, read_gguf
from storyforge.errors import DataError, ProviderError
from storyforge.extras import require
from storyforge.providers.retry import read_capped

__all__ = ["GGUFSide", "LlamaServerSide", "OpenAITokenizeSide"]

T = TypeVar("T")
_SEPARATOR = -1  # never a token id: splits one /tokenize answer back into its texts
_TOKENIZE_BATCH = 256
_CONCURRENCY = 2  # measured: 8 connections of 256-text /tokenize requests were 10x slower on 2 cores
_TRIES = 3
_SHAPE_SAMPLE = 32  # real examples per conversation shape rendered by the server to confirm a filler
#: an answer larger than this is refused, as the provider refuses one (provider.max_response_bytes)
MAX_ANSWER_BYTES: int = ProviderConf.max_response_bytes
#: characters of text per /tokenize request: at most as many tokens, each id at most 7 bytes of
#: JSON, so the answer stays under MAX_ANSWER_BYTES
_TOKENIZE_CHARS = MAX_ANSWER_BYTES // 8


def _expect(answer: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``answer[key]`` when the answer is an object holding that key with the type ``kind``;
    else :class:`ProviderError` naming the endpoint (a malformed answer: the gate cannot run)."""
    value = answer.get(key) if isinstance(answer, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        got = (
            f"a JSON {type(answer).__name__}"
            if not isinstance(answer, dict)
            else f"{key}={str(value)[:80]!r}"
        )
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ProviderError(f"{where} answered malformed JSON: expected {key!r} ({want}), got {got}")
    return value


def _ids(answer: Any, where: str) -> list[int]:
    tokens = _expect(answer, "tokens", list, where)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ProviderError(f"{where} answered malformed JSON: 'tokens' must be a list of integers")
    return list(tokens)


class GGUFSide(GGUFVocabulary):
    """A GGUF's embedded template and vocabulary (see the module)."""

    def __init__(self, path: str) -> None:
        info = read_gguf(path)
        self.name = f"gguf {path}"
        if not info.chat_template:
            raise DataError(
                f"{path}: the GGUF has no tokenizer.chat_template; name the template with --server"
            )
        super().__init__(info)
        self.end_ids = frozenset({self.info.eos_id} if self.info.eos_id is not None else ())
        self.n_ctx = self.info.context_length

    def _encode(self, text: str) -> list[int]:
        # as llama.cpp applies a template: a BOS (EOS) the template writes where the vocabulary
        # adds one anyway is removed from the text first (common/chat.cpp)
        bos, eos = self.info.token(self.info.bos_id), self.info.token(self.info.eos_id)
        if self.info.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        if self.info.add_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
        if self.info.add_bos and self.info.bos_id is not None:
            ids.insert(0, self.info.bos_id)
        if self.info.add_eos and self.info.eos_id is not None:
            ids.append(self.info.eos_id)
        return ids

    def render(self, examples: Sequence[Example]) -> list[Rendering]:
        out = []
        tokens: dict[str, Any] = {
            "bos_token": self.info.token(self.info.bos_id),
            "eos_token": self.info.token(self.info.eos_id),
        }
        template = str(self.info.chat_template)
        for example in examples:
            try:
                text = render_chat(
                    template, example.as_dicts(example.prompt), generation_prompt=True, **tokens
                )
            except TemplateLimitError as exc:
                raise DataError(f"{self.info.path}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 (a template error is a finding about this example, not a crash
                out.append(Rendering(text="", ids=(), error=f"the GGUF template failed: {exc}"))
                continue
            ids = self._encode(text + (example.answer or ""))
            if example.training and self.info.eos_id is not None:
                ids.append(self.info.eos_id)
            out.append(Rendering(text=text + (example.answer or ""), ids=tuple(ids)))
        return out


def _run(coro_factory: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(coro_factory())  # type: ignore[arg-type]


async def _gather_limited(jobs: Sequence[Awaitable[T]], limit: int) -> list[T]:
    """Await ``jobs`` with at most ``limit`` in flight (one per pooled connection)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(job: Awaitable[T]) -> T:
        async with semaphore:
            return await job

    return list(await asyncio.gather(*(one(j) for j in jobs)))


class _HTTPSide:
    """A server on a base URL, asked with JSON POSTs over a keep-alive pool."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 60.0,
        concurrency: int = _CONCURRENCY,
        tokenize_batch: int = _TOKENIZE_BATCH,
    ) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.tokenize_batch = tokenize_batch
        self._session: Any = None

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """POST JSON; these requests change nothing on the server, so a connection the server
        closed under a reused keep-alive socket is retried (3 tries) before giving up."""
        import aiohttp

        for attempt in range(_TRIES):
            try:
                async with self._session.post(self.url + path, json=body) as answer:
                    text = await self._text(answer, path)
                    if answer.status != 200:
                        raise ProviderError(
                            f"{self.url}{path} answered {answer.status}: {text[:300]}",
                            status=answer.status,
                            body=text[:2000],
                        )
                    return self._json(text, path)
            except (TimeoutError, aiohttp.ClientError) as exc:
                if attempt + 1 < _TRIES and isinstance(exc, aiohttp.ClientConnectionError):
                    await asyncio.sleep(0.05 * (attempt + 1))
                    continue
                raise ProviderError(
                    f"{self.url}{path}: no answer ({exc.__class__.__name__}: {exc})"
                ) from None
        raise AssertionError("unreachable")

    async def _text(self, answer: Any, path: str) -> str:
        data = await read_capped(answer, MAX_ANSWER_BYTES)
        if data is None:
            raise ProviderError(
                f"{self.url}{path}: the answer is larger than {MAX_ANSWER_BYTES} bytes (refused)"
            )
        return data.decode("utf-8", errors="replace")

    def _json(self, text: str, path: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise ProviderError(f"{self.url}{path} answered text that is not JSON: {text[:80]!r}") from None

    async def _get(self, path: str) -> Any:
        import aiohttp

        try:
            async with self._session.get(self.url + path) as answer:
                if answer.status != 200:
                    return None
                return self._json(await self._text(answer, path), path)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ProviderError(f"{self.url}{path}: no answer ({exc.__class__.__name__}: {exc})") from None

    async def _detokenize(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        return _run(lambda: self._with_session(lambda: self._detokenize(ids)))

    async def _with_session(self, work: Callable[[], Awaitable[T]]) -> T:
        require("aiohttp", extra="drift", for_what="the drift gate's serving side")
        import aiohttp

        connector = aiohttp.TCPConnector(limit=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as session:
            self._session = session
            try:
                return await work()
            finally:
                self._session = None


class LlamaServerSide(_HTTPSide):
    """A running llama-server (see the module)."""

    def __init__(
        self,
        url: str,
        *,
        prompt_text: Callable[[Example], str] | None = None,
        render_each: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, **kwargs)
        self.prompt_text = prompt_text
        self.render_each = render_each
        self.name = f"llama-server {self.url}" + (" (text prompts)" if prompt_text else "")
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.add_bos: bool | None = None
        self.end_ids: frozenset[int] = frozenset()
        self.n_ctx: int | None = None
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        self._pieces: dict[int, str] = {}
        _run(lambda: self._with_session(self._probe))

    async def _probe(self) -> None:
        props = await self._get("/props") or {}
        if not isinstance(props, dict):
            raise ProviderError(f"{self.url}/props answered malformed JSON: expected an object")
        settings = props.get("default_generation_settings") or {}
        n_ctx = (settings.get("n_ctx") if isinstance(settings, dict) else None) or props.get("n_ctx")
        self.n_ctx = n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None
        where = f"{self.url}/tokenize"
        plain = _ids(await self._post("/tokenize", {"content": "a", "add_special": False}), where)
        full = _ids(await self._post("/tokenize", {"content": "a", "add_special": True}), where)
        start = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
        self._prefix, self._suffix = full[:start], full[start + len(plain) :]
        for key in ("bos_token", "eos_token"):
            text = props.get(key)
            if isinstance(text, str) and text:
                ids = _ids(await self._post("/tokenize", {"content": text, "add_special": False}), where)
                if len(ids) == 1:
                    if key == "bos_token":
                        self.bos_id = ids[0]
                    else:
                        self.end_ids = frozenset(ids)
                        self.eos_id = ids[0]
        self.add_bos = self.bos_id is not None and self.bos_id in self._prefix

    async def _tokenize_many(self, texts: Sequence[str]) -> list[list[int]]:
        content: list[Any] = []
        for text in texts:
            content += [text, _SEPARATOR]
        body = {"content": content, "add_special": False, "parse_special": True}
        tokens = _ids(await self._post("/tokenize", body), f"{self.url}/tokenize")
        out: list[list[int]] = [[]]
        for token in tokens:
            if token == _SEPARATOR:
                out.append([])
            else:
                out[-1].append(token)
        if len(out) != len(texts) + 1:
            raise ProviderError(f"{self.url}/tokenize returned {len(out) - 1} texts for {len(texts)}")
        return out[:-1]

    async def _apply(self, messages: list[dict[str, str]]) -> str | Exception:
        try:
            body = {"messages": messages, "add_generation_prompt": True}
            return str(
                _expect(
                    await self._post("/apply-template", body), "prompt", str, f"{self.url}/apply-template"
                )
            )
        except ProviderError as exc:
            if exc.status is None:
                raise
            return exc

    async def _templates(self, examples: Sequence[Example]) -> list[str | Exception]:
        """The server's prompt text of each example: one request each (``render_each``), or
        one per conversation shape when the template is found to copy message text as is."""
        if self.prompt_text is not None:
            return [self.prompt_text(e) for e in examples]
        out: list[str | Exception | None] = [None] * len(examples)
        shapes: dict[tuple[str, ...], list[int]] = {}
        for index, example in enumerate(examples):
            shapes.setdefault(tuple(m.role for m in example.prompt), []).append(index)
        direct: list[int] = []
        for roles, members in shapes.items():
            fill = None if self.render_each else await self._shape(roles, [examples[i] for i in members])
            if fill is None:
                direct += members
                continue
            for i in members:
                out[i] = fill(examples[i])
        texts = await _gather_limited(
            [self._apply(examples[i].as_dicts(examples[i].prompt)) for i in direct], self.concurrency
        )
        for i, text in zip(direct, texts, strict=True):
            out[i] = text
        return [t if t is not None else ValueError("not rendered") for t in out]

    async def _shape(
        self, roles: tuple[str, ...], members: Sequence[Example]
    ) -> Callable[[Example], str] | None:
        """A filler for conversations with these roles, or ``None`` when the template does more
        than copy message text: whitespace around a placeholder must survive, each placeholder
        must appear once, and a sample of real examples must render exactly as filled in."""
        marks = [f"\u2983sf{i}\u2984" for i in range(len(roles))]
        skeleton = await self._apply([{"role": r, "content": m} for r, m in zip(roles, marks, strict=True)])
        padded = await self._apply(
            [{"role": r, "content": f"  \n{m} \n"} for r, m in zip(roles, marks, strict=True)]
        )
        if isinstance(skeleton, Exception) or isinstance(padded, Exception):
            return None
        if any(skeleton.count(m) != 1 for m in marks):
            return None
        pattern = re.compile("|".join(re.escape(m) for m in marks))
        index = {m: i for i, m in enumerate(marks)}

        def fill(example: Example) -> str:
            contents = [m.content for m in example.prompt]
            return pattern.sub(lambda found: contents[index[found.group(0)]], skeleton)

        if pattern.sub(lambda found: f"  \n{found.group(0)} \n", skeleton) != padded:
            return None
        step = max(1, len(members) // _SHAPE_SAMPLE)
        sample = list(members[::step][:_SHAPE_SAMPLE]) + list(members[-1:])
        rendered = await _gather_limited(
            [self._apply(e.as_dicts(e.prompt)) for e in sample], self.concurrency
        )
        if any(text != fill(e) for e, text in zip(sample, rendered, strict=True)):
            return None
        return fill

    async def _render_all(self, examples: Sequence[Example]) -> list[Rendering]:
        prompts = await self._templates(examples)
        texts = [
            p + (e.answer or "") if isinstance(p, str) else "" for p, e in zip(prompts, examples, strict=True)
        ]
        chunks: list[list[str]] = [[]]
        chars = 0
        for text in texts:
            if chunks[-1] and (len(chunks[-1]) >= self.tokenize_batch or chars + len(text) > _TOKENIZE_CHARS):
                chunks.append([])
                chars = 0
            chunks[-1].append(text)
            chars += len(text)
        tokenized = await _gather_limited([self._tokenize_many(c) for c in chunks], self.concurrency)
        ids = [row for chunk in tokenized for row in chunk]
        end = sorted(self.end_ids)[:1]
        out = []
        for example, prompt, text, row in zip(examples, prompts, texts, ids, strict=True):
            if isinstance(prompt, Exception):
                out.append(Rendering(text="", ids=(), error=f"/apply-template refused it: {prompt}"))
                continue
            full = [*self._prefix, *row, *self._suffix, *(end if example.training else ())]
            out.append(Rendering(text=text, ids=tuple(full)))
        return out

    def render(self, examples: Sequence[Example]) -> list[Rendering]:
        return _run(lambda: self._with_session(lambda: self._render_all(examples)))

    async def _detokenize(self, ids: Sequence[int]) -> str:
        answer = await self._post("/detokenize", {"tokens": list(ids)})
        return str(_expect(answer, "content", str, f"{self.url}/detokenize"))

    def piece(self, token_id: int) -> str:
        if token_id not in self._pieces:
            self._pieces[token_id] = self.decode([token_id])
        return self._pieces[token_id]


class OpenAITokenizeSide(_HTTPSide):
    """An OpenAI-compatible server with vLLM's ``/tokenize`` and ``/detokenize``."""

    def __init__(self, url: str, *, model: str, end_ids: frozenset[int] = frozenset(), **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.model = model
        self.name = f"openai-tokenize {self.url}"
        self.bos_id: int | None = None
        self.eos_id: int | None = None
        self.add_bos: bool | None = None
        self.end_ids = end_ids
        self.n_ctx: int | None = None

    async def _one(self, example: Example) -> Rendering:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": example.as_dicts(),
            "add_special_tokens": False,
        }
        if example.training:
            body.update(add_generation_prompt=False, continue_final_message=True)
        else:
            body.update(add_generation_prompt=True)
        try:
            answer = await self._post("/tokenize", body)
        except ProviderError as exc:
            if exc.status is None:
                raise
            return Rendering(text="", ids=(), error=f"/tokenize refused it: {exc}")
        ids = _ids(answer, f"{self.url}/tokenize") + (sorted(self.end_ids)[:1] if example.training else [])
        limit = answer.get("max_model_len")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self.n_ctx = limit
        return Rendering(text="", ids=tuple(ids))

    def render(self, examples: Sequence[Example]) -> list[Rendering]:
        return _run(
            lambda: self._with_session(
                lambda: _gather_limited([self._one(e) for e in examples], self.concurrency)
            )
        )

    async def _detokenize(self, ids: Sequence[int]) -> str:
        answer = await self._post("/detokenize", {"model": self.model, "tokens": list(ids)})
        return str(_expect(answer, "prompt", str, f"{self.url}/detokenize"))

    def piece(self, token_id: int) -> str:
        return self.decode([token_id])
