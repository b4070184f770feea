"""Bounds on a grammar or JSON schema, measured before llama.cpp or its converter sees it.

llama.cpp's grammar code trusts its input. Three of its parts scale with the grammar and run
in C, where running out of stack is a SIGSEGV (the whole process dies, every other stream
with it) and no Python timeout applies:

* the GBNF parser is recursive descent: each level of parentheses is one
  ``parse_alternates`` + ``parse_sequence`` pair of C frames (llama-cpp-python's schema
  converter writes ``maxLength: n`` as n nested groups ``(c (c (c ...)?)?)?``, which is how
  ``maxLength: 20000`` killed the server);
* ``llama_grammar_detect_left_recursion`` recurses along each rule's leftmost references,
  once per rule and without memo, so a chain of ``a ::= b | b`` rules costs 2^n calls;
* repetitions are expanded when parsed (``S{m,n}`` is m copies of S and n - m new rules),
  and every grammar sampler (one per request, one per draft verified) holds the expansion.

So a text is measured here first, in Python, iteratively (no recursion of our own) and in
time linear in its length, by a model of llama.cpp's parser (src/llama-grammar.cpp,
``llama_grammar_parser``): the nesting depth, the rules and grammar elements its expansion
makes, the deepest and the total work of the left-recursion check. A schema is measured
before it is converted, since the converter itself expands repetitions into text
(``minLength: 10**7`` was 95 MB of grammar). Over a limit is :class:`GrammarTooComplexError`
naming the limit; a text this model cannot follow is left to llama.cpp's parser, which
refuses it (a syntax error ends its parse, and the metrics measured up to there bound what
it did).

How the limits were set: the C stack cost per nesting level was measured with llama.cpp
parsing grammars in threads of a known stack size: ~450 bytes a level of parentheses, ~130
a rule of a leftmost chain (a 1 MiB stack crashed at 2,343 levels, 256 KiB at 586).
tests/unit/grammar/test_grammar_bounds.py keeps the measurement honest: the deepest grammar
allowed parses in a thread with :data:`STACK_FLOOR` bytes of stack. That floor is well under
the smallest stack a Python thread gets where we run (glibc: `ulimit -s`, 8 MiB by default;
macOS: Python sets 16 MiB; musl builds of Python set 1 MiB), so the bound does not depend on
this machine's stack size by luck.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidInputError

#: the C stack the deepest allowed grammar needs at most (measured; see the module docstring)
STACK_FLOOR = 512 * 1024


@dataclass(frozen=True)
class GrammarLimits:
    """What one grammar (GBNF text, or the text converted from a schema) may cost.

    The defaults admit every realistic schema (OpenAI's structured outputs allow 10 levels
    of nesting and 500 properties) with room to spare."""

    max_bytes: int = 256 * 1024
    """the GBNF text, UTF-8 bytes"""
    max_depth: int = 1024
    """nesting of parentheses, and the longest chain of leftmost rule references: C stack
    frames of llama.cpp's parser and left-recursion check (~450 bytes each, measured)"""
    max_rules: int = 20_000
    """rules after expansion (named, groups, and n - m per repetition {m,n})"""
    max_elements: int = 250_000
    """llama.cpp grammar elements after expansion (8 bytes each; each grammar sampler and
    each clone of one holds a copy: 2 MB)"""
    max_repeat: int = 2000
    """a repetition's count: llama.cpp refuses a minimum above its MAX_REPETITION_THRESHOLD
    (2000) and silently drops a maximum above it (S{0,5000} becomes S*), so both are
    refused here"""
    max_left_calls: int = 2_000_000
    """calls of llama.cpp's left-recursion check over all rules (~150 ns each: 0.3 s)"""
    max_stacks: int = 4096
    """parse stacks one rule expands into: llama.cpp compares each new one with all kept,
    so the cost is their square (measured: 4,096 stacks took 0.07 s, 65,536 took 13 s)"""
    # the JSON schema, before its conversion
    max_schema_bytes: int = 256 * 1024
    """the schema's JSON text, UTF-8 bytes"""
    max_schema_depth: int = 64
    """nesting of the schema's objects and arrays (the converter and jsonschema recurse in
    Python, several frames per level)"""
    max_schema_repeat: int = 1000
    """minLength / maxLength / minItems / maxItems, and a pattern's {m,n}: the converter
    writes each as up to that many copies or nested groups"""
    max_schema_expansion: int = 20_000
    """the sum of those counts over the whole schema (each adds about one rule reference of
    text per unit)"""
    max_name_chars: int = 256
    """a property name (the converter builds rule names of the property path)"""


