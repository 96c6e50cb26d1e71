"""The agent's tools: their JSON schemas and what each does inside a workspace."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.sandbox import SandboxFailure
from envs.workspace import Workspace, truncate
from rollfleet.toolschema import schema_problems


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI strict-mode tool: every property required, no extra keys."""
    return {"type": "function", "function": {
        "name": name, "description": description, "strict": True,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties), "additionalProperties": False}}}


def tool_schemas(max_command_chars: int = 400, max_file_chars: int = 4000) -> list[dict]:
    # Every value is bounded, so a grammar can bound a whole call's length; empty strings are
    # the tools' errors to report, not schema violations.
    path = {"type": "string", "maxLength": 200}
    text = {"type": "string", "maxLength": max_file_chars}
    line = {"type": ["integer", "null"], "minimum": 1, "maximum": 1_000_000}
    return [
        _tool("bash", "Run a shell command in the repository root and return its output.",
              {"command": {"type": "string", "maxLength": max_command_chars}}),
        _tool("read_file", "Return lines start..end (1-based, inclusive; null: from the start "
              "or to the end) of a file in the repository, numbered.",
              {"path": path, "start_line": line, "end_line": line}),
        _tool("write_file", "Create a file, or replace its whole content.",
              {"path": path, "content": text}),
        _tool("str_replace", "Replace the one occurrence of old_text in a file with new_text.",
              {"path": path, "old_text": text, "new_text": text}),
        _tool("search", "List the lines of the repository's files that contain a text.",
              {"text": {"type": "string", "maxLength": 200}}),
        _tool("run_tests", "Run the repository's visible tests and return the report.", {}),
        _tool("submit", "Finish: your changes are graded by hidden tests.", {}),
    ]


@dataclass(frozen=True)
class ToolResult:
    output: str
    ok: bool  # the call was well-formed and named a tool
    error: str | None = None  # why not, for malformed calls
    submitted: bool = False
    failed: bool = False  # well-formed, but the tool itself failed (missing file, no match)


class ToolCallError(ValueError):
    """A call that names an unknown tool or whose arguments break the tool's schema."""


def check_arguments(name: str, arguments: str | dict, parameters: dict) -> dict:
    """A call's arguments as a dict; ToolCallError if they are not JSON or break `parameters`."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"arguments of {name} are not JSON: {exc}") from None
    problems = schema_problems(arguments, parameters)
    if problems:
        raise ToolCallError(f"arguments of {name} do not match its schema: "
                            f"{problems[0].message}")
    return arguments


class ToolBox:
    """Executes validated tool calls in one workspace."""

    def __init__(self, workspace: Workspace, schemas: list[dict], timeout_s: float,
                 max_output_chars: int, test_argv: list[str]) -> None:
        self.ws = workspace
        self.schemas = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
        self.timeout_s = timeout_s
        self.max_output = max_output_chars
        self.test_argv = test_argv

    def validate(self, name: str, arguments: str | dict) -> dict:
        if name not in self.schemas:
            raise ToolCallError(f"unknown tool {name!r}; tools: {sorted(self.schemas)}")
        return check_arguments(name, arguments, self.schemas[name])

    def call(self, name: str, arguments: str | dict) -> ToolResult:
        try:
            args = self.validate(name, arguments)
        except ToolCallError as exc:
            return ToolResult(output=f"error: {exc}", ok=False, error=str(exc))
        try:
            return getattr(self, f"_{name}")(**args)
        except SandboxFailure:
            raise
        except OSError as exc:
            return ToolResult(output=f"error: {self._as_seen(exc)}", ok=True, failed=True)
        except (ValueError, UnicodeDecodeError) as exc:
            return ToolResult(output=f"error: {exc}", ok=True, failed=True)

    def _as_seen(self, exc: OSError) -> str:
        """An OS error as the model sees its files: paths relative to the repository. The
        host's session folder would tell the model where it runs and make the same call's
        record differ from run to run."""
        if exc.filename is None or exc.strerror is None:
            return str(exc)
        root = self.ws.path.resolve()
        shown = []
        for name in (exc.filename, exc.filename2):
            if name is not None:
                path = Path(os.fsdecode(name))
                shown.append(str(path.relative_to(root)) if path.is_relative_to(root)
                             else path.name)
        return f"{exc.strerror}: {' -> '.join(shown)}"

    def _bash(self, command: str) -> ToolResult:
        res = self.ws.run(["bash", "-c", command], self.timeout_s, self.max_output)
        status = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        return ToolResult(output=f"{res.output}\n[{status}]", ok=True)

    def _read_file(self, path: str, start_line: int | None, end_line: int | None) -> ToolResult:
        lines = self.ws.resolve(path).read_text().splitlines()
        first = (start_line or 1) - 1
        last = min(end_line or len(lines), len(lines))
        numbered = "\n".join(f"{i + 1:6d}  {lines[i]}" for i in range(first, last))
        return ToolResult(truncate(numbered, self.max_output), ok=True)

    def _write_file(self, path: str, content: str) -> ToolResult:
        self.ws.write_text(path, content)
        return ToolResult(f"wrote {len(content)} characters to {path}", ok=True)

    def _str_replace(self, path: str, old_text: str, new_text: str) -> ToolResult:
        text = self.ws.resolve(path).read_text()
        count = text.count(old_text)
        if count != 1:
            raise ValueError(f"old_text occurs {count} times in {path}; it must occur once")
        self.ws.write_text(path, text.replace(old_text, new_text))
        return ToolResult(f"replaced 1 occurrence in {path}", ok=True)

    def _search(self, text: str) -> ToolResult:
        res = self.ws.run(["grep", "-rnF", "--exclude-dir=__pycache__", "--", text, "."],
                          self.timeout_s, self.max_output)
        return ToolResult(res.output or "no matches", ok=True)

    def _run_tests(self) -> ToolResult:
        res = self.ws.run(self.test_argv, self.timeout_s, self.max_output)
        return ToolResult(output=res.output, ok=True)

    def _submit(self) -> ToolResult:
        return ToolResult(output="submitted", ok=True, submitted=True)
