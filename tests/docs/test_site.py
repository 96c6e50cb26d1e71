"""The documentation site builds offline with `mkdocs build --strict`, as the README types it.
mkdocs.yml makes every doubt a warning, so a broken link, a link to a heading that is not
there, a page missing from the nav or a snippet that names no file fails this test."""

import os
import re
import subprocess
import sys
from pathlib import Path

from rollfleet.paths import ROOT


def test_the_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-4000:]
    assert (site / "index.html").is_file()


def test_the_readme_links_files_that_exist() -> None:
    """The README is read outside the site (on a forge, in an editor): its links are paths."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links and [link for link in links if not (ROOT / link).exists()] == []
