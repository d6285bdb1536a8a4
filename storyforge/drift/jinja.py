"""Chat templates rendered as ``transformers`` renders them, within bounds.

Takes: a Jinja chat template, the messages and the values ``transformers`` passes (the
special tokens, ``add_generation_prompt``). Gives: :func:`render_chat` -> the text, or
:class:`TemplateLimitError` (a :class:`~storyforge.errors.DataError`: the gate could not
run, exit 2) when the template exceeds :data:`BOUNDS`; any other template error is the
``jinja2`` exception, as ``transformers`` raises it.

The environment is the one ``transformers`` builds for ``apply_chat_template`` (sandboxed,
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the ``generation`` tag, its ``tojson``,
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``), so the text is the same.

Why bounds: a chat template is code from the model's publisher; in a GGUF or a tokenizer
folder it runs on every example. Unbounded, ``{% for i in range(100000) %}{% for j in
range(100000) %}`` runs for hours and a string doubled in a loop takes all memory. Here:

- every loop iteration, call (macros included, so recursion too) and intercepted operation is
  a step (each ``for`` loop's sequence is wrapped in a counting iterator when the template is
  parsed), and a render stops after :data:`BOUNDS` ``steps`` or ``seconds``;
- every string the template builds is checked against the output cap before it is built
  (``+ * % **`` on strings and lists, ``~``, the filters and string methods that take a width
  or a count) and after (every filter and call result), so one step grows memory by at most
  a few times the cap;
- the output itself is counted as it is produced.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from storyforge.errors import DataError

__all__ = ["BOUNDS", "TemplateLimitError", "render_chat"]

#: Per render: characters of output (and of any string built on the way), steps (loop
#: iterations, calls, operations on strings) and seconds. A ChatML render of a 4,000-token
#: conversation: 16,000 characters, a few dozen steps, well under a millisecond.
BOUNDS = {"chars": 1 << 20, "steps": 200_000, "seconds": 10.0}
_ITER = "storyforge_bounded_iter"  # every for loop's sequence passes through this global


class TemplateLimitError(DataError):
    """A chat template exceeded a bound; names which one."""


class _Budget:
    def __init__(self, what: str) -> None:
        self.what = what
        self.steps = 0
        self.deadline = time.monotonic() + BOUNDS["seconds"]

    def fail(self, message: str) -> TemplateLimitError:
        return TemplateLimitError(f"{self.what}: {message}; the render was stopped")

    def size(self, value: Any) -> Any:
        if isinstance(value, str | bytes | list | tuple | dict) and len(value) > BOUNDS["chars"]:
            raise self.fail(f"a value of {len(value)} items exceeds the {BOUNDS['chars']}-character cap")
        return value

    def planned(self, size: int) -> None:
        if size > BOUNDS["chars"]:
            raise self.fail(f"it would build a value of {size} items (cap {BOUNDS['chars']})")

    def step(self) -> None:
        self.steps += 1
        if self.steps > BOUNDS["steps"]:
            raise self.fail(f"more than {BOUNDS['steps']} template steps")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise self.fail(f"more than {BOUNDS['seconds']:g} seconds")


class _Renders(threading.local):
    """The budgets of the renders running on this thread (innermost last)."""

    def __init__(self) -> None:
        self.budgets: list[_Budget] = []


_renders = _Renders()


def _budget() -> _Budget:
    if not _renders.budgets:
        raise TemplateLimitError("a chat template ran outside a bounded render")
    return _renders.budgets[-1]


def _length(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _precheck_ints(args: Iterable[Any]) -> None:
    for arg in args:
        if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > BOUNDS["chars"]:
            _budget().planned(abs(arg))


def _precheck_replace(text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        count = text.count(old) if old else len(text) + 1
        _budget().planned(len(text) + count * max(0, len(new) - len(old)))


def _precheck_widths(text: Any) -> None:
    """A format string's widths and precisions (``%99999999s``, ``{:>99999999}``)."""
    if isinstance(text, str):
        for digits in re.findall(r"\d+", text):
            if len(digits) > 7 or int(digits) > BOUNDS["chars"]:
                _budget().planned(int(digits[:40]))


def _precheck_join(items: Any, separator: Any) -> Any:
    values = (
        list(items) if isinstance(items, Iterable) and not isinstance(items, str | bytes | dict) else items
    )
    if isinstance(values, list):
        glue = len(separator) if isinstance(separator, str) else 0
        _budget().planned(sum(len(v) if isinstance(v, str) else 1 for v in values) + glue * len(values))
    return values


