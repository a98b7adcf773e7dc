"""Rewrite the sample outputs of README.md and docs/ from the commands that print them.

    python tools/doc_samples.py            run every sample's command and rewrite its block
    python tools/doc_samples.py --check    exit 1, naming each sample that is not what its command
                                           prints now (tests/repository/test_doc_samples.py runs this check)
    python tools/doc_samples.py --page docs/planning.md     only that page's samples

A sample is the fenced block right after a mark that names its command (an HTML comment, which
Markdown hides):

    <!-- sample: mpirun -n 8 python -m zerompi.train -->
    <!-- sample lines=1-5,17-19,...,34-35 mask=rss: mpirun -n 8 python -m zerompi.train -->
    <!-- sample exit=2 mask=available: ulimit -v 3000000; mpirun -n 4 python -m zerompi.train ... -->
    <!-- sample cluster=2x2 lines=1,...,20-24: python -m zerompi.train --stage 3 -->

The command runs under bash in a scratch copy of the repository (its git-tracked files), stdout
and stderr together as a terminal shows them, with this environment's python and mpirun first on
PATH, and must exit with exit= (0 by default). lines= keeps those lines of the output (1-based,
ranges a-b), `...` standing for left-out lines (written "...", indented as the line above it);
without lines= the whole output is the sample. cluster=KxL runs the command on K nodes of L ranks
of an emulated cluster (tools/emulated_cluster.py, as root; number --cluster), brought up for it
and taken down after. A mark that is not followed by its block is an error, not a sample skipped.

What the check compares: the page's sample and a fresh run's, both with what depends on the
machine masked: times (a number and its unit; "/step" and the words around stay), the training's
loss, accuracy, gradient norm and --quant-error's errors; with mask=rss the resident memory at the end of a line (the
report's peak RSS), with mask=available the memory a refusal found available and the stages it
names as fitting in it, with mask=here the dry run's verdict on this machine (its paragraph).
Everything else must be equal: counts, bytes, formulas, headers and table layouts. Benchmark
tables are measurements of a machine on a date, not samples: they carry no mark and stay as
measured.
"""
import argparse
import os
import re
import shlex
import shutil
import signal
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
    "time": re.compile(r"\s*\b\d+(?:\.\d+)? *(?:ms|us|µs|s)\b|\s*\b\d+:\d\d\b"),
    "training": re.compile(r"(?<=loss )[\d.e+-]+|(?<=acc )[\d.]+%|(?<=\|g\| )[\d.e+-]+|(?<=accuracy )[\d.]+%"
                           r"|(?<=weights )[\d.]+% \([\d.]+%\)|(?<=gradients )[\d.]+% \([\d.]+%\)"),   # --quant-error
    "rss": re.compile(r"\s*\b\d+(?:\.\d+)? [kMG]B$", re.MULTILINE),
    "available": re.compile(r"\s*\b\d+(?:\.\d+)? [kMGT]B(?= available)|(?<=already\): ).*?(?= fits? on )"),
    "here": re.compile(r"(?<=^here, ).*(?:\n.+)*", re.MULTILINE),       # the verdict, to its blank line
}
ALWAYS = ("time", "training")
OPTIONS = {"lines", "mask", "cluster", "exit"}


class Sample:
    """One marked block: its page, the line of its mark, its options, command and text."""

    def __init__(self, page, line, options, command, text, indent=""):
        self.page, self.line, self.command, self.text, self.indent = page, line, command, text, indent
        self.options = dict(option.split("=", 1) for option in options.split())
        unknown = set(self.options) - OPTIONS
        if unknown or not set(self.masks) <= set(MASKS):
            raise ValueError(f"{page}:{line}: unknown sample options {sorted(unknown)} or masks {self.masks}")

    @property
    def masks(self):
        return [*ALWAYS, *filter(None, self.options.get("mask", "").split(","))]

    @property
    def exit_status(self):
        return int(self.options.get("exit", 0))

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
            if not 1 <= int(first) <= int(last or first) <= len(lines):
                raise ValueError(f"{self.name()}: lines {part} of an output of {len(lines)} lines")
            kept += lines[int(first) - 1:int(last or first)]
        return "\n".join(kept)

    def masked(self, text):
        for name in self.masks:
            text = MASKS[name].sub(" ~" if name not in ("training", "here") else "~", text)
        return text


