"""The docs stay true to the code: docs/flags.md is what scripts/dev/gen_flags.py writes from the parsers, every
relative link in README.md and docs/ resolves, and the README stays a user guide of a few screens."""

import re

from tests.utils import REPO, script_output

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(markdown: str) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_flag_reference_is_generated_from_the_parsers():
    # in a fresh process: a --user-dir plugin another test loaded stays registered in this one (its arch would
    # appear in the tables)
    out = script_output("dev/gen_flags", [], 300)
    written = (REPO / "docs" / "flags.md").read_text(encoding="utf-8")
    assert out == written, (
        "docs/flags.md is stale: PYTHONPATH=. python scripts/dev/gen_flags.py > docs/flags.md"
    )


def test_flag_reference_covers_every_program():
    """Each console script of pyproject.toml has its section in docs/flags.md (seqtrain-interactive was missing)."""
    scripts = re.findall(
        r"^(seqtrain-[\w-]+) = ", (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M
    )
    text = (REPO / "docs" / "flags.md").read_text(encoding="utf-8")
    assert len(scripts) == 10 and [s for s in scripts if f"\n## {s}\n" not in text] == []
    section = text[text.index("## seqtrain-interactive") : text.index("## seqtrain-convert")]
    assert (
        "| `--buffer-size` | `1` |" in section
        and "| `--input` | `-` |" in section
        and "`--results-path`" in section
    )


def test_relative_links_resolve():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, mailto: ...
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_readme_is_a_short_user_guide():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300
    assert not [line for line in lines if re.search(r"\bissue \d+", line)]
