"""The documentation site builds with `mkdocs build --strict`, and its runnable code blocks run.

A code block is runnable when the line right before its fence is `<!-- runnable -->`. Only
Getting started and the guides carry such blocks; each runs in a fresh process, in an empty
directory of its own, and must exit 0 within BLOCK_TIMEOUT_S. Python blocks that need a
cluster start one themselves (walkit.LocalCluster, or a server subprocess) and stop it. A line
`--8<-- "path"` (a pymdownx.snippets include) stands for the file it names, as on the site.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
#: The pages whose runnable blocks the suite runs.
RUNNABLE_PAGES = [DOCS / "getting-started.md", *sorted((DOCS / "guides").glob("*.md"))]
BLOCK_TIMEOUT_S = 90
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^(```+)(\w*)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$', re.MULTILINE)


def runnable_blocks(page: Path) -> list[tuple[str, str, int]]:
    """runnable_blocks returns (language, code, line) of each block of `page` marked runnable.

    A marker that is not followed by a fence, or a runnable block in a language this suite cannot
    run, raises ValueError: a marker must never be silently ignored.
    """
    text = page.read_text()
    blocks = []
    for match in re.finditer(re.escape(MARKER) + r"[ \t]*\n", text):
        line = text.count("\n", 0, match.start()) + 1
        fence = FENCE.match(text, match.end())
        if fence is None:
            raise ValueError(f"{page.relative_to(ROOT)}:{line}: {MARKER} is not followed by a code block")
        language = fence.group(2)
        if language not in ("python", "sh"):
            raise ValueError(f"{page.relative_to(ROOT)}:{line}: runnable blocks are python or sh, not {language!r}")
        code = SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(), fence.group(3))
        blocks.append((language, code, line))
    return blocks


def _cases() -> list:
    cases = []
    for page in RUNNABLE_PAGES:
        for language, code, line in runnable_blocks(page):
            name = f"{page.relative_to(DOCS)}:{line}"
            cases.append(pytest.param(language, code, id=name))
    return cases


CITATION = re.compile(r"\b(docs/[\w./-]+\.md)(?:#([\w-]+))?")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """site is the documentation built once with `mkdocs build --strict` (a broken link or anchor fails it)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    path = tmp_path_factory.mktemp("site")
    cwd = os.getcwd()
    os.chdir(ROOT)                      # pymdownx.snippets resolves includes from the working directory
    try:
        build(load_config(config_file=str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(path)))
    finally:
        os.chdir(cwd)
    return path


def test_the_site_builds_strict(site):
    """The strict build succeeded and the generated references are in it."""
    cli = (site / "operations" / "cli" / "index.html").read_text()
    assert "walkit kv serve" in cli and "--snapshot-every" in cli
    config = (site / "operations" / "configuration" / "index.html").read_text()
    assert 'id="group_wait_ms"' in config and "journalMaxGroupWaitMSec" in config
    for page in site.rglob("*.html"):
        assert "<!-- walkit:" not in page.read_text(), f"{page}: a generated part was left unreplaced"


def test_the_code_cites_pages_and_anchors_that_exist(site):
    """Every `docs/<page>.md#<anchor>` in a comment or docstring names a page of the site and an anchor on it."""
    cited = 0
    for folder in ("walkit", "adapters", "plugins", "tests", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for page, anchor in CITATION.findall(line):
                    where = f"{path.relative_to(ROOT)}:{number}"
                    source = ROOT / page
                    assert source.is_file(), f"{where} cites {page}, which does not exist"
                    if anchor:
                        built = site / Path(page).relative_to("docs").with_suffix("") / "index.html"
                        assert f'id="{anchor}"' in built.read_text(), f"{where} cites {page}#{anchor}: no such anchor"
                    cited += 1
    assert cited >= 50


def test_runnable_markers_mark_code_blocks():
    """Every runnable marker of the runnable pages stands right before a python or sh block."""
    total = sum(len(runnable_blocks(page)) for page in RUNNABLE_PAGES)
    assert total >= 8
    others = [p for p in DOCS.rglob("*.md") if p not in RUNNABLE_PAGES and MARKER in p.read_text()]
    assert others == [], f"runnable blocks outside Getting started and the guides are not run: {others}"


@pytest.mark.slow
@pytest.mark.parametrize("language, code", _cases())
def test_runnable_block_runs(language, code, tmp_path):
    """A runnable block exits 0 in a fresh process, in an empty directory, within the timeout."""
    command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WALKIT_METADATA", None)     # blocks name their own cluster
    try:
        result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                                timeout=BLOCK_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the block ran over {BLOCK_TIMEOUT_S} s; output so far:\n{exc.stdout}\n{exc.stderr}")
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
