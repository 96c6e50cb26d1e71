"""The benchmark data pages are generated from the committed JSON (scripts/docs_bench_pages.py):
every JSON file has a page, each committed page is what the generator writes from the JSON now,
and what a JSON does not record is said to be missing, never filled in."""


from rollfleet.paths import ROOT
from tests.scripts import load_script

pages = load_script("docs_bench_pages")


def test_every_json_has_a_page() -> None:
    on_pages = [f for _, _, globs in pages.PAGES.values() for f in pages.files(globs)]
    committed = sorted(str(p.relative_to(ROOT)) for folder in ("bench", "kernels/results")
                       for p in (ROOT / folder).rglob("*.json"))
    assert sorted(on_pages) == committed  # each once


def test_the_committed_pages_are_what_the_json_says_now() -> None:
    want = pages.render()
    assert sorted(p.name for p in pages.OUT.glob("*.md")) == sorted(want)
    stale = [name for name, text in want.items() if (pages.OUT / name).read_text() != text]
    assert stale == [], f"{stale} disagree with their JSON: run python scripts/docs_bench_pages.py"


def test_what_a_json_does_not_record_is_said_not_guessed() -> None:
    said = "\n".join(pages.provenance("bench/none.json", {"results": {}}))
    for what in ("command", "commit", "machine", "date"):
        assert f"- {what}: not recorded in the JSON" in said


def test_a_few_members_with_many_figures_are_one_column_each() -> None:
    node = {name: {f"figure{i}": i for i in range(pages.MAX_COLUMNS + 1)} for name in "ab"}
    assert pages.render_node(node, "t", 3)[2:4] == ["|  | a | b |", "|---|---|---|"]


def test_a_page_cites_a_json_by_its_whole_name() -> None:
    """The RL guide names bench/policy_update_disagg.json, which ends like bench/disagg.json."""
    assert "guides/rl-training.md" in pages.citing_pages("bench/policy_update_disagg.json")
    assert "guides/rl-training.md" not in pages.citing_pages("bench/disagg.json")
    assert "guides/serving-topologies.md" in pages.citing_pages("bench/disagg.json")
