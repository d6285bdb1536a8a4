"""The Ollama side: a Modelfile's TEMPLATE, SYSTEM, stops and ``num_ctx``, served as Ollama does.

Takes: a Modelfile (parsed by :mod:`storyforge.tasks.research_qa.modelfile`) and the GGUF its
``FROM`` names (or ``--gguf``). Gives: :class:`OllamaSide`, which renders each example the
way Ollama's chat endpoint builds the prompt (``template/template.go``):

- the client's turns are sent without a system message, as ``ollama run`` and clients that
  rely on the Modelfile send them, so the Modelfile's ``SYSTEM`` stands in (``client_system``
  keeps the example's own system message instead, which Ollama then uses);
- consecutive turns of one role are merged with a blank line (``collate``);
- a template that uses ``.Messages`` gets them all at once; an older ``.System`` /
  ``.Prompt`` / ``.Response`` template is executed once per exchange and the last execution
  is cut after ``.Response``;
- with no TEMPLATE, Ollama uses the template it matched to the GGUF's chat template; the
  ChatML family is known here (anything else must be named with TEMPLATE);
- ids come from the GGUF's vocabulary (BOS as the GGUF says); generation stops on the
  Modelfile's ``stop`` strings that are one token, or the GGUF's EOS.

Why: Ollama never runs the Jinja template the model was trained with, so its prompt can
differ from training even when the Modelfile's SYSTEM is right.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storyforge.drift.examples import Example, Message
from storyforge.drift.gotemplate import GoTemplateLimit, Template, parse
from storyforge.drift.sides import Rendering
from storyforge.drift.vocab import GGUFVocabulary, read_gguf
from storyforge.errors import DataError
from storyforge.tasks.research_qa.modelfile import Modelfile, read_modelfile

__all__ = ["OLLAMA_CHATML", "OLLAMA_DEFAULT_NUM_CTX", "OllamaSide"]

#: Ollama's ``chatml`` template, the one it picks for a GGUF with a ChatML chat template.
OLLAMA_CHATML = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
    "{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
#: The context Ollama gives a model whose Modelfile sets no ``num_ctx``.
OLLAMA_DEFAULT_NUM_CTX = 4096


def _collate(messages: Sequence[Message]) -> tuple[str, list[dict[str, str]]]:
    systems: list[str] = []
    out: list[dict[str, str]] = []
    for message in messages:
        if message.role == "system":
            systems.append(message.content)
        if out and out[-1]["Role"] == message.role:
            out[-1]["Content"] += "\n\n" + message.content
        else:
            out.append({"Role": message.role, "Content": message.content})
    return "\n\n".join(systems), out


class OllamaSide(GGUFVocabulary):
    """Serving through an Ollama Modelfile (see the module)."""

    def __init__(
        self, modelfile: str | Path, *, gguf: str | None = None, client_system: bool = False
    ) -> None:
        self.modelfile: Modelfile = read_modelfile(modelfile)
        self.name = f"ollama {modelfile}"
        self.client_system = client_system
        super().__init__(read_gguf(gguf or self._from_path(Path(modelfile))))
        template = next((c.value for c in reversed(self.modelfile.commands) if c.name == "template"), None)
        if template is None:
            source = self.info.chat_template or ""
            if "<|im_start|>" not in source:
                raise DataError(
                    f"{modelfile}: no TEMPLATE, and the GGUF's chat template is not one Ollama is known "
                    "to map here (ChatML); state the template with TEMPLATE"
                )
            template = OLLAMA_CHATML
        self.template: Template = parse(template)
        self.legacy = "Messages" not in self.template.fields()
        self._last = self.template.cut_after("Response")
        params = self.modelfile.parameters()
        try:
            self.n_ctx: int | None = (
                int(params["num_ctx"][-1]) if "num_ctx" in params else OLLAMA_DEFAULT_NUM_CTX
            )
        except ValueError:
            raise DataError(f"{modelfile}: PARAMETER num_ctx is not a whole number") from None
        stops = {self._single_id(s) for s in params.get("stop", [])}
        if self.info.eos_id is not None:
            stops.add(self.info.eos_id)
        self.end_ids = frozenset(i for i in stops if i is not None)
        self._stop = self._single_id(params["stop"][0]) if params.get("stop") else self.info.eos_id

    def _from_path(self, modelfile: Path) -> str:
        target = Path(self.modelfile.model)
        if not target.is_absolute():
            target = modelfile.parent / target
        if not target.is_file():
            raise DataError(
                f"{modelfile}: FROM {self.modelfile.model} is not a GGUF file here; pass its GGUF with --gguf"
            )
        return str(target)

    def _single_id(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return int(ids[0]) if len(ids) == 1 else None

    def text(self, example: Example) -> str:
        turns = list(example.prompt)
        if not self.client_system:
            turns = [m for m in turns if m.role != "system"]
        if self.modelfile.system and (not turns or turns[0].role != "system"):
            turns.insert(0, Message(role="system", content=self.modelfile.system))
        if not self.legacy:
            system, messages = _collate(turns)
            data: dict[str, Any] = {"System": system, "Messages": messages, "Tools": None, "Response": ""}
            return self.template.execute(data) + (example.answer or "")
        if example.training:
            turns.append(example.messages[-1])
        system, messages = _collate(turns)
        parts: list[str] = []
        values = {"System": "", "Prompt": "", "Response": ""}

        def flush() -> None:
            parts.append(self.template.execute(values))
            values.update(System="", Prompt="", Response="")

        for message in messages:
            role, content = message["Role"], message["Content"]
            if role == "system":
                if values["Prompt"] or values["Response"]:
                    flush()
                values["System"] = content
            elif role == "user":
                if values["Response"]:
                    flush()
                values["Prompt"] = content
            elif role == "assistant":
                values["Response"] = content
        parts.append(self._last.execute(values))
        return "".join(parts)

    def render(self, examples: Sequence[Example]) -> list[Rendering]:
        out = []
        for example in examples:
            try:
                text = self.text(example)
            except GoTemplateLimit as exc:
                raise DataError(f"{self.name}: {exc}") from None
            except DataError as exc:
                out.append(Rendering(text="", ids=(), error=str(exc)))
                continue
            ids = list(self.tokenizer.encode(text, add_special_tokens=False).ids)
            if self.info.add_bos and self.info.bos_id is not None:
                ids.insert(0, self.info.bos_id)
            if example.training and self._stop is not None:
                ids.append(self._stop)
            out.append(Rendering(text=text, ids=tuple(ids)))
        return out
