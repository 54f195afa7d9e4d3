"""The repository explains itself: every page a docstring, a comment or a document points to is in
the repository, with the section it names, and nothing cites a design file that is not here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Where references are looked for: the code, the tests, the examples and benchmarks, every page.
SCANNED = ("src", "tests", "docs", "examples", "benchmarks")

#: ``docs/<page>.md`` or ``docs/<page>.md#<section>``, as code and top-level pages cite them.
DOCS_PATH = re.compile(r"(?<![\w/.])docs/[\w/.-]+?\.md(?:#[\w-]+)?")

#: A Markdown link's target: ``[text](target)``.
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")

#: The citation of a design document that users do not have (built so this file does not match).
DESIGN_CITATION = re.compile("DESIGN" + r"(?: §|\.md)")

#: Folders whose files still cite it, being rewritten by other work at the time of writing (issue
#: 15). A folder that no longer does fails the last test: then drop it here.
PENDING: tuple[str, ...] = ()


def _files(suffixes: tuple[str, ...]) -> Iterator[Path]:
    yield from (p for p in sorted(REPO.glob("*")) if p.suffix in suffixes and p.is_file())
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*")):
            if (
                path.suffix in suffixes
                and "egg-info" not in str(path)
                and ".venv" not in path.parts
            ):
                yield path


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _references() -> Iterator[tuple[Path, str, Path, str | None]]:
    """(citing file, reference as written, target page, section or None)."""
    for path in _files((".py", ".md", ".toml", ".yaml", ".yml")):
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in DOCS_PATH.finditer(text):
            page, _, section = match.group(0).partition("#")
            yield path, match.group(0), REPO / page, section or None
        if path.suffix != ".md":
            continue
        for match in MD_LINK.finditer(text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue  # a URL, or an absolute path shown as an example
            page, _, section = target.partition("#")
            if page and not page.endswith(".md"):
                continue
            yield path, target, (path.parent / page) if page else path, section or None


REFERENCES = sorted(
    {(str(p.relative_to(REPO)), ref, t, s) for p, ref, t, s in _references()},
    key=lambda r: (r[0], r[1]),
)


def test_the_scan_finds_the_references_it_is_for() -> None:
    """The scan is not vacuous: it sees the docstrings' pointers into docs/concepts.md."""
    cited = {ref for _, ref, _, _ in REFERENCES}
    assert "docs/concepts.md#the-write-path" in cited
    assert "docs/decision-table.md#when-not-found-is-proof" in cited


@pytest.mark.parametrize(
    ("citing", "reference", "page", "section"),
    REFERENCES,
    ids=[f"{c}->{r}" for c, r, _, _ in REFERENCES],
)
def test_every_reference_names_a_page_and_section_that_exist(
    citing: str, reference: str, page: Path, section: str | None
) -> None:
    """A cited page exists in the repository, and so does the section its anchor names."""
    assert page.is_file(), f"{citing} cites {reference}: no such page"
    if section is not None:
        anchors = _anchors(page)
        assert section in anchors, f"{citing} cites {reference}: sections are {sorted(anchors)}"


def test_nothing_cites_a_design_document_that_is_not_in_the_repository() -> None:
    """No file outside the folders still being rewritten cites the design document users do not
    have; each of those folders still does (else it leaves the list)."""
    citing: dict[str, list[str]] = {}
    for path in _files((".py", ".md", ".toml", ".yaml", ".yml", ".txt", ".html")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if DESIGN_CITATION.search(line):
                citing.setdefault(str(path.relative_to(REPO)), []).append(f"line {number}")
    outside = {p: lines for p, lines in citing.items() if not p.startswith(PENDING)}
    assert outside == {}, "cite docs/concepts.md or docs/decision-table.md instead"
    for folder in PENDING:
        assert any(p.startswith(folder) for p in citing), (
            f"{folder}: none left; drop it from PENDING"
        )
