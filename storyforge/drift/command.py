"""``storyforge drift``: the gate from the command line, and the entry point the jobs share.

Takes: a :class:`~storyforge.config.drift.DriftConf` (export paths, the tokenizer folder,
the serving sides to build). Gives: :func:`build_sides`, :func:`check_exports` (settings ->
report, the JSON report written atomically when asked) and, for the command line,
:func:`add_arguments` and :func:`command` (its arguments -> the same settings). Exit status: 0 no drift (or no more than ``--allow``) and the special
tokens agree, 1 drift, 2 the gate could not run (a missing file or optional package, an
export with no examples, a server that does not answer or answers malformed JSON, a GGUF,
template or answer beyond a bound).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from storyforge.atomic import write_json_atomic
from storyforge.config.drift import DriftConf
from storyforge.drift.deps import TRAINING, require
from storyforge.drift.examples import Example, read_examples
from storyforge.drift.report import DriftReport, run_drift
from storyforge.drift.sides import Side
from storyforge.drift.training import TrainingSide
from storyforge.errors import ConfigError, DataError, StoryforgeError

__all__ = ["add_arguments", "build_sides", "check_exports", "command"]

log = logging.getLogger(__name__)


def build_sides(options: DriftConf, training: TrainingSide) -> list[Side]:
    """The serving sides ``options`` names (at least one, or :class:`ConfigError`)."""
    from storyforge.drift.ollama import OllamaSide
    from storyforge.drift.serving import GGUFSide, LlamaServerSide, OpenAITokenizeSide

    sides: list[Side] = []
    if options.server:
        text = None
        if options.server_prompts == "text":

            def text(example: Example) -> str:
                return training.texts([example.as_dicts(example.prompt)], generation_prompt=True)[0]

        sides.append(LlamaServerSide(options.server, prompt_text=text, render_each=options.server_each))
    if options.gguf:
        sides.append(GGUFSide(options.gguf))
    if options.openai:
        if not options.openai_model:
            raise ConfigError("--openai needs --openai-model NAME (the model the server serves)")
        sides.append(OpenAITokenizeSide(options.openai, model=options.openai_model, end_ids=training.end_ids))
    for modelfile in options.modelfiles:
        sides.append(OllamaSide(modelfile, gguf=options.gguf, client_system=options.client_system))
    if not sides:
        raise ConfigError(
            "name at least one serving side: --server URL, --gguf FILE, --openai URL or --modelfile FILE"
        )
    return sides


def check_exports(
    options: DriftConf, *, limit: int | None = None, report: str | None = None, progress: bool = False
) -> DriftReport:
    """Run the gate on the first ``limit`` examples (all when ``None``); writes ``report``
    (JSON) when set."""
    options.check()
    tokenizer = options.training_tokenizer
    require(*TRAINING)
    data = read_examples(options.exports, limit=limit)
    if not data.examples:
        unread = (
            f" ({len(data.unreadable)} unreadable line(s): {data.unreadable[0]})" if data.unreadable else ""
        )
        raise DataError(f"nothing to check: no examples in {', '.join(options.exports)}{unread}")
    training = TrainingSide(tokenizer)
    sides = build_sides(options, training)
    result = run_drift(data, training, sides, allow=options.allow, progress=progress)
    if report:
        write_json_atomic(Path(report), result.to_dict())
    return result


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "exports",
        nargs="+",
        metavar="EXPORT",
        help="sft.jsonl, train.jsonl, eval.jsonl, or folders holding them",
    )
    parser.add_argument(
        "--tokenizer",
        required=True,
        metavar="DIR",
        help="folder with the model's tokenizer.json and tokenizer_config.json",
    )
    parser.add_argument(
        "--server", metavar="URL", help="a running llama-server (its /apply-template and /tokenize)"
    )
    parser.add_argument(
        "--server-prompts",
        choices=("chat", "text"),
        default="chat",
        help="chat: the server applies its chat template (default); text: the client renders the "
        "training template and sends the text as a completion prompt",
    )
    parser.add_argument(
        "--server-each",
        action="store_true",
        help="send every example to /apply-template (default: once per conversation shape when the "
        "template is shown to copy message text as is)",
    )
    parser.add_argument("--gguf", metavar="FILE", help="a GGUF: its embedded chat template and vocabulary")
    parser.add_argument("--openai", metavar="URL", help="an OpenAI-compatible server with /tokenize (vLLM)")
    parser.add_argument("--openai-model", metavar="NAME", help="the model name to send with --openai")
    parser.add_argument(
        "--modelfile", action="append", default=[], metavar="FILE", help="an Ollama Modelfile (repeatable)"
    )
    parser.add_argument(
        "--ollama-client-system",
        action="store_true",
        help="the client sends the example's system message to Ollama (default: the Modelfile's SYSTEM stands in)",
    )
    parser.add_argument("--allow", type=_count, default=0, metavar="N", help="tolerate N drifting examples")
    parser.add_argument(
        "--limit", type=_count, default=None, metavar="N", help="check the first N examples only"
    )
    parser.add_argument("--json", dest="report", metavar="FILE", help="also write the report as JSON")


def command(args: argparse.Namespace) -> int:
    try:
        options = DriftConf(
            exports=list(args.exports),
            tokenizer=args.tokenizer,
            server=args.server,
            server_prompts=args.server_prompts,
            server_each=args.server_each,
            gguf=args.gguf,
            openai=args.openai,
            openai_model=args.openai_model,
            modelfiles=list(args.modelfile),
            client_system=args.ollama_client_system,
            allow=args.allow,
        )
        report = check_exports(options, limit=args.limit, report=args.report, progress=sys.stderr.isatty())
    except (StoryforgeError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    sys.stdout.write(report.format() + "\n")
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="storyforge drift")
    add_arguments(parser)
    return command(parser.parse_args(argv))