LIMITS = GrammarLimits()


class GrammarTooComplexError(InvalidInputError):
    """A grammar or schema over one of :class:`GrammarLimits` (the server answers 400
    ``grammar_too_complex``). ``limit`` names the field of GrammarLimits, ``param`` the
    request field (grammar, json_schema or json_mode)."""

    code = "grammar_too_complex"

    def __init__(self, message: str, limit: str, param: str = "grammar") -> None:
        super().__init__(message)
        self.limit = limit
        self.param = param


@dataclass(frozen=True)
class GrammarSize:
    """What llama.cpp's parser would build from a text (upper bounds where it refuses)."""

    bytes: int
    depth: int  # nesting of parentheses
    rules: int
    elements: int
    chain: int  # the longest chain of leftmost references (left-recursion check's depth)
    left_calls: int  # calls of the left-recursion check over all rules (capped)
    stacks: int  # the most parse stacks one rule expands into (capped)


def _too_complex(what: str, value: int, limit: str, limits: GrammarLimits, param: str,
                 hint: str) -> GrammarTooComplexError:
    """``what`` has a ``{}`` where the measured value goes."""
    subject = "grammar" if param == "grammar" else "grammar built from the JSON schema"
    return GrammarTooComplexError(
        f"the {subject} is too complex: {what.format(f'{value:,}')} (the limit is "
        f"{getattr(limits, limit):,}, {limit}). {hint}", limit, param)


# --- GBNF ----------------------------------------------------------------------------------
# one token of llama.cpp's GBNF; anything else ends the model (llama.cpp's parser refuses it)
_TOKEN = re.compile(r"""
    (?P<ws>[ \t]+|\#[^\r\n]*)
  | (?P<nl>\r\n|\r|\n)
  | (?P<lit>"(?:\\.|[^"\\])*")
  | (?P<cls>\[(?:\\.|[^\]\\])*\])
  | (?P<tok>!?<(?:\[[0-9]+\]|[^>]*)>)
  | (?P<defn>::=)
  | (?P<name>[A-Za-z0-9_-]+)
  | (?P<rep>\{\s*(?P<lo>[0-9]+)\s*(?:(?P<comma>,)\s*(?P<hi>[0-9]*)\s*)?\})
  | (?P<op>[()|.*+?])
""", re.VERBOSE | re.DOTALL)
_ESCAPE = re.compile(r"\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)", re.DOTALL)
_MAX_NUMBER_DIGITS = 12  # a count with more digits is over every limit anyway


def _chars(body: str) -> int:
    """Code points of a literal's or class's body (an escape is one)."""
    return len(_ESCAPE.sub("e", body))


