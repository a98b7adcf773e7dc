"""Every shell block of README.md, docs/ and benchmarks/README.md is run here, and exits as its page
says; or it says why this machine cannot run it.

The mark: an HTML comment on the line just before the block's fence (Markdown hides it).

    <!-- run -->                            run the block; it exits 0
    <!-- run exit=2 -->                     ... it exits 2 (a page that shows a refusal)
    <!-- run shorten=--steps,--save-every -->   for time, these flags' values (only these) are
                                            divided by SHORTEN (rounded up) before it runs
    <!-- not run: REASON -->                what this machine cannot do: a GPU, a site's modules, a
                                            real cluster, the suite itself; listed as a skip, with
                                            the reason

The blocks of a page run in the page's order, each as one `bash -e -o pipefail` script, in one
scratch copy of the repository per page (what a user who follows the page from a checkout has),
with this environment's python and mpirun first on PATH. A `sh` block without a mark fails. A
block that redraws docs/figures/ is checked through the data it plots: each figure's data file
(examples/zerompi_runs.py) must agree with the repository's, within the tolerance the file gives.
"""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from zerompi_runs import same_data  # noqa: E402
PAGES = ["README.md", "benchmarks/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
MARK = re.compile(r"<!-- (run(?: [^>]*)?|not run: [^>]+) -->")
SHORTEN = 50
BLOCK_TIMEOUT = 600
LEFT_OUT = shutil.ignore_patterns(".git", ".venv*", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache")


def blocks(page, text):
    """[(page, line, mark or None, body)] of each ```sh block of the page's text."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip() == "```sh":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            found.append((page, i + 1, mark.group(1) if mark else None, "\n".join(lines[i + 1:end])))
    return found


def parse_mark(mark):
    """('run', exit status, flags to shorten) or ('not run', reason, ())."""
    if mark.startswith("not run: "):
        return "not run", mark[len("not run: "):], ()
    words = dict(word.split("=", 1) for word in mark.split()[1:])
    if set(words) - {"exit", "shorten"}:
        raise ValueError(f"unknown words in <!-- {mark} -->")
    return "run", int(words.get("exit", 0)), tuple(filter(None, words.get("shorten", "").split(",")))


def shortened(body, flags):
    """The block with each value of the named flags divided by SHORTEN, rounded up."""
    for flag in flags:
        body = re.sub(rf"(?<!\S){re.escape(flag)}([ =])(\d+)\b",
                      lambda m: f"{flag}{m.group(1)}{math.ceil(int(m.group(2)) / SHORTEN)}", body)
    return body


ALL = [block for page in PAGES for block in blocks(page, open(os.path.join(ROOT, page)).read())]


def test_every_shell_block_is_marked():
    unmarked = [f"{page}:{line}" for page, line, mark, _ in ALL if mark is None]
    assert unmarked == [], f"sh blocks without <!-- run --> or <!-- not run: ... -->: {unmarked}"
    for _, _, mark, _ in ALL:
        parse_mark(mark)


def test_the_marks_read_as_written():
    text = "x\n<!-- run shorten=--steps -->\n```sh\nrun --steps 1000 --save-every 100 --steps=7\n```\n" \
           "<!-- not run: needs a GPU -->\n```sh\ngpu\n```\n```sh\nbare\n```\n"
    found = blocks("p.md", text)
    assert [(line, mark) for _, line, mark, _ in found] == [(3, "run shorten=--steps"), (7, "not run: needs a GPU"),
                                                           (10, None)]
    assert parse_mark(found[0][2]) == ("run", 0, ("--steps",)) and parse_mark("run exit=2") == ("run", 2, ())
    assert parse_mark(found[1][2]) == ("not run", "needs a GPU", ())
    assert shortened(found[0][3], ("--steps",)) == "run --steps 20 --save-every 100 --steps=1"
    with pytest.raises(ValueError):
        parse_mark("run steps=5")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """{page: its scratch copy of the repository}, made on first use."""
    copies = {}

    def copy_for(page):
        if page not in copies:
            copies[page] = tmp_path_factory.mktemp(page.replace("/", "-")) / "zerompi"
            shutil.copytree(ROOT, copies[page], ignore=LEFT_OUT, symlinks=True)
        return copies[page]
    return copy_for


@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("page, line, mark, body", ALL, ids=[f"{page}:{line}" for page, line, _, _ in ALL])
def test_the_block_runs_as_its_page_says(page, line, mark, body, scratch):
    kind, expected, flags = parse_mark(mark)
    if kind == "not run":
        pytest.skip(f"not run ({page}:{line}): {expected}")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("PYTHONPATH", None)
    script = "set -e -o pipefail\n" + shortened(body, flags)
    process = subprocess.Popen(["bash", "-c", script], cwd=scratch(page), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)          # what the block left running: mpirun, its ranks
        except ProcessLookupError:
            pass
    assert process.returncode == expected, (f"{page}:{line} exited {process.returncode}, the page says {expected}:"
                                            f"\n{script}\n--- stdout\n{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}")
    for figure in re.findall(r"docs/figures/[\w-]+\.png", body):     # redrawn: the data it plots agrees
        data = os.path.splitext(figure)[0] + ".json"
        with open(os.path.join(ROOT, data)) as kept, open(os.path.join(scratch(page), data)) as redrawn:
            assert same_data(json.load(kept), json.load(redrawn)), f"{data}: the redrawn figure plots other data"


def test_figure_data_agree_within_their_tolerance_only():
    memory = {"command": "c", "date": "d", "tolerance": 0.0, "data": {"stage 1": [{"ranks": 2, "bytes": 1000}]}}
    loss = {"command": "c", "date": "e", "tolerance": 1e-3, "data": {"stage 0": [2.0, 1.5]}}
    assert same_data(memory, dict(memory, date="another day"))
    assert not same_data(memory, dict(memory, data={"stage 1": [{"ranks": 2, "bytes": 1001}]}))
    assert same_data(loss, dict(loss, data={"stage 0": [2.0005, 1.5]}))
    assert not same_data(loss, dict(loss, data={"stage 0": [2.01, 1.5]}))
    assert not same_data(loss, dict(loss, data={"stage 0": [2.0]}))
