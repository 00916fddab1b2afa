"""The documentation's relative links resolve inside the repository.

Every Markdown link of the tracked `.md` files that is not a URL must name a file or folder of the
repository (and, with `#anchor`, a heading of that Markdown file); none may point outside it.
The reports `swarmrl research` wrote for the recorded studies link their runs' directories, which
are not kept, so they are left out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
GENERATED = "bench/results/research/"


def markdown_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    if not out:  # not a git checkout (an sdist): the Markdown files outside hidden and installed folders
        found = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.md")]
        out = [p for p in found if not any(x.startswith(".") or x == "node_modules" for x in p.split("/"))]
    return [ROOT / p for p in out if not p.startswith(GENERATED)]


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of `md`: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.*)$", FENCE.sub("", md.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(md: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", md.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of this page
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve()
        if not dest.is_relative_to(ROOT.resolve()):
            bad.append(f"{target} (outside the repository)")
        elif not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {path})")
    return bad


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    assert broken_links(md) == [], f"{md.relative_to(ROOT)} has broken links"
