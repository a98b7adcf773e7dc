"""Rewrite the sample outputs of README.md and docs/ from the commands that print them.

    python tools/doc_samples.py            run every sample's command and rewrite its block
    python tools/doc_samples.py --check    exit 1, naming each sample that is not what its command
                                           prints now (tests/test_doc_samples.py runs this check)
    python tools/doc_samples.py --page docs/planning.md     only that page's samples

A sample is the fenced block right after a mark that names its command (an HTML comment, which
Markdown hides):

    <!-- sample: mpirun -n 8 python -m zerompi.train -->
    <!-- sample lines=1-5,17-19,...,34-35 mask=rss: mpirun -n 8 python -m zerompi.train -->
    <!-- sample cluster=2x2 lines=1,...,20-24: python -m zerompi.train --stage 3 -->

The command runs under bash in a scratch copy of the repository, stdout and stderr together as a
terminal shows them, with this environment's python and mpirun first on PATH; its exit status is
not a sample's business (a refusal is a sample too). lines= keeps those lines of the output
(1-based, ranges a-b), `...` standing for left-out lines (written "...", indented as the line
above it); without lines= the whole output is the sample. cluster=KxL runs the command on K nodes
of L ranks of an emulated cluster (tools/emulated_cluster.py, as root; number --cluster), brought
up for it and taken down after.

What the check compares: the page's sample and a fresh run's, both with what depends on the
machine masked: times (ms, us, s, ms/step, m:ss), the training's loss, accuracy and gradient norm,
with mask=rss the resident memory at the end of a line (the report's peak RSS), with
mask=available the memory a refusal found available, with mask=here the dry run's verdict on
this machine. Everything
else must be equal: counts, bytes, formulas, headers and table layouts. Benchmark tables are
measurements of a machine on a date, not samples: they carry no mark and stay as measured.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                               if name.endswith(".md"))
MARK = re.compile(r"<!-- sample((?: \w+=\S+)*): (.+) -->")
TIMEOUT = 600
LEFT_OUT = shutil.ignore_patterns(".git", ".venv*", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache")
MASKS = {                                   # name: what varies with the machine (always, or where asked)
    "time": re.compile(r"\s*\b\d+(?:\.\d+)? *(?:ms|us|µs|s)\b(?:/step)?|\s*\b\d+:\d\d\b"),
    "training": re.compile(r"(?<=loss )[\d.e+-]+|(?<=acc )[\d.]+%|(?<=\|g\| )[\d.e+-]+|(?<=accuracy )[\d.]+%"),
    "rss": re.compile(r"\s*\b\d+(?:\.\d+)? [kMG]B$", re.MULTILINE),
    "available": re.compile(r"\s*\b\d+(?:\.\d+)? [kMGT]B(?= available)"),
    "here": re.compile(r"(?<=^here, ).*(?:\n.*)?", re.MULTILINE),         # the dry run's verdict on this machine
}
ALWAYS = ("time", "training")


class Sample:
    """One marked block: its page, the line of its mark, its options, command and text."""

    def __init__(self, page, line, options, command, text):
        self.page, self.line, self.command, self.text = page, line, command, text
        self.options = dict(option.split("=", 1) for option in options.split())
        unknown = set(self.options) - {"lines", "mask", "cluster"}
        if unknown or not set(self.masks) <= set(MASKS):
            raise ValueError(f"{page}:{line}: unknown sample options {sorted(unknown)} or masks {self.masks}")

    @property
    def masks(self):
        return [*ALWAYS, *filter(None, self.options.get("mask", "").split(","))]

    def name(self):
        return f"{self.page}:{self.line}"

    def select(self, output):
        """The sample's lines of the command's output."""
        lines = output.rstrip("\n").split("\n")
        if "lines" not in self.options:
            return "\n".join(lines)
        kept = []
        for part in self.options["lines"].split(","):
            if part == "...":
                above = kept[-1] if kept else ""
                kept.append(above[:len(above) - len(above.lstrip())] + "...")
                continue
            first, _, last = part.partition("-")
            kept += lines[int(first) - 1:int(last or first)]
        return "\n".join(kept)

    def masked(self, text):
        for name in self.masks:
            text = MASKS[name].sub(" ~" if name != "training" else "~", text)
        return text


def samples(page, text):
    """The Samples of a page's text."""
    lines, found = text.split("\n"), []
    for i, line in enumerate(lines):
        mark = MARK.fullmatch(line.strip())
        if mark and i + 1 < len(lines) and lines[i + 1].strip() == "```":
            end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
            found.append(Sample(page, i + 1, mark.group(1), mark.group(2), "\n".join(lines[i + 2:end])))
    return found


def run(command, folder):
    """What the command prints, stdout and stderr together, run in folder."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("PYTHONPATH", None)
    result = subprocess.run(["bash", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT, start_new_session=True)
    return result.stdout


def fresh(sample, folder, cluster=0):
    """The sample as its command prints it now (on emulated cluster number `cluster`, for a
    sample that asks for one)."""
    if "cluster" not in sample.options:
        return sample.select(run(sample.command, folder))
    nodes, ppn = sample.options["cluster"].split("x")
    tool = [sys.executable, os.path.join("tools", "emulated_cluster.py"), "--cluster", str(cluster)]
    subprocess.run(tool + ["down"], cwd=folder, capture_output=True, timeout=TIMEOUT)   # an earlier one's
    try:
        up = subprocess.run(tool + ["up", "--nodes", nodes], cwd=folder, capture_output=True, text=True,
                            timeout=TIMEOUT)
        if up.returncode:
            raise RuntimeError(f"{sample.name()}: the emulated cluster did not come up: {up.stderr.strip()}")
        return sample.select(run(f"{shlex.join(tool)} mpiexec --ppn {ppn} -- {sample.command}", folder))
    finally:
        subprocess.run(tool + ["down"], cwd=folder, capture_output=True, timeout=TIMEOUT)


def scratch_copy(parent):
    """A copy of the repository (without its environments and outputs) under parent."""
    copy = os.path.join(parent, "zerompi")
    shutil.copytree(ROOT, copy, ignore=LEFT_OUT, symlinks=True)
    return copy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of rewriting; exit 1 on a difference")
    parser.add_argument("--page", action="append", help="only this page (repeatable)")
    parser.add_argument("--cluster", type=int, default=0, help="the emulated cluster's number for the samples "
                        "that need one (tools/emulated_cluster.py --cluster; default 0)")
    args = parser.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as parent:
        folder = scratch_copy(parent)
        for page in args.page or PAGES:
            path = os.path.join(ROOT, page)
            with open(path) as f:
                text = f.read()
            for sample in reversed(samples(page, text)):          # from the end: line numbers hold
                now = fresh(sample, folder, args.cluster)
                if args.check:
                    if sample.masked(now) != sample.masked(sample.text):
                        stale.append(sample.name())
                    continue
                lines = text.split("\n")
                start = sample.line + 1                           # the fence's line; the block after it
                end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
                text = "\n".join(lines[:start] + now.split("\n") + lines[end:])
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    for name in stale:
        print(f"doc_samples: {name} is not what its command prints now: python tools/doc_samples.py rewrites it")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
