"""A request's constraint, compiled and checked: GBNF text, a JSON schema or JSON mode
turned into GBNF by llama.cpp's own parser and converter, and refused before any model
loads when it cannot be enforced exactly (the rules are in :mod:`edgespec.grammar.state`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from ..errors import InvalidInputError, UnsupportedError
from .bounds import check_schema, check_schema_text, measure_gbnf, schema_too_deep
from .cache import ByteBudgetCache, text_bytes

if TYPE_CHECKING:
    from ..api.params import GenerationParams

#: JSON Schema keywords that constrain a value (annotations such as title are not here)
_VALIDATION_KEYWORDS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "dependencies", "items", "prefixItems", "additionalItems", "contains",
    "properties", "patternProperties", "additionalProperties", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if", "then",
    "else", "dependentSchemas", "$ref", "$dynamicRef", "format", "contentEncoding",
    "contentMediaType",
})
_PRIMITIVES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4",
                      "uuid5"})


class GrammarError(InvalidInputError):
    """A grammar or JSON schema that cannot be parsed or enforced."""


#: the request field each kind of constraint comes from (named by GrammarTooComplexError)
_PARAMS = {"grammar": "grammar", "json_schema": "json_schema", "json": "json_mode"}

#: compiled constraints kept, by the bytes of their texts (a count bounded nothing: one
#: heavy schema's grammar weighed ~95 MB before edgespec.grammar.bounds)
CACHE_BUDGET = 16 * 1024 * 1024
_CACHE: "ByteBudgetCache[tuple[str, str], Constraint]" = ByteBudgetCache(
    CACHE_BUDGET, lambda key, c: text_bytes(key[1], c.gbnf if c.gbnf is not key[1] else None,
                                            c.schema if c.schema is not key[1] else None))


# --- compile: params -> GBNF, refused before any load -------------------------------------
@dataclass(frozen=True)
class Constraint:
    kind: str  # "grammar" | "json_schema" | "json"
    gbnf: str
    schema: str | None = None  # the JSON schema's text, for validating outputs
    root: str = "root"

    def __post_init__(self) -> None:
        # every grammar is measured before llama.cpp parses it, however it was built
        # (edgespec.grammar.bounds: a deep or wide grammar crashes or pins llama.cpp)
        measure_gbnf(self.gbnf, param=_PARAMS.get(self.kind, "grammar"))

    def output_error(self, text: str) -> str | None:
        """Why ``text`` is not valid JSON for this constraint's schema (None: valid or not JSON
        mode). A safety net for callers: a complete grammar-constrained output always passes."""
        if self.kind == "grammar":
            return None
        try:
            value = json.loads(text)
        except ValueError as e:
            return f"not JSON: {e}"
        if self.kind == "json":
            return None if isinstance(value, dict) else "not a JSON object"
        # deferred: jsonschema is slow to import; only schema requests need it
        import jsonschema
        err = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(json.loads(self.schema))(
                json.loads(self.schema)).iter_errors(value))
        return None if err is None else err.message


def constraint_for(params: "GenerationParams") -> Constraint | None:
    """A request's constraint (its grammar, JSON schema or JSON mode), or None; refused with
    GrammarError / UnsupportedError / InvalidInputError as :func:`constraint_of`."""
    return constraint_of(params.grammar, params.json_schema, params.json_mode)


def constraint_of(grammar: str | None = None, json_schema: str | dict | None = None,
                  json_mode: bool = False) -> Constraint | None:
    """The request's constraint as GBNF, or None; raises GrammarError / UnsupportedError."""
    given = [n for n, v in (("grammar", grammar is not None), ("json_schema", json_schema is not None),
                            ("json_mode", json_mode)) if v]
    if len(given) > 1:
        raise InvalidInputError(f"give one of grammar, json_schema and json_mode (got "
                                f"{' and '.join(given)})")
    if grammar is not None:
        if not isinstance(grammar, str):
            raise GrammarError(f"the grammar must be GBNF text (got {type(grammar).__name__})")
        return _CACHE.get_or_make(("grammar", grammar), lambda key: _from_gbnf(key[1]))
    if json_schema is not None:
        text = json_schema if isinstance(json_schema, str) else _dumps(json_schema)
        return _CACHE.get_or_make(("json_schema", text), lambda key: _from_schema(key[1]))
    if json_mode:
        from ..runtime import backend  # deferred: it loads llama.cpp
        return Constraint("json", backend.json_object_gbnf())
    return None


