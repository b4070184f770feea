"""A Jinja2 sandbox with bounds on work and size, for chat templates read from GGUF files.

A chat template is code from a downloaded file. Jinja's ImmutableSandboxedEnvironment
keeps it away from Python's internals, but not from the machine: an empty loop nested in
another, ``'x' * 10**10``, ``'%09999999999d' % 1`` or ``tojson(indent=10**9)`` hangs the
process or fills its memory, and a render running in one process cannot be interrupted
from outside (a stuck loop holds the GIL between bytecodes, not between our checks).
So every step a template takes is counted *inside* the render, where it can be stopped:

- **work**: every call, filter, attribute or item lookup, operator, output and loop
  iteration spends one unit of a per-render budget (:data:`MAX_OPS`), and a wall-clock
  deadline (:data:`DEADLINE_SECONDS`) is checked at each as a backstop;
- **size**: a string, list or number a template makes is checked, *before* it is made
  where one operation can multiply a size (``*``, ``%``, ``str.format`` widths,
  ``replace``, ``join``, ``center``, ``indent``, ``batch``, ``tojson`` indents), after it is
  made where it can at most double; the text written (captured blocks and macros
  included) is bounded by :data:`MAX_OUTPUT_CHARS`;
- **the template itself** is at most :data:`MAX_TEMPLATE_CHARS` (real ones are a few KiB
  to ~50 KiB; a 64 MiB one took minutes to compile).

The counters are inserted into the template's syntax tree before it is compiled (loops'
iterables, ``~`` concatenations and every output expression are wrapped), and reach the
environment's intercepted calls, lookups and operators; one render's state lives in a
ContextVar, so concurrent renders (server threads) each have their own.

Everything a template can raise (its own ``raise_exception`` aside, which refuses the
conversation and stays an :class:`~edgespec.errors.InvalidInputError`) becomes one
:class:`ChatTemplateError` line naming the model and ``--chat-template FILE``.
"""
from __future__ import annotations

import functools
import json
import os
import re
import string
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from ..errors import InvalidInputError, ModelError

MAX_TEMPLATE_CHARS = 256 * 1024
MAX_OPS = 250_000
DEADLINE_SECONDS = 1.0
MAX_OUTPUT_CHARS = 8 << 20  # what one render writes, captured blocks included
MAX_STRING_CHARS = 8 << 20  # one string (or list) a template makes
MAX_WIDTH = 10_000  # format widths and precisions, center/indent widths
MAX_JSON_INDENT = 32
MAX_INT_BITS = 4096


class ChatTemplateError(ModelError):
    """A model's chat template cannot be used: too large, too much work, too much output,
    or it raised; the message names the model and the way out (``--chat-template FILE``)."""


class _Limit(Exception):
    """Internal: a bound was hit; turned into a ChatTemplateError by the caller."""


@dataclass
class _Budget:
    ops: int = MAX_OPS
    emitted: int = 0
    deadline: float = field(default_factory=lambda: time.monotonic() + DEADLINE_SECONDS)


_current: ContextVar[_Budget | None] = ContextVar("edgespec_template_budget", default=None)


def _spend(n: int = 1) -> None:
    b = _current.get()
    if b is None:  # compiled templates are only rendered through render_bounded
        raise _Limit("rendered outside its bounds")
    b.ops -= n
    if b.ops < 0:
        raise _Limit(f"takes more than {MAX_OPS:,} steps (a loop that does not end?)")
    # every step: one step can be a sort of millions of items (~50 ns against microseconds)
    if time.monotonic() > b.deadline:
        raise _Limit(f"runs longer than {DEADLINE_SECONDS:g} s")


def _check_size(value: Any, what: str = "a value") -> Any:
    if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > MAX_STRING_CHARS:
        raise _Limit(f"makes {what} of {len(value):,} items or characters (at most "
                     f"{MAX_STRING_CHARS:,})")
    if isinstance(value, int) and not isinstance(value, bool) \
            and value.bit_length() > MAX_INT_BITS:
        raise _Limit(f"makes a number of {value.bit_length():,} bits")
    return value