class _Rules:
    """The rules llama.cpp's parser would build: per rule its alternatives, each a list of
    symbols (a rule id, or -1 for a terminal), plus the element count."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.alts: list[list[list[int]]] = []
        self.elements = 0

    def named(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = self.new()
        return self.ids[name]

    def new(self) -> int:
        self.alts.append([])
        return len(self.alts) - 1


class _Seq:
    """A sequence being parsed: its symbols and the last symbol's (symbols, elements), which
    a repetition applies to."""

    def __init__(self, rule: int) -> None:
        self.rule = rule
        self.syms: list[int] = []
        self.last: tuple[list[int], int] | None = None

    def add(self, syms: list[int], elements: int) -> None:
        self.syms.extend(syms)
        self.last = (syms, elements)


def measure_gbnf(text: str, limits: GrammarLimits = LIMITS, param: str = "grammar") -> GrammarSize:
    """What llama.cpp's parser would build from ``text``; raises GrammarTooComplexError as
    soon as a limit is passed (so the measuring itself stays bounded)."""
    def over(what: str, value: int, limit: str, hint: str) -> GrammarTooComplexError:
        return _too_complex(what, value, limit, limits, param, hint)

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise over("its text is {} bytes", size, "max_bytes", "Shorten it.")
    r = _Rules()
    stack: list[_Seq] = []  # the sequences of the open groups; stack[0] is a rule's body
    max_depth = 0
    expect_def = False  # a rule's name was read, `::=` must follow
    pending_name = ""
    continues = True  # a newline here does not end the rule (after ::= or |)

    def close_alt(seq: _Seq) -> None:
        r.alts[seq.rule].append(seq.syms)
        r.elements += 1  # the ALT or END element

    def repeat(seq: _Seq, lo: int, hi: int | None) -> None:
        if seq.last is None:
            return  # llama.cpp refuses it ("expecting preceding item")
        if lo > limits.max_repeat or (hi is not None and hi > limits.max_repeat):
            raise over("a repetition count is {}", max(lo, hi or 0), "max_repeat",
                       "llama.cpp cannot enforce a longer bound; write a shorter repetition.")
        syms, n = seq.last
        del seq.syms[len(seq.syms) - len(syms):]
        r.elements -= n
        seq.syms.extend(syms * min(lo, 1))
        r.elements += n * lo  # lo copies of the symbol stay in the rule
        n_opt = 1 if hi is None else hi - lo
        nxt = -1
        for i in range(n_opt):  # S'(k) ::= S S'(k-1) |   (S' ::= S S' | when unbounded)
            rid = r.new()
            alt = list(syms)
            if hi is None:
                alt.append(rid)
            elif i > 0:
                alt.append(nxt)
            r.alts[rid] = [alt, []]
            r.elements += n + (1 if (hi is None or i > 0) else 0) + 2
            nxt = rid
            if len(r.alts) > limits.max_rules:
                raise over("its repetitions expand into {} rules", len(r.alts), "max_rules",
                           "Use fewer or shorter repetitions.")
        if n_opt > 0:
            seq.syms.append(nxt)
            r.elements += 1
        seq.last = None if n_opt == 0 and lo == 0 else seq.last
        if r.elements > limits.max_elements:
            raise over("its repetitions expand into {} grammar elements", r.elements,
                       "max_elements", "Use fewer or shorter repetitions.")

    at = 0
    while True:
        m = _TOKEN.match(text, at)
        if m is None:  # the end, or text llama.cpp's parser refuses here
            break
        at = m.end()
        kind = m.lastgroup
        if kind == "ws" or (kind == "nl" and (continues or len(stack) > 1)):
            continue
        if expect_def:
            if kind != "defn":
                break  # llama.cpp: "expecting ::="
            stack = [_Seq(r.named(pending_name))]
            expect_def, continues = False, True
            continue
        if not stack:  # between rules: a rule's name
            if kind != "name":
                if kind == "nl":
                    continue
                break
            pending_name, expect_def = m.group(), True
            continue
        seq = stack[-1]
        continues = False
        if kind == "nl":  # the end of a rule
            close_alt(seq)
            stack = []
        elif kind == "lit":
            n = _chars(m.group()[1:-1])
            r.elements += n
            seq.add([-1] * min(n, 1), n)
        elif kind == "cls":
            n = max(1, _chars(m.group()[1:-1].lstrip("^")))
            r.elements += n
            seq.add([-1], n)
        elif kind in ("tok", "name"):
            r.elements += 1
            seq.add([-1] if kind == "tok" else [r.named(m.group())], 1)
        elif kind == "rep":
            lo_s, hi_s = m.group("lo"), m.group("hi")
            if len(lo_s) > _MAX_NUMBER_DIGITS or len(hi_s or "") > _MAX_NUMBER_DIGITS:
                raise over("a repetition count is over {}", 10 ** _MAX_NUMBER_DIGITS,
                           "max_repeat", "Write a shorter repetition.")
            lo = int(lo_s)
            hi = lo if not m.group("comma") else (int(hi_s) if hi_s else None)
            repeat(seq, lo, hi)
        elif kind == "defn":
            break
        else:  # operators
            op = m.group()
            if op == "(":
                stack.append(_Seq(r.new()))
                continues = True
                max_depth = max(max_depth, len(stack) - 1)
                if max_depth > limits.max_depth:
                    raise over("its parentheses nest {} levels deep", max_depth, "max_depth",
                               "Flatten it into named rules.")
            elif op == ")":
                if len(stack) < 2:
                    break
                close_alt(seq)
                stack.pop()
                r.elements += 1
                stack[-1].add([seq.rule], 1)
            elif op == "|":
                close_alt(seq)
                stack[-1] = _Seq(seq.rule)
                continues = True
            elif op == ".":
                r.elements += 1
                seq.add([-1], 1)
            else:
                repeat(seq, {"*": 0, "+": 1, "?": 0}[op], 1 if op == "?" else None)
        if len(r.alts) > limits.max_rules:
            raise over("it makes {} rules", len(r.alts), "max_rules", "Use fewer rules.")
        if r.elements > limits.max_elements:
            raise over("it makes {} grammar elements", r.elements, "max_elements",
                       "Shorten it.")
    if stack:
        close_alt(stack[0] if len(stack) == 1 else stack[-1])
    chain, calls, stacks = _left_recursion_cost(
        r, max(limits.max_left_calls, limits.max_stacks) + 1)
    if chain > limits.max_depth:
        raise over("a chain of rules each starting with the next is {} rules long", chain,
                   "max_depth", "Restructure it so that fewer rules start with another.")
    if calls > limits.max_left_calls:
        raise over("llama.cpp's left-recursion check would make {} calls", calls,
                   "max_left_calls", "Factor the common start out of alternatives that "
                   "begin with the same rule.")
    if stacks > limits.max_stacks:
        raise over("one rule opens {} parse stacks at once", stacks, "max_stacks",
                   "Factor the common start out of alternatives that begin with the same "
                   "rule")
    return GrammarSize(size, max_depth, len(r.alts), r.elements, chain, calls, stacks)


def _left_recursion_cost(r: _Rules, cap: int) -> tuple[int, int, int]:
    """(deepest recursion, total calls, most stacks) of llama.cpp's work on the rules'
    leftmost references, computed with memo, iteratively, each capped at ``cap``.

    Its left-recursion check runs from every rule in turn, recursing into each
    alternative's leftmost reference (and the next while the previous rule has an empty
    alternative), without memo: calls(x) = 1 + the sum of calls(child) over those children
    (a reference back to a rule in progress is one call: llama.cpp stops there).

    Its ``llama_grammar_advance_stack`` expands a rule into one stack per distinct path to
    a terminal, and compares each new stack with every kept one (quadratic): stacks(x) is
    the sum over x's alternatives (one for a terminal or an empty one, stacks(child) for a
    leading reference, plus what follows an emptiable one); alternatives that end in the
    same reference give the same stacks and count once.
    """
    nullable = [any(not alt for alt in alts) for alts in r.alts]

    def children(x: int) -> list[int]:
        out = []
        for alt in r.alts[x]:
            for s in alt:
                if s < 0:
                    break
                out.append(s)
                if not nullable[s]:
                    break
        return out

    def stacks_of(x: int) -> int:
        total, tails = 0, set()
        for alt in r.alts[x]:
            for i, s in enumerate(alt):
                if s < 0:
                    total += 1
                    break
                if i == len(alt) - 1:
                    tails.add(s)
                else:
                    total += stacks[s] if done[s] else 1
                if not nullable[s]:
                    break
            else:
                if not alt:
                    total += 1
        return min(cap, total + sum(stacks[t] if done[t] else 1 for t in tails))

    n = len(r.alts)
    calls, depth, stacks = [1] * n, [1] * n, [1] * n
    done, in_progress = [False] * n, [False] * n
    for start in range(n):
        if done[start]:
            continue
        todo: list[tuple[int, list[int], int]] = [(start, children(start), 0)]
        in_progress[start] = True
        while todo:
            x, kids, i = todo[-1]
            if i < len(kids):
                todo[-1] = (x, kids, i + 1)
                k = kids[i]
                if not done[k] and not in_progress[k]:
                    in_progress[k] = True
                    todo.append((k, children(k), 0))
                continue
            calls[x] = min(cap, 1 + sum(calls[k] if done[k] else 1 for k in kids))
            depth[x] = 1 + max((depth[k] if done[k] else 1 for k in kids), default=0)
            stacks[x] = stacks_of(x)
            done[x], in_progress[x] = True, False
            todo.pop()
    return max(depth, default=0), min(cap, sum(calls)), max(stacks, default=0)


# --- JSON schema ---------------------------------------------------------------------------
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER = re.compile(r"\{\s*([0-9]+)\s*(?:,\s*([0-9]*)\s*)?\}")


def check_schema_text(text: str, limits: GrammarLimits = LIMITS) -> None:
    """The schema's text within its size (before it is parsed)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_schema_bytes:
        raise _schema_over("its text is {} bytes", size, "max_schema_bytes", limits,
                           "Shorten it.")


