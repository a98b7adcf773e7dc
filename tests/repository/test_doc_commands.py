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

The blocks of a page run in the page's order, each as one bash script that stops at its first
failing command (`set -e -o pipefail`), in one scratch copy of the repository per page (its
tracked files: what a user who follows the page from a checkout has; tools/doc_samples.py's
runner), with this environment's python and mpirun first on PATH. A `sh` block without a mark
fails. A block that redraws docs/figures/ is checked through the data it plots: each figure's
data file (examples/zerompi_runs.py), removed from the scratch copy before the block runs, must be
written again and agree with the repository's, within the tolerance the file gives.
"""
import json
import math
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tools")]
from doc_samples import run, scratch_copy  # noqa: E402
from zerompi_runs import same_data  # noqa: E402

PAGES = ["README.md", "benchmarks/README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
MARK = re.compile(r"<!-- (run(?: [^>]*)?|not run: [^>]+) -->")
SHORTEN = 10
BLOCK_TIMEOUT = 600
FIGURE = re.compile(r"docs/figures/[\w-]+\.png")


def blocks(page, text):
    """[(page, line, mark or None, body)] of each ```sh block of the page's text (indented too)."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip() == "```sh":
            indent = line[:len(line) - len(line.lstrip())]
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            mark = MARK.fullmatch(lines[i - 1].strip()) if i else None
            body = [row[len(indent):] if row.startswith(indent) else row for row in lines[i + 1:end]]
            found.append((page, i + 1, mark.group(1) if mark else None, "\n".join(body)))
    return found


def parse_mark(mark):
    """('run', exit status, flags to shorten) or ('not run', reason, ())."""
    if mark.startswith("not run: "):
        return "not run", mark[len("not run: "):], ()
    words = mark.split()[1:]
    pairs = [word.split("=", 1) for word in words]
    keys = [pair[0] for pair in pairs]
    if any(len(pair) != 2 for pair in pairs) or set(keys) - {"exit", "shorten"} or len(set(keys)) < len(keys):
        raise ValueError(f"<!-- {mark} -->: a run mark takes exit=N and shorten=--flag[,--flag], once each")
    words = dict(pairs)
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
           "<!-- not run: needs a GPU -->\n```sh\ngpu\n```\n```sh\nbare\n```\n" \
           "- item\n\n  <!-- run -->\n  ```sh\n  indented\n  ```\n  prose\n"
    found = blocks("p.md", text)
    assert [(line, mark, body) for _, line, mark, body in found] == [
        (3, "run shorten=--steps", "run --steps 1000 --save-every 100 --steps=7"), (7, "not run: needs a GPU", "gpu"),
        (10, None, "bare"), (16, "run", "indented")]
    assert parse_mark(found[0][2]) == ("run", 0, ("--steps",)) and parse_mark("run exit=2") == ("run", 2, ())
    assert parse_mark(found[1][2]) == ("not run", "needs a GPU", ())
    assert shortened(found[0][3], ("--steps",)) == "run --steps 100 --save-every 100 --steps=1"
    for bad in ("run steps=5", "run exit", "run exit=1 exit=2"):
        with pytest.raises(ValueError, match="a run mark takes"):
            parse_mark(bad)


def test_figure_data_agree_within_their_tolerance_only():
    memory = {"command": "c", "date": "d", "tolerance": 0.0, "data": {"stage 1": [{"ranks": 2, "bytes": 1000}]}}
    loss = {"command": "c", "date": "e", "tolerance": 1e-3, "data": {"stage 0": [2.0, 1.5]}}
    assert same_data(memory, dict(memory, date="another day"))
    assert not same_data(memory, dict(memory, data={"stage 1": [{"ranks": 2, "bytes": 1001}]}))
    assert same_data(loss, dict(loss, data={"stage 0": [2.0005, 1.5]}))
    assert not same_data(loss, dict(loss, data={"stage 0": [2.01, 1.5]}))
    assert not same_data(loss, dict(loss, data={"stage 0": [2.0]}))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """{page: its scratch copy of the repository}, made on first use."""
    copies = {}

    def copy_for(page):
        if page not in copies:
            copies[page] = scratch_copy(str(tmp_path_factory.mktemp(page.replace("/", "-"))))
        return copies[page]
    return copy_for


@pytest.mark.timeout(BLOCK_TIMEOUT + 60)
@pytest.mark.parametrize("page, line, mark, body", ALL, ids=[f"{page}:{line}" for page, line, _, _ in ALL])
def test_the_block_runs_as_its_page_says(page, line, mark, body, scratch):
    kind, expected, flags = parse_mark(mark)
    if kind == "not run":
        pytest.skip(f"not run ({page}:{line}): {expected}")
    folder = scratch(page)
    data_files = [os.path.splitext(figure)[0] + ".json" for figure in FIGURE.findall(body)]
    for data in data_files:                               # redrawn, or the check would read the old one
        os.remove(os.path.join(folder, data))
    script = "set -e -o pipefail\n" + shortened(body, flags)
    status, output = run(script, folder, BLOCK_TIMEOUT)
    assert status == expected, f"{page}:{line} exited {status}, the page says {expected}:\n{script}\n---\n{output[-6000:]}"
    for data in data_files:
        with open(os.path.join(ROOT, data)) as kept, open(os.path.join(folder, data)) as redrawn:
            assert same_data(json.load(kept), json.load(redrawn)), f"{data}: the redrawn figure plots other data"
