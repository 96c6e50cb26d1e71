"""The agent's tools: their JSON schemas and what each does inside a workspace."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from envs.workspace import Workspace, truncate


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI strict-mode tool: every property required, no extra keys."""
    return {"type": "function", "function": {
        "name": name, "description": description, "strict": True,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties), "additionalProperties": False}}}


def tool_schemas(max_command_chars: int = 400, max_file_chars: int = 4000) -> list[dict]:
    path = {"type": "string", "minLength": 1, "maxLength": 200}
    return [
        _tool("bash", "Run a shell command in the repository root and return its output.",
              {"command": {"type": "string", "minLength": 1, "maxLength": max_command_chars}}),
        _tool("read_file", "Return the text of a file in the repository.", {"path": path}),
        _tool("write_file", "Replace the whole content of a file in the repository.",
              {"path": path, "content": {"type": "string", "maxLength": max_file_chars}}),
        _tool("run_tests", "Run the repository's visible tests (tests/) and return the report.",
              {}),
        _tool("submit", "Finish: your changes are graded by hidden tests.", {}),
    ]


@dataclass(frozen=True)
class ToolResult:
    output: str
    ok: bool  # the call was well-formed and the tool ran
    error: str | None = None  # why not, for malformed calls
    submitted: bool = False


class ToolCallError(ValueError):
    """A call that names an unknown tool or whose arguments break the tool's schema."""


class ToolBox:
    """Executes validated tool calls in one workspace."""

    def __init__(self, workspace: Workspace, schemas: list[dict], timeout_s: float,
                 max_output_chars: int) -> None:
        self.ws = workspace
        self.schemas = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
        self.timeout_s = timeout_s
        self.max_output = max_output_chars

    def validate(self, name: str, arguments: str | dict) -> dict:
        if name not in self.schemas:
            raise ToolCallError(f"unknown tool {name!r}; tools: {sorted(self.schemas)}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise ToolCallError(f"arguments of {name} are not JSON: {exc}") from None
        try:
            jsonschema.validate(arguments, self.schemas[name])
        except jsonschema.ValidationError as exc:
            raise ToolCallError(f"arguments of {name} do not match its schema: "
                                f"{exc.message}") from None
        return arguments

    def call(self, name: str, arguments: str | dict) -> ToolResult:
        try:
            args = self.validate(name, arguments)
        except ToolCallError as exc:
            return ToolResult(output=f"error: {exc}", ok=False, error=str(exc))
        try:
            return getattr(self, f"_{name}")(**args)
        except (OSError, PermissionError, UnicodeDecodeError) as exc:
            return ToolResult(output=f"error: {exc}", ok=True)

    def _bash(self, command: str) -> ToolResult:
        res = self.ws.run(["bash", "-c", command], self.timeout_s, self.max_output)
        status = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        return ToolResult(output=f"{res.output}\n[{status}]", ok=True)

    def _read_file(self, path: str) -> ToolResult:
        return ToolResult(truncate(self.ws.resolve(path).read_text(), self.max_output), ok=True)

    def _write_file(self, path: str, content: str) -> ToolResult:
        self.ws.write_text(path, content)
        return ToolResult(f"wrote {len(content)} characters to {path}", ok=True)

    def _run_tests(self) -> ToolResult:
        res = self.ws.run([self.ws.python(), "-m", "unittest", "discover", "-s", "tests"],
                          self.timeout_s, self.max_output)
        return ToolResult(output=res.output, ok=True)

    def _submit(self) -> ToolResult:
        return ToolResult(output="submitted", ok=True, submitted=True)