def _want(size: int, what: str) -> None:
    """Refuse an operation whose result would have ``size`` items, before it is made."""
    if size > MAX_STRING_CHARS:
        raise _Limit(f"would make {what} of {size:,} characters or items (at most "
                     f"{MAX_STRING_CHARS:,})")


def _width(value: Any, what: str) -> None:
    n = len(value) if isinstance(value, str) else value
    if isinstance(n, int) and not isinstance(n, bool) and n > MAX_WIDTH:
        raise _Limit(f"asks for a {what} of {n:,} (at most {MAX_WIDTH:,})")


# a printf-style conversion: flags, width, precision (``*`` takes them from the arguments)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_NUMBER = re.compile(r"\d+")


def _check_printf(fmt: str) -> None:
    for m in _PRINTF.finditer(fmt):
        for part in m.groups():
            if part == "*":
                raise _Limit("uses a '*' width in a % format")
            if part is not None:
                _width(int(part), "format width")


def _check_format_spec(fmt: str) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _, _, spec, _ in fields:
        if spec and "{" in spec:
            raise _Limit("uses a nested width in a str.format field")
        for num in _NUMBER.findall(spec or ""):
            _width(int(num), "format width")


# --- what str methods can multiply, checked before the call --------------------------------
def _joined_size(sep: str, items: Any) -> int | None:
    if not isinstance(items, (list, tuple)):
        return None
    return len(sep) * max(len(items) - 1, 0) + sum(len(x) for x in items if isinstance(x, str))


def _replaced_size(s: str, old: Any, new: Any, count: Any = -1) -> int:
    if not isinstance(old, str) or not isinstance(new, str):
        return len(s)
    hits = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(len(new) - len(old), 0)


def _check_str_method(name: str, s: str, args: tuple, kwargs: dict) -> None:
    if name in ("center", "ljust", "rjust", "zfill") and args:
        _width(args[0], f"str.{name} width")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(tab, int):
            _want(len(s) * max(tab, 1), "an expanded string")
    elif name == "replace" and len(args) >= 2:
        _want(_replaced_size(s, *args[:3]), "a replaced string")
    elif name == "join" and args:
        size = _joined_size(s, args[0])
        if size is not None:
            _want(size, "a joined string")


# --- filters: every one counted and its result checked; the multiplying ones pre-checked ----
def _filter_precheck(name: str, args: tuple, kwargs: dict) -> None:
    value = args[0] if args else None
    rest = args[1:]
    if name == "center":
        _width(rest[0] if rest else kwargs.get("width", 80), "center width")
    elif name == "indent":
        width = rest[0] if rest else kwargs.get("width", 4)
        _width(width, "indent width")
        if isinstance(value, str):
            w = len(width) if isinstance(width, str) else int(width or 0)
            _want(len(value) + (value.count("\n") + 1) * w, "an indented string")
    elif name == "format" and isinstance(value, str):
        _check_printf(value)
    elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
        _want(_replaced_size(value, *rest[:3]), "a replaced string")
    elif name == "join":
        sep = rest[0] if rest else kwargs.get("d", "")
        if isinstance(sep, str):
            size = _joined_size(sep, list(value) if isinstance(value, (list, tuple)) else None)
            if size is not None:
                _want(size, "a joined string")
    elif name == "wordwrap":
        wrap = rest[3] if len(rest) >= 4 else kwargs.get("wrapstring")
        if isinstance(wrap, str) and isinstance(value, str):
            _want(len(value) * (1 + len(wrap)), "a wrapped string")
    elif name in ("batch", "slice"):
        count = rest[0] if rest else kwargs.get("linecount", kwargs.get("slices"))
        _width(count, f"{name} count")
    elif name == "sum" and isinstance(value, (list, tuple)):
        # summing sequences copies the running total each step: quadratic in what it makes
        total = sum(len(x) for x in value if isinstance(x, (str, list, tuple)))
        _want(total, "a summed sequence")
        if total and len(value) * total > 16 * MAX_STRING_CHARS:
            raise _Limit(f"sums {len(value):,} sequences of {total:,} items in all")
    elif name == "tojson":
        indent = rest[1] if len(rest) >= 2 else kwargs.get("indent")
        if indent is not None:
            n = len(indent) if isinstance(indent, str) else indent
            if isinstance(n, int) and n > MAX_JSON_INDENT:
                raise _Limit(f"asks tojson for an indent of {n:,} (at most {MAX_JSON_INDENT})")