def samples(page, text):
    """The Samples of a page's text; ValueError for a mark without its block."""
    lines, found = text.split("\n"), []
    for i, line in enumerate(lines):
        if not re.search(r"<!--\s*sample", line):
            continue
        mark = MARK.fullmatch(line.strip())
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        if not mark or fence.strip() != "```":
            raise ValueError(f"{page}:{i + 1}: a sample mark must read <!-- sample [options]: COMMAND --> and stand "
                             f"on the line before a bare ``` fence")
        indent = fence[:len(fence) - len(fence.lstrip())]
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        body = [row[len(indent):] if row.startswith(indent) else row for row in lines[i + 2:end]]
        found.append(Sample(page, i + 1, mark.group(1), mark.group(2), "\n".join(body), indent))
    return found


def run(script, folder, timeout=TIMEOUT):
    """(exit status, what it printed: stdout and stderr together) of a bash script run in folder;
    whatever it left running (mpirun, its ranks) is ended with its process group."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("PYTHONPATH", None)
    process = subprocess.Popen(["bash", "-c", script], cwd=folder, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return process.returncode, output


def fresh(sample, folder, cluster=0):
    """The sample as its command prints it now (on emulated cluster number `cluster`, for a
    sample that asks for one); RuntimeError if the command's exit status is not the sample's."""
    command = sample.command
    if "cluster" in sample.options:
        nodes, ppn = sample.options["cluster"].split("x")
        tool = shlex.join([sys.executable, os.path.join("tools", "emulated_cluster.py"), "--cluster", str(cluster)])
        command = (f"{tool} down >/dev/null 2>&1; {tool} up --nodes {nodes} >/dev/null || exit 99; "
                   f"trap '{tool} down >/dev/null 2>&1' EXIT; {tool} mpiexec --ppn {ppn} -- {command}")
    status, output = run(command, folder)
    if status != sample.exit_status:
        raise RuntimeError(f"{sample.name()}: `{sample.command}` exited {status}, the sample says "
                           f"{sample.exit_status}:\n{output[-3000:]}")
    return sample.select(output)


def scratch_copy(parent):
    """A copy of the repository under parent: its git-tracked files (not what following the docs
    left in the checkout), or without git everything but environments and outputs."""
    copy = os.path.join(parent, "zerompi")
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True) \
        if shutil.which("git") and os.path.exists(os.path.join(ROOT, ".git")) else None
    if listed is None or listed.returncode != 0:
        shutil.copytree(ROOT, copy, ignore=LEFT_OUT, symlinks=True)
        return copy
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, target = os.path.join(ROOT, name), os.path.join(copy, name)
        if os.path.lexists(source):                       # a tracked file deleted in the working tree: left out
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return copy


def rewritten(text, sample, now):
    """The page's text with the sample's block replaced by `now` (indented as the fence)."""
    lines = text.split("\n")
    start = sample.line + 1                               # the first line after the opening fence
    end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
    return "\n".join(lines[:start] + [sample.indent + row if row else row for row in now.split("\n")] + lines[end:])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of rewriting; exit 1 on a difference")
    parser.add_argument("--page", action="append", help="only this page (repeatable)")
    parser.add_argument("--cluster", type=int, default=40, help="the emulated cluster's number for the samples "
                        "that need one (tools/emulated_cluster.py --cluster; default 40, out of the docs' way)")
    args = parser.parse_args(argv)
    stale = []
    with tempfile.TemporaryDirectory() as parent:
        folder = scratch_copy(parent)
        for page in args.page or PAGES:
            path = os.path.join(ROOT, page)
            with open(path, newline="") as f:
                text = f.read()
            for sample in reversed(samples(page, text)):          # from the end: line numbers hold
                now = fresh(sample, folder, args.cluster)
                if sample.masked(now) != sample.masked(sample.text):
                    stale.append(sample.name())
                text = rewritten(text, sample, now)
            if not args.check:
                with open(path, "w", newline="") as f:
                    f.write(text)
    for name in stale:
        print(f"doc_samples: {name} is not what its command prints now"
              + ("" if not args.check else ": python tools/doc_samples.py rewrites it"))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
