"""The configuration reference is generated from the code (scripts/docs_config_reference.py):
every key of every group has a meaning, every group under conf/ is there, and the committed
page is what the generator writes now."""

from dataclasses import dataclass, field

import yaml

from rollfleet.paths import CONF
from tests.scripts import load_script

ref = load_script("docs_config_reference")


@dataclass(frozen=True)
class _Example:
    trailing: int = 1  # said on its line
    # said above it,
    # over two lines
    above: list[str] = field(default_factory=lambda: ["a"])
    bare: str = "x"
    spans: dict = field(
        default_factory=dict)  # said on its last line


def test_a_keys_meaning_is_its_comment_on_the_line_or_right_above() -> None:
    got = {k.name: (k.default, k.meaning) for k in ref.keys(_Example, "ex")}
    assert got == {"ex.trailing": ("`1`", "said on its line"),
                   "ex.above": ("`[a]`", "said above it, over two lines"),
                   "ex.bare": ("`x`", ""),
                   "ex.spans": ("`{}`", "said on its last line")}


def test_every_config_key_has_a_meaning() -> None:
    keys = [k for group, cls in ref.GROUPS.items() for k in ref.keys(cls, group)]
    keys += [k for name in ref.ROOTS for k in ref.root_keys(CONF / name)]
    assert len(keys) > 150
    assert [k.name for k in keys if not k.meaning] == []


def test_every_group_typed_by_a_schema_is_documented() -> None:
    typed = {p.parent.name for p in CONF.glob("*/*.yaml")
             if "schema" in (yaml.safe_load(p.read_text()) or {}).get("defaults", [])}
    assert typed <= set(ref.GROUPS)


def test_the_committed_page_is_what_the_generator_writes() -> None:
    assert ref.PAGE.read_text() == ref.render(), \
        "docs/reference/config.md is stale: run python scripts/docs_config_reference.py"