def check_schema(schema: object, limits: GrammarLimits = LIMITS) -> None:
    """Bound what the converter would write for ``schema`` (a parsed JSON schema): its
    nesting, repetition counts (lengths, item counts, a pattern's quantifiers), their sum,
    and its property names. Iterative: a deep schema never recurses here."""
    expansion = 0
    todo: list[tuple[object, int, str]] = [(schema, 0, "")]
    while todo:
        node, depth, where = todo.pop()
        if depth > limits.max_schema_depth:
            raise _schema_over("it nests {} levels deep at " + (where or "/"), depth,
                               "max_schema_depth", limits, "Flatten it (use $defs).")
        if isinstance(node, list):
            todo.extend((v, depth + 1, f"{where}/{i}") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key in _COUNTS:
            n = node.get(key)
            if isinstance(n, (int, float)) and not isinstance(n, bool):
                expansion += _count(n, f"{key} at {where or '/'} is {{}}", limits)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for m in _QUANTIFIER.finditer(pattern):
                expansion += max(_count(int(g), f"a repetition in the pattern at "
                                        f"{where or '/'} is {{}}", limits) for g in m.groups() if g)
        if expansion > limits.max_schema_expansion:
            raise _schema_over("its lengths, item counts and pattern repetitions add up to "
                               "{}", expansion, "max_schema_expansion", limits,
                               "Lower minLength/maxLength/minItems/maxItems.")
        props = node.get("properties")
        if isinstance(props, dict):
            for name in props:
                if len(name) > limits.max_name_chars:
                    raise _schema_over(f"a property name at {where or '/'} is {{}} characters",
                                       len(name), "max_name_chars", limits, "Shorten it.")
        todo.extend((v, depth + 1, f"{where}/{k}") for k, v in node.items()
                    if isinstance(v, (dict, list)))


def _count(n: float, what: str, limits: GrammarLimits) -> int:
    if n != n or n > limits.max_schema_repeat:  # NaN, or over
        raise _schema_over(what, int(min(n, 10 ** 15)) if n == n else 0,
                           "max_schema_repeat", limits,
                           "The grammar converter writes it out as that many rules; lower it "
                           "(or leave the length unbounded).")
    return int(max(n, 0))


def _schema_over(what: str, value: int, limit: str, limits: GrammarLimits, hint: str
                 ) -> GrammarTooComplexError:
    """``what`` has a ``{}`` where the measured value goes."""
    return GrammarTooComplexError(
        f"the JSON schema is too complex: {what.format(f'{value:,}')} (the limit is "
        f"{getattr(limits, limit):,}, {limit}). {hint}", limit, "json_schema")


def schema_too_deep(limits: GrammarLimits = LIMITS) -> GrammarTooComplexError:
    """A schema nested deeper than Python's JSON parser or writer can follow (far deeper
    than the limit, so the limit is what the message names)."""
    return GrammarTooComplexError(
        "the JSON schema is too complex: it nests too deeply to be parsed (the limit is "
        f"{limits.max_schema_depth:,} levels, max_schema_depth). Flatten it (use $defs).",
        "max_schema_depth", "json_schema")
