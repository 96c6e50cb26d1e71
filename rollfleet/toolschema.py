"""What a tool's JSON schema admits: the one checker of a call's arguments.

The serving side checks every call it reads from sampled tokens (and every call a server's own
parser returns); an environment checks a call again before it runs it. Both ask this module, so
a call is valid in one place exactly when it is valid in the other. The checker is the
`jsonschema` library (draft 2020-12), not a reimplementation. It asserts the formats the grammar
writes as patterns (serving/toolcall/values.FORMATS, kept equal to ASSERTED_FORMATS by
tests/rollfleet/test_toolschema.py); any other `format` is an annotation, as in JSON Schema
itself and in the grammar, which could not keep a sampled value to it.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import jsonschema

SCHEMA_ISSUES = ("missing_argument", "extra_argument", "wrong_type")
_KIND = {"required": "missing_argument", "additionalProperties": "extra_argument"}
ASSERTED_FORMATS = ("date", "date-time", "email", "hostname", "ipv4", "ipv6", "time", "uri",
                    "uri-reference", "uuid")


def _format_checker() -> jsonschema.FormatChecker:
    """Draft 2020-12's checkers of ASSERTED_FORMATS alone (FormatChecker(formats) would pick
    draft 3's `time`). A KeyError here: jsonschema's format extra is not installed."""
    checker = jsonschema.FormatChecker(())
    every = jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers
    checker.checkers = {f: every[f] for f in ASSERTED_FORMATS}
    return checker


_FORMAT_CHECKER = _format_checker()


@dataclass(frozen=True)
class SchemaProblem:
    kind: str  # one of SCHEMA_ISSUES
    message: str  # the validator's own words, with the path of the offending value


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_json)
    return jsonschema.Draft202012Validator(
        schema, format_checker=_FORMAT_CHECKER)


def schema_problems(arguments: Any, parameters: dict) -> list[SchemaProblem]:
    """Every way `arguments` breaks `parameters` (a tool's parameter schema); [] when valid."""
    validator = _validator(json.dumps(parameters, sort_keys=True))
    problems = []
    for error in validator.iter_errors(arguments):
        where = "/".join(str(p) for p in error.absolute_path)
        message = f"{where}: {error.message}" if where else error.message
        problems.append(SchemaProblem(_KIND.get(error.validator, "wrong_type"), message))
    return problems


def problem_kinds(arguments: Any, parameters: dict) -> list[str]:
    """The kinds of `schema_problems`, each once, in the order first seen."""
    return list(dict.fromkeys(p.kind for p in schema_problems(arguments, parameters)))


__all__ = ["ASSERTED_FORMATS", "SCHEMA_ISSUES", "SchemaProblem", "problem_kinds",
           "schema_problems"]
