"""The sample outputs of README.md and docs/ are what their commands print now (tools/doc_samples.py):
counts, bytes, formulas, headers and layouts exactly, with times, losses, accuracies and the
machine's memory masked. A stale sample fails here, naming the command that rewrites it."""
import os
import sys

import pytest

from support.cluster import require_cluster, spare_number

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import doc_samples  # noqa: E402

ALL = [sample for page in doc_samples.PAGES
       for sample in doc_samples.samples(page, open(os.path.join(doc_samples.ROOT, page)).read())]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return doc_samples.scratch_copy(str(tmp_path_factory.mktemp("samples")))


def test_a_mark_without_its_block_is_an_error_not_a_sample_skipped():
    for text in ("<!-- sample: true -->\n\n```\nx\n```", "<!--sample: true -->\n```\nx\n```",
                 "<!-- sample true -->\n```\nx\n```", "<!-- sample: true -->\n```text\nx\n```"):
        with pytest.raises(ValueError, match="a sample mark must read"):
            doc_samples.samples("p.md", text)
    page = "- item\n\n  <!-- sample: echo a -->\n  ```\n  a\n  ```\n"
    (indented,) = doc_samples.samples("p.md", page)                 # inside a list item: its indent kept
    assert indented.text == "a" and indented.line == 3
    assert doc_samples.rewritten(page, indented, "b\nc") == "- item\n\n  <!-- sample: echo a -->\n  ```\n  b\n  c\n  ```\n"


def test_every_page_that_shows_the_run_has_samples():
    pages = {sample.page for sample in ALL}
    assert {"README.md", "docs/theory.md", "docs/planning.md", "docs/multi-node.md", "docs/observability.md"} <= pages


def test_the_check_masks_the_machine_and_nothing_else():
    sample = doc_samples.Sample("p.md", 1, "lines=1,...,3 mask=rss", "true", "")
    assert sample.masked("4.59 ms/step") != sample.masked("4.59 ms")            # a unit's words stay
    output = "step  25/300  loss 2.055  acc 49.0%  |g| 0.284  lr 3.0e-3  4.59 ms/step  0:00\nx\n" \
             "   0    13.06 kB    87.28 kB   64.95 MB"
    assert sample.select(output) == "step  25/300  loss 2.055  acc 49.0%  |g| 0.284  lr 3.0e-3  4.59 ms/step  0:00\n" \
                                    "...\n   0    13.06 kB    87.28 kB   64.95 MB"
    elsewhere = output.replace("2.055", "2.1").replace("4.59 ms", "887 us").replace("0:00", "1:07") \
        .replace("64.95 MB", "166.2 MB")
    assert sample.masked(elsewhere) == sample.masked(output)
    for stale in (output.replace("25/300", "25/200"), output.replace("3.0e-3", "3.1e-3"),
                  output.replace("87.28 kB", "174.5 kB"), output.replace("  lr", " lr")):
        assert sample.masked(stale) != sample.masked(output), stale


@pytest.mark.timeout(doc_samples.TIMEOUT + 120)
@pytest.mark.parametrize("sample", ALL, ids=[sample.name() for sample in ALL])
def test_the_sample_is_what_its_command_prints(sample, folder):
    if "cluster" in sample.options:
        require_cluster()
    now = doc_samples.fresh(sample, folder, spare_number())
    assert sample.masked(now) == sample.masked(sample.text), (
        f"{sample.name()} is stale (python tools/doc_samples.py rewrites it):\n--- the page\n{sample.text}\n"
        f"--- `{sample.command}` now\n{now}")
