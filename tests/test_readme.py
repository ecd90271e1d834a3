"""The README stays a five-minute read, and no link in it or in docs/ points at nothing."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 12_000  # characters (issue 22: a README a newcomer reads in five minutes)

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def relative_links(markdown: str) -> list[str]:
    """Targets of the markdown links and images outside code, without web or mail addresses."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [target for target in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def anchors(markdown: str) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces as hyphens,
    repeats numbered -1, -2, ..."""
    slugs, repeats = set(), {}
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        repeats[slug] = repeats.get(slug, -1) + 1
        slugs.add(f"{slug}-{repeats[slug]}" if repeats[slug] else slug)
    return slugs


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file (or heading anchor, in a markdown file) does not exist."""
    broken = []
    for target in relative_links(page.read_text()):
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(target)
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination.read_text()):
            broken.append(target)
    return broken


def test_readme_is_short():
    assert len(README.read_text()) <= README_LIMIT


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_at_existing_files(page):
    assert broken_links(page) == []


def test_the_docs_are_reachable_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in relative_links(README.read_text())}
    assert {page.resolve() for page in PAGES[1:]} <= linked


def test_readme_make_commands_are_makefile_targets():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    commands = set(re.findall(r"\bmake ([a-z][\w-]*)", README.read_text()))
    assert {"demo", "test"} <= commands
    assert commands <= targets


def test_readme_keeps_the_generated_learner_block():
    text = README.read_text()
    begin, end = "<!-- learners:begin -->", "<!-- learners:end -->"
    assert text.count(begin) == text.count(end) == 1 and text.index(begin) < text.index(end)


def test_link_checker_finds_what_is_broken(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1) [ok](#self) [web](https://x.y)\n"
        "[gone](missing.md) [bad anchor](there.md#nowhere) ![img](gone.png)\n"
        "`[in code](nowhere.md)`\n\n```\n[in a fence](nowhere.md)\n```\n\n# Self\n"
    )
    assert broken_links(page) == ["missing.md", "there.md#nowhere", "gone.png"]
