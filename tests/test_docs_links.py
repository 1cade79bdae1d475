"""The README is a quickstart and every link in it and in docs/ leads somewhere: to a file that exists and,
where the link names a section, to a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_a_quickstart_with_the_two_commands_and_the_fast_tier() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make run " in readme and "make test " in readme and "make test-fast" in readme
    # CI runs the README's test command, whatever else .ci/run does around it
    assert re.search(r"^make test\b(?!-)", (ROOT / ".ci" / "run").read_text(), flags=re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_section_that_exist(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        assert found.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in anchors(found), f"{page.name}: {target}"