def _checked(function: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose int arguments and result are checked against the cap."""

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        _budget().step()
        _precheck_ints([*args, *kwargs.values()])
        first = 1 if args and hasattr(args[0], "environment") else 0  # a context argument first
        plain = list(args[first:])
        if function.__name__ == "do_replace" and len(plain) >= 3:
            _precheck_replace(*plain[:3])
        elif function.__name__ == "do_format" and plain:
            _precheck_widths(plain[0])
        elif function.__name__ == "do_join" and plain:
            plain[0] = _precheck_join(plain[0], plain[1] if len(plain) > 1 else kwargs.get("d", ""))
            args = (*args[:first], *plain)
        return _budget().size(function(*args, **kwargs))

    return run


def _counted(items: Any) -> Iterator[Any]:
    """``items``, one step per item (the for loops of a template iterate through this)."""
    budget = _budget()
    for item in items:
        budget.step()
        yield item


def _join(parts: Iterable[Any], joiner: Callable[[Iterable[Any]], Any]) -> Any:
    items = list(parts)
    _budget().planned(sum(_length(str(p)) if not isinstance(p, str) else len(p) for p in items))
    return joiner(items)


@functools.cache
def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "%", "**"})

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(jinja2.nodes.For):
                loop.iter = jinja2.nodes.Call(jinja2.nodes.Name(_ITER, "load"), [loop.iter], [], None, None)
            return tree

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _budget()
            budget.step()
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if _length(seq) and isinstance(count, int):
                        budget.planned(_length(seq) * max(0, count))
                if isinstance(left, int) and isinstance(right, int):
                    budget.planned((abs(left).bit_length() + abs(right).bit_length()) // 3)
            elif operator == "+":
                budget.planned(_length(left) + _length(right))
            elif operator == "**" and isinstance(left, int) and isinstance(right, int):
                budget.planned(abs(left).bit_length() * max(0, right) // 3)  # about the digits
            elif operator == "%" and isinstance(left, str):
                values = right if isinstance(right, tuple) else (right,)
                _precheck_ints(values)
                _precheck_widths(left)
                budget.planned(len(left) + sum(_length(v) for v in values))
            return budget.size(super().call_binop(context, operator, left, right))

        def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
            _budget().step()
            _precheck_ints([*args, *kwargs.values()])
            name = getattr(obj, "__name__", "")
            if name == "replace" and isinstance(getattr(obj, "__self__", None), str):
                _precheck_replace(obj.__self__, *args[:2])
            if name == "join" and args and isinstance(getattr(obj, "__self__", None), str):
                args = (_precheck_join(args[0], obj.__self__), *args[1:])
            if name in ("format", "format_map"):  # the sandbox wraps str.format; __wrapped__ is the method
                _precheck_widths(getattr(getattr(obj, "__wrapped__", obj), "__self__", None))
            return _budget().size(super().call(context, obj, *args, **kwargs))

    class Generation(jinja2.ext.Extension):
        """``{% generation %}…{% endgeneration %}``: the body as is (transformers marks it)."""

        tags = {"generation"}  # noqa: RUF012 (jinja's API)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)  # as transformers gives it

    class Dict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature trick
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace.check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check(name)
            _budget().size(value)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}"
                )

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _checked(f) for name, f in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    env.globals[_ITER] = _counted
    return env


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> Any:
    compiled = _environment().from_string(template)
    scope = compiled.root_render_func.__globals__
    for name in ("str_join", "markup_join"):
        scope[name] = functools.partial(_join, joiner=scope[name])
    return compiled


def render_chat(
    template: str,
    messages: list[dict[str, str]],
    *,
    generation_prompt: bool,
    what: str = "the chat template",
    **values: Any,
) -> str:
    """``template`` rendered for ``messages`` as ``apply_chat_template`` renders it, within
    :data:`BOUNDS` (:class:`TemplateLimitError` names the bound and ``what``)."""
    compiled = _compile(template)
    budget = _Budget(what)
    _renders.budgets.append(budget)
    try:
        out: list[str] = []
        size = 0
        stream = compiled.generate(
            messages=messages, tools=None, documents=None, add_generation_prompt=generation_prompt, **values
        )
        for chunk in stream:
            size += len(chunk)
            if size > BOUNDS["chars"]:
                raise budget.fail(f"the output exceeds {BOUNDS['chars']} characters")
            out.append(chunk)
        return "".join(out)
    except RecursionError:
        raise budget.fail("it recursed too deeply") from None
    except MemoryError:
        raise budget.fail("it ran out of memory") from None
    finally:
        _renders.budgets.pop()
