"""The README and docs/ link only to what exists: files in the repository, and headings of
the page they point at (GitHub's anchor rules); nothing outside the repository but web
addresses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.bins import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
                REPO / "benchmarks" / "THROUGHPUT.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        outside = not dest.exists() or REPO.resolve() not in (dest, *dest.parents)
        if outside or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_the_readme_points_nowhere_outside_the_repository() -> None:
    text = (REPO / "README.md").read_text()
    assert "../shared" not in text and "shared/design.md" not in text


def test_the_code_map_names_every_module_and_package() -> None:
    """docs/README.md's code map names every module of app/ and coscheduling/, every
    subpackage and every module inside one, so a new module cannot hide from it."""
    text = (REPO / "docs" / "README.md").read_text()
    named = set(re.findall(r"`([\w/]+)`", text))
    missing = []
    for pkg in ("app", "coscheduling"):
        root = REPO / pkg
        for f in root.glob("*.py"):
            if f.stem not in ("__init__", "__main__") and f.stem not in named:
                missing.append(f"{pkg}/{f.name}")
        for d in root.iterdir():
            if (d / "__init__.py").exists():
                if f"{d.name}/" not in named:
                    missing.append(f"{pkg}/{d.name}/")
                missing += [f"{pkg}/{d.name}/{f.name}" for f in d.glob("*.py")
                            if f.stem != "__init__" and f.stem not in named]
    assert not missing, f"docs/README.md's code map does not name: {sorted(missing)}"
