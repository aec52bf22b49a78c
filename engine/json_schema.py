"""JSON schema (the subset clients use for structured output) -> a GBNF grammar for engine.grammar.

Covered: const, enum, type (string, number, integer, boolean, null, object with properties and required,
array with items or a list of items), anyOf / oneOf, and an empty schema (any JSON value). A schema this
cannot turn into a grammar is an error naming the part, never a looser grammar.
"""

from __future__ import annotations

import json

BASE = r'''
ws ::= ( " " | "\n" [ \t]{0,8} )?
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}" ws
array ::= "[" ws ( value ( "," ws value )* )? "]" ws
string ::= "\"" char* "\"" ws
char ::= [^"\\\x00-\x1F\x7F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4,4} )
integer ::= "-"? ( [0-9] | [1-9] [0-9]{1,15} ) ws
number ::= "-"? ( [0-9] | [1-9] [0-9]{1,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )? ws
boolean ::= ( "true" | "false" ) ws
null ::= "null" ws
'''
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


class SchemaError(ValueError):
    pass


def _lit(value) -> str:
    return json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False) + " ws"


class _Builder:
    def __init__(self):
        self.rules: list[str] = []

    def rule(self, body: str) -> str:
        name = f"s{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def of(self, schema, where: str) -> str:
        if schema is True or schema == {}:
            return "value"
        if not isinstance(schema, dict):
            raise SchemaError(f"{where} must be an object, not {type(schema).__name__}")
        if "const" in schema:
            return self.rule(_lit(schema["const"]))
        if "enum" in schema:
            if not isinstance(schema["enum"], list) or not schema["enum"]:
                raise SchemaError(f"{where}.enum must be a non-empty array")
            return self.rule(" | ".join(_lit(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                if not isinstance(schema[key], list) or not schema[key]:
                    raise SchemaError(f"{where}.{key} must be a non-empty array")
                return self.rule(" | ".join(self.of(s, f"{where}.{key}[{i}]") for i, s in enumerate(schema[key])))
        kind = schema.get("type")
        if isinstance(kind, list):
            return self.rule(" | ".join(self.of({**schema, "type": k}, where) for k in kind))
        if kind is None:
            if "properties" in schema:
                kind = "object"
            elif "items" in schema:
                kind = "array"
            else:
                return "value"
        if kind not in TYPES:
            raise SchemaError(f"{where}.type must be one of {', '.join(TYPES)}, not {json.dumps(kind)}")
        if kind == "object":
            return self._object(schema, where)
        if kind == "array":
            return self._array(schema, where)
        return kind

    def _object(self, schema: dict, where: str) -> str:
        props = schema.get("properties")
        if props is None:
            return "object"
        if not isinstance(props, dict):
            raise SchemaError(f"{where}.properties must be an object")
        required = [k for k in schema.get("required", []) if k in props]
        optional = [k for k in props if k not in required]
        part = {k: f'{_lit(k)} ":" ws {self.of(props[k], f"{where}.properties.{k}")}' for k in props}

        def tail(keys: list[str]) -> str:
            return "".join(f' ( "," ws {part[k]} )?' for k in keys)

        if required:  # the required ones in order, then each optional one or not
            body = ' "," ws '.join(part[k] for k in required) + tail(optional)
        elif optional:
            body = "( " + " | ".join(part[k] + tail(optional[i + 1:]) for i, k in enumerate(optional)) + " )?"
        else:
            body = ""
        return self.rule(f'"{{" ws {body} "}}" ws')

    def _array(self, schema: dict, where: str) -> str:
        items = schema.get("items", schema.get("prefixItems"))
        if isinstance(items, list):  # a tuple of schemas
            inner = ' "," ws '.join(self.of(s, f"{where}.items[{i}]") for i, s in enumerate(items))
            return self.rule(f'"[" ws {inner} "]" ws' if items else '"[" ws "]" ws')
        item = self.of(items if items is not None else {}, f"{where}.items")
        return self.rule(f'"[" ws ( {item} ( "," ws {item} )* )? "]" ws')


def schema_rules(schema, where: str = "schema") -> tuple[str, str]:
    """The rules for a schema (the JSON basics included) and the name of its top rule, for a grammar that
    embeds the value in text of its own."""
    b = _Builder()
    top = b.of(schema, where)
    return BASE + "\n".join(b.rules), top


def schema_grammar(schema) -> str:
    rules, top = schema_rules(schema)
    return rules + f"\nroot ::= {top}\n"  # no space before the value, as llama.cpp's


JSON_OBJECT = BASE + "root ::= object\n"