def _bounded_filter(name: str, func: Callable) -> Callable:
    @functools.wraps(func)  # keeps jinja's pass_context/pass_environment marker (__dict__)
    def bounded(*args, **kwargs):
        _spend()
        # jinja hands a marked filter its context/environment first, then the value
        plain = args[1:] if getattr(func, "jinja_pass_arg", None) is not None else args
        _filter_precheck(name, plain, kwargs)
        return _check_size(func(*args, **kwargs), f"the output of filter {name!r}")
    return bounded


# --- the syntax tree, instrumented before it is compiled ------------------------------------
_ITER, _OUT, _CONCAT = "edgespec_bounded_iter", "edgespec_bounded_out", "edgespec_bounded_concat"


class _Instrument(NodeTransformer):
    """Wraps each loop's iterable, each ``~`` and each output expression in a counting call."""

    def _wrap(self, fn: str, node: nodes.Expr) -> nodes.Call:
        call = nodes.Call(nodes.Name(fn, "load"), [node], [], None, None)
        return call.set_lineno(node.lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        node = self.generic_visit(node)
        node.iter = self._wrap(_ITER, node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        return self._wrap(_CONCAT, self.generic_visit(node))

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        node = self.generic_visit(node)
        node.nodes = [self._wrap(_OUT, n) for n in node.nodes]
        return node


def _bounded_iter(iterable: Any):
    for item in iterable:
        _spend()
        yield item


def _bounded_out(value: Any) -> str:
    _spend()
    text = str(value)
    b = _current.get()
    if b is not None:
        b.emitted += len(text)
        if b.emitted > MAX_OUTPUT_CHARS:
            raise _Limit(f"writes more than {MAX_OUTPUT_CHARS:,} characters")
    return text


def _bounded_concat(value: Any) -> Any:
    _spend()
    return _check_size(value, "a string")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment plus the bounds of this module (see its docstring)."""

    intercepted_binops = frozenset(["+", "-", "*", "/", "//", "%", "**"])
    intercepted_unops = frozenset(["-", "+"])

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                         **kwargs)
        self.globals.pop("lipsum", None)  # n paragraphs of text on demand: nothing a prompt needs
        self.globals.update({_ITER: _bounded_iter, _OUT: _bounded_out, _CONCAT: _bounded_concat,
                             "raise_exception": _raise_exception, "strftime_now": _strftime_now})
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def _parse(self, source, name, filename):  # type: ignore[no-untyped-def]
        return _Instrument().visit(super()._parse(source, name, filename))

    def call(__self, __context, __obj, *args, **kwargs):  # type: ignore[no-untyped-def]  # noqa: N805
        _spend()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            _check_str_method(getattr(__obj, "__name__", ""), owner, args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a value")

    def getattr(self, obj, attribute):  # type: ignore[no-untyped-def]
        _spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):  # type: ignore[no-untyped-def]
        _spend()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):  # type: ignore[no-untyped-def]
        _spend()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    _want(len(seq) * max(n, 0), "a repeated string")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if max(abs(left).bit_length(), 1) * right > MAX_INT_BITS and abs(left) > 1:
                raise _Limit(f"raises a number to the power {right:,}")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left)
        return _check_size(super().call_binop(context, operator, left, right), "a value")

    def call_unop(self, context, operator, arg):  # type: ignore[no-untyped-def]
        _spend()
        return super().call_unop(context, operator, arg)

    def wrap_str_format(self, value):  # type: ignore[no-untyped-def]
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapped)
        def checked(*args, **kwargs):
            _spend()
            _check_format_spec(fmt)
            return _check_size(wrapped(*args, **kwargs), "a formatted string")
        return checked


def _raise_exception(message: Any) -> None:
    """What Hugging Face templates call to refuse a conversation (roles out of order): the
    request's fault, so an InvalidInputError (a 400), not a broken template."""
    raise InvalidInputError(
        f"the model's chat template refused the conversation: {_one_line(str(message))}")


def _strftime_now(fmt: str) -> str:
    """Today's date for templates that print it (Llama 3.x), as Hugging Face provides it."""
    _width(len(fmt), "date format")
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """Hugging Face's tojson: plain JSON, not Jinja's HTML-escaped form (templates print
    tool schemas and call arguments with it, and the model was trained on the plain text)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


# --- compile once, render bounded ----------------------------------------------------------
def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def template_error(model: str | None, what: str) -> ChatTemplateError:
    who = f"{model}: its chat template" if model else "the model's chat template"
    return ChatTemplateError(f"{who} {_one_line(what)}; pass --chat-template FILE with a "
                             "template you trust (or --raw to send plain text)")


_ENV: BoundedEnvironment | None = None


def environment() -> BoundedEnvironment:
    """The one bounded environment (its filters and globals are fixed when it is made)."""
    global _ENV
    if _ENV is None:
        _ENV = BoundedEnvironment()
    return _ENV


@functools.lru_cache(maxsize=16)
def _compiled(source: str):  # type: ignore[no-untyped-def]
    # the same few templates render on every request: compile each once
    token = _current.set(_Budget())  # compile-time constant folding calls filters too
    try:
        return environment().from_string(source)
    finally:
        _current.reset(token)


def compile_template(source: str, model: str | None = None):  # type: ignore[no-untyped-def]
    """The compiled template; ChatTemplateError when it is too large or does not parse."""
    if not isinstance(source, str):
        raise template_error(model, f"is not text ({type(source).__name__})")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise template_error(model, f"is {len(source):,} characters long (at most "
                                    f"{MAX_TEMPLATE_CHARS:,})")
    try:
        return _compiled(source)
    except _Limit as e:
        raise template_error(model, str(e)) from None
    except RecursionError:
        raise template_error(model, "is nested too deeply to compile") from None
    except Exception as e:  # noqa: BLE001 - whatever hostile source makes the parser raise
        raise template_error(model, f"does not compile ({type(e).__name__}: {e})") from None


def render_bounded(source: str, variables: dict[str, Any], model: str | None = None) -> str:
    """Render ``source`` with ``variables`` within this module's bounds. The template's own
    raise_exception is an InvalidInputError; every other failure a ChatTemplateError."""
    tmpl = compile_template(source, model)
    token = _current.set(_Budget())
    try:
        out: list[str] = []
        size = 0
        for chunk in tmpl.generate(**variables):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise _Limit(f"writes more than {MAX_OUTPUT_CHARS:,} characters")
            out.append(chunk)
        return "".join(out)
    except InvalidInputError:
        raise
    except _Limit as e:
        raise template_error(model, str(e)) from None
    except RecursionError:
        raise template_error(model, "recurses without end (RecursionError)") from None
    except MemoryError:
        raise template_error(model, "ran out of memory") from None
    except Exception as e:  # noqa: BLE001 - a template is code from a file: anything it raises
        raise template_error(model, f"failed to render ({type(e).__name__}: {e})") from None
    finally:
        _current.reset(token)


def read_template_file(path: str | os.PathLike) -> str:
    """The text of a --chat-template FILE, checked like a GGUF's template (size, UTF-8, it
    compiles) so that a bad file is refused before any model loads."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > 4 * MAX_TEMPLATE_CHARS:  # UTF-8: at most 4 bytes a character
            raise InvalidInputError(f"{p}: {size:,} bytes, too large for a chat template "
                                    f"(at most {MAX_TEMPLATE_CHARS:,} characters)")
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"{p}: not UTF-8 text (byte {e.start}); save the chat "
                                "template as UTF-8") from None
    except OSError as e:
        raise InvalidInputError(f"{p}: cannot read it ({e.strerror or e})") from None
    if not text.strip():
        raise InvalidInputError(f"{p}: the file is empty; give a Jinja chat template")
    try:
        compile_template(text, model=None)
    except ChatTemplateError as e:
        msg = str(e).split(";")[0].replace("the model's chat template", "the template")
        raise InvalidInputError(f"{p}: {msg}") from None
    return text