def _dumps(schema: object) -> str:
    try:
        return json.dumps(schema)
    except RecursionError:
        raise schema_too_deep() from None
    except (TypeError, ValueError) as e:
        raise GrammarError(f"the JSON schema is not JSON data: {e}") from None


def _c_text(text: str, what: str) -> None:
    """Refuse what llama.cpp's C strings would silently change: a NUL ends its text early,
    and a lone surrogate cannot be encoded at all."""
    if "\0" in text:
        raise GrammarError(f"the {what} contains a NUL character, which would cut llama.cpp's "
                           "copy of it short; remove it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GrammarError(f"the {what} is not valid Unicode text ({e.reason} at character "
                           f"{e.start}); remove the lone surrogate") from None


def _from_gbnf(text: str) -> Constraint:
    from ..runtime.grammar_binding import grammar_error  # deferred: it loads llama.cpp
    if not text.strip():
        raise GrammarError("the grammar is empty; give GBNF text with a `root ::= ...` rule")
    _c_text(text, "grammar")
    c = Constraint("grammar", text)  # measured first (edgespec.grammar.bounds)
    why = grammar_error(text, "root")
    if why is not None:
        raise GrammarError(f"llama.cpp cannot parse the grammar: {why}. Check the GBNF syntax "
                           "(llama.cpp's grammars/README.md); the start rule must be `root`")
    return c


def _from_schema(text: str) -> Constraint:
    from ..runtime import backend  # deferred: it loads llama.cpp
    from ..runtime.grammar_binding import grammar_error  # deferred: it loads llama.cpp
    # bounded before parsing and before converting: the converter writes each length and
    # item count out as that many rules (edgespec.grammar.bounds)
    check_schema_text(text)
    _c_text(text, "JSON schema")
    try:
        schema = json.loads(text)
    except RecursionError:
        raise schema_too_deep() from None
    except ValueError as e:
        raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("a JSON schema must be an object (or true/false)")
    check_schema(schema)
    # deferred: jsonschema is slow to import; only schema requests need it
    import jsonschema
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        raise GrammarError(f"the JSON schema is invalid at {_where(e.path)}: {e.message}") from None
    check_schema_supported(schema)
    try:
        gbnf = backend.json_schema_to_gbnf(text)
    except Exception as e:  # the converter asserts and raises ValueError/KeyError
        raise UnsupportedError(f"the JSON schema cannot be turned into a grammar ({type(e).__name__}: "
                               f"{e}); simplify it (docs/parity.md lists what is enforced)") from None
    c = Constraint("json_schema", gbnf, schema=text)  # measured first (edgespec.grammar.bounds)
    why = grammar_error(gbnf, "root")
    if why is not None:  # a converter bug, not the user's: still never unconstrained
        raise UnsupportedError(f"the grammar converted from the JSON schema does not parse ({why})")
    return c


def check_schema_supported(schema) -> None:
    """Refuse every validation keyword the converter would not enforce.

    Mirrors the converter's dispatch (``SchemaConverter.visit``): each kind of schema
    honours only some keywords, and the rest would be dropped without a word, so an
    output could break the schema. Refusing them keeps "every output validates" true.
    """
    _check(schema, schema, (), set())


def _check(node, root, path: tuple, seen: set) -> None:
    if node is True or node == {}:
        return
    if node is False:
        _unsupported(path, "false", "a schema that admits nothing")
    if not isinstance(node, dict):
        raise GrammarError(f"the JSON schema at {_where(path)} is not an object")
    ok = _honoured(node, root, path, seen)
    dropped = sorted((set(node) & _VALIDATION_KEYWORDS) - ok)
    if dropped:
        _unsupported(path, dropped[0], f"the keyword {dropped[0]!r}"
                     + (f" (with {node.get('format')!r})" if dropped[0] == "format" else ""))


def _honoured(node: dict, root, path: tuple, seen: set) -> set[str]:
    """The keywords the converter honours for this kind of schema (its subschemas checked
    on the way); a kind it cannot enforce is refused."""
    t = node.get("type")
    if "$ref" in node:
        _check_ref(node["$ref"], root, path, seen)
        return {"$ref"}
    if "oneOf" in node:
        _unsupported(path, "oneOf", "oneOf", "the grammar would admit any branch, so an output "
                     "could match two; use anyOf")
    if "anyOf" in node:
        for i, sub in enumerate(node["anyOf"]):
            _check(sub, root, (*path, "anyOf", i), seen)
        return {"anyOf"}
    if isinstance(t, list):
        for name in t:
            if name not in _PRIMITIVES:
                _unsupported(path, "type", f"the type {name!r}")
        return {"type"}
    if "const" in node or "enum" in node:
        return {"const" if "const" in node else "enum", "type"}
    if t in (None, "object") and ("properties" in node or (
            "additionalProperties" in node and node["additionalProperties"] is not True)):
        _check_object(node, root, path, seen)
        return {"type", "properties", "required", "additionalProperties"}
    if t in (None, "object") and "allOf" in node:
        _unsupported(path, "allOf", "allOf", "the converter merges only their properties; merge "
                     "the subschemas into one")
    if t in (None, "array") and ("items" in node or "prefixItems" in node):
        return _check_array(node, root, path, seen)
    if t in (None, "string") and "pattern" in node:
        return {"type", "pattern"}
    if t in (None, "string") and node.get("format") in _FORMATS:
        return {"type", "format"}
    if t == "string" and ("minLength" in node or "maxLength" in node):
        return {"type", "minLength", "maxLength"}
    if t in _PRIMITIVES or (t is None and not (set(node) & _VALIDATION_KEYWORDS)):
        return {"type"}
    kw = sorted((set(node) & _VALIDATION_KEYWORDS) - {"type"}) or ["type"]
    _unsupported(path, kw[0], f"the keyword {kw[0]!r}")


def _check_ref(ref, root, path: tuple, seen: set) -> None:
    """A local reference, followed once (the schema it points to checked)."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        _unsupported(path, "$ref", f"the reference {ref!r} (only local '#/...' references)")
    if ref not in seen:
        seen.add(ref)
        target = root
        for part in ref[2:].split("/"):
            if not isinstance(target, dict) or part not in target:
                raise GrammarError(f"the JSON schema's reference {ref!r} points nowhere")
            target = target[part]
        _check(target, root, (ref,), seen)


def _check_object(node: dict, root, path: tuple, seen: set) -> None:
    """An object's properties and additional properties."""
    props = node.get("properties", {})
    missing = [r for r in node.get("required", []) if r not in props]
    if missing:
        _unsupported(path, "required", f"required properties without a schema ({missing})")
    for name, sub in props.items():
        _check(sub, root, (*path, name), seen)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        _check(extra, root, (*path, "additionalProperties"), seen)


def _check_array(node: dict, root, path: tuple, seen: set) -> set[str]:
    """An array's items (one schema, or one per position); the keywords honoured with them."""
    # "items" may be {} (any item), which is falsy: look the keys up, not the values
    items = node["items"] if "items" in node else node["prefixItems"]
    if isinstance(items, list):
        for i, sub in enumerate(items):
            _check(sub, root, (*path, i), seen)
        return {"type", "items" if "items" in node else "prefixItems"}
    _check(items, root, (*path, "items"), seen)
    return {"type", "items", "minItems", "maxItems"}


def _unsupported(path: tuple, keyword: str, what: str, hint: str = "") -> NoReturn:
    raise UnsupportedError(
        f"the JSON schema at {_where(path)} uses {what}, which the grammar converter cannot "
        "enforce; an output could then break the schema, so it is refused. "
        + (hint[0].upper() + hint[1:] + "." if hint else
           "Remove it or express it another way (docs/parity.md lists what is enforced)."))


def _where(path) -> str:
    return "/" + "/".join(str(p) for p in path) if path else "the top level"
