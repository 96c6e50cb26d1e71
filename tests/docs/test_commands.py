"""Every command the README and the guides type is accounted for in docs/reference/commands.md:
run by a named test or by CI, or marked as not run here (or not by the tests) with the reason.
A command typed on a page and missing from the table fails, a row whose command no page types
fails, and a row naming a test that is gone, or no longer types the command's groups and keys,
fails."""

import ast
import re
from pathlib import Path

from rollfleet.paths import ROOT

TABLE = ROOT / "docs" / "reference" / "commands.md"
KINDS = ("test: ", "ci: ", "not run here: ", "not run by the tests", "not a command to type: ")
STARTS = ("python ", "python3 ", ".venv/bin/", "bash ", "pip ", "vf-eval")


def pages() -> list[Path]:
    """The README and the guides: where a newcomer copies commands from."""
    return [ROOT / "README.md", ROOT / "docs" / "quickstart.md",
            *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def typed(text: str) -> set[str]:
    """Commands in shell code blocks (a line each, `\\` continuations joined, comments off) and
    in inline code that starts like a command."""
    found = set()
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("bash", "sh", ""):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip() and not line.strip().startswith("#"):
                    found.add(" ".join(line.split(" #")[0].split()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    found |= {" ".join(c.split()) for c in re.findall(r"`([^`]+)`", prose)
              if c.strip().startswith(STARTS)}
    return found


def rows() -> dict[str, str]:
    out = {}
    for line in TABLE.read_text().splitlines():
        m = re.match(r"\| `(.+?)` \| (.+) \|$", line)
        if m:
            out[m.group(1).replace("\\|", "|")] = m.group(2)
    return out


def test_every_command_typed_is_in_the_table_and_every_row_is_typed() -> None:
    on_pages = set().union(*(typed(p.read_text()) for p in pages()))
    table = rows()
    assert sorted(on_pages - set(table)) == []
    assert sorted(set(table) - on_pages) == []
    assert [c for c, how in table.items() if not how.startswith(KINDS)] == []


def test_each_test_named_types_the_commands_groups_and_keys() -> None:
    """A group choice (`serving=kv_routed`) must be in the test's source as typed; a key
    (`rollout.temperature=...`) by name, since tests run smaller values."""
    for command, how in rows().items():
        if how.startswith("ci: "):
            assert command in (ROOT / ".ci" / "run").read_text(), command
        if not how.startswith("test: "):
            continue
        paths = re.findall(r"`(tests/[^`]+)`", how)
        test_file, _, name = paths[0].partition("::")
        source = "".join((ROOT / p.partition("::")[0]).read_text() for p in paths)
        tree = ast.parse((ROOT / test_file).read_text())
        assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, how
        for token in command.split()[1:]:
            if "=" in token and "<" not in token:
                key, _, _ = token.partition("=")
                assert (key if "." in key else token) in source, (command, token)
            elif token.startswith("-") or "." in token and "/" not in token:
                assert token.split("=")[0] in source, (command, token)
