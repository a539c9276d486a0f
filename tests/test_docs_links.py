"""Every relative link in the README, benchmarks/ and docs/ points at a file that exists, and
every #anchor into a Markdown file at one of its headings (GitHub's slugs): a newcomer's two
clicks from the README to a benchmark and its figure never land on nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    out: set[str] = set()
    in_code = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/**/*.md")]


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_reaches_a_benchmark_and_a_figure_in_two_clicks():
    readme = (ROOT / "README.md").read_text()
    assert "docs/performance.md" in readme and "benchmarks/README.md" in readme
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = set(re.findall(r"`((?:served|engine|kernels|quality|simulation|gpu)/[\w.]+)`", index))
    on_disk = {
        str(p.relative_to(ROOT / "benchmarks"))
        for p in (ROOT / "benchmarks").glob("*/*")
        if p.suffix in (".py", ".sh") and p.parent.name != "peers"
    }
    assert on_disk <= scripts, f"not in benchmarks/README.md: {sorted(on_disk - scripts)}"
    assert scripts <= on_disk, f"listed but missing: {sorted(scripts - on_disk)}"
