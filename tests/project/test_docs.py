"""What a reader meets first: the README stays a short read, its links lead somewhere, and neither it nor the
docs, the evidence pages, the params files' comments or the library speak about how the project was made
("this session", "the next wave") instead of what it is. A measurement keeps its machine and date as facts."""

from __future__ import annotations

import re

import pytest
import yaml

from fedrepro.configure.paramsfile import ROOT

# Words about how the project was made. "wave" alone stays allowed: `fedrepro bench` counts "waves" of runs
# side by side on a device (ceil(runs / runs per device)), a technical term.
MAKING = re.compile(
    r"\bsessions?\b|\b(?:this|that|next|first|second|third|later|earlier|previous|last|the) waves?\b"
    r"|\bthis stop\b|\bissues? #?\d+\b",
    re.I,
)


def _places():
    """README, CITATION.cff, docs/, the evidence pages, params files, tests/README.md and the library's code and
    fragments. The params files evidence folders kept are records of what ran, as it ran: not read."""
    yield ROOT / "README.md"
    yield ROOT / "CITATION.cff"
    yield ROOT / "tests" / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield from sorted((ROOT / "evidence").rglob("*.md"))
    yield from sorted((ROOT / "params").rglob("*.yaml"))
    for ext in ("*.py", "*.yaml"):
        yield from sorted((ROOT / "src" / "fedrepro").rglob(ext))


def making_words(text: str) -> list[str]:
    return [m.group(0) for m in MAKING.finditer(text)]


def test_no_words_about_how_the_project_was_made():
    found = []
    for path in _places():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for word in making_words(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {word!r} in {line.strip()[:100]}")
    assert not found, (
        "say what the project is, not how it was made (a measurement keeps its machine and date):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ("measured on this session's AMD EPYC", ["session"]),
        ("this wave's later runs ran at 54b37cc", ["this wave"]),
        ("the next session's code", ["session"]),
        ("Sessions differ", ["Sessions"]),
        ("see issue #13 and issue 18", ["issue #13", "issue 18"]),
        ("at this stop the grid was half done", ["this stop"]),
        ("ceil(96 runs / 4 per device) = 24 waves x 300 rounds", []),
        ("measured on an AMD EPYC, 2 cores, torch 2.15 (2026-11-26)", []),
    ],
)
def test_the_check_finds_the_words_it_names(text, words):
    assert making_words(text) == words


def test_the_readme_is_a_five_minute_read():
    assert len((ROOT / "README.md").read_bytes()) < 12 * 1024


def test_every_relative_link_of_the_readme_and_the_docs_leads_to_a_file():
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in link.findall(page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def test_the_readme_names_a_page_for_each_paper_and_the_citation_file_cites_the_four_papers():
    readme = (ROOT / "README.md").read_text()
    for paper in ("fedaware", "fedlaw", "ima", "fednova"):
        assert (ROOT / "docs" / "papers" / f"{paper}.md").is_file()
        assert f"docs/papers/{paper}.md" in readme
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    assert {"message", "title", "authors"} <= set(cff)
    titles = " ".join(r["title"] for r in cff["references"])
    for words in (
        "Adaptive Weighted Aggregation",
        "Revisiting Weighted Aggregation",
        "Model Averaging",
        "Objective Inconsistency",
    ):
        assert words in titles


def test_tests_readme_maps_every_module_to_test_files_that_exist():
    """tests/README.md names each module of src/fedrepro (a package by its folder) and only test files that
    exist."""
    text = (ROOT / "tests" / "README.md").read_text()
    src = ROOT / "src" / "fedrepro"
    modules = {p.stem for p in src.glob("*.py") if p.stem not in ("__init__", "__main__")}
    modules |= {p.name + "/" for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(m for m in modules if f"`{m}" not in text)
    assert not missing, f"tests/README.md does not map: {missing}"
    named = set(re.findall(r"`((?:\w+/)?test_\w+\.py)`", text))  # under its wing's folder, or not found
    assert named and all((ROOT / "tests" / n).is_file() for n in named), sorted(
        n for n in named if not (ROOT / "tests" / n).is_file()
    )


def test_tests_readme_names_every_folder_of_test_files():
    """The folder table of tests/README.md lists exactly the folders that hold test files: one per wing, none
    at the top."""
    text = (ROOT / "tests" / "README.md").read_text()
    table = text.split("## Folders", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)/` \|", table, re.M))
    holding = {p.parent.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert listed == holding, f"listed, no test files: {sorted(listed - holding)}; unlisted: {sorted(holding - listed)}"
