"""No tracked file names a path that exists on one machine only.

A test that runs code at one machine's checkout tests that checkout, not this one; a doc that says
"see <a home folder>/..." is true on one desk. The rule, over every tracked text file (git ls-files):

    refused   an absolute path whose first folder is a home or per-user or per-machine folder:
              home, Users, root, work, tmp (as a path: the folder itself or a path below it);
              and this checkout's own absolute path, and the home folder of whoever runs the test
    allowed   every other absolute path: the standard system ones a program or a doc may name
              (the Slurm and munge configuration under etc, proc's self, dev's shm, usr's bin/env in
              shebangs, sys's cgroup files) and paths inside a URL (after "scheme://host")

An absolute path starts at the beginning of a line or after a character that cannot be part of a
path (whitespace, quotes, brackets, =, :, a comma), so "a/home/b" and "https://host/home/x" are
not paths of this machine.
"""
import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MACHINE_FOLDERS = ("home", "Users", "root", "work", "tmp")
BEFORE_A_PATH = r"(?:^|(?<=[\s\"'`(\[{<=:,;|>]))"
MACHINE_PATH = re.compile(BEFORE_A_PATH + r"/(?:" + "|".join(MACHINE_FOLDERS) + r")(?=/|$|[\s\"'`)\]}>,;:])",
                          re.MULTILINE)


def own_paths():
    """This checkout's absolute path and the user's home folder (where they are not '/')."""
    return sorted({p for p in (ROOT, os.path.realpath(ROOT), os.path.expanduser("~")) if len(p) > 1})


def path_pattern(path):
    """An absolute path as a whole path (not the start of a longer folder name)."""
    return re.compile(BEFORE_A_PATH + re.escape(path) + r"(?=/|$|[\s\"'`)\]}>,;:])", re.MULTILINE)


def offenders(text, own=()):
    """[(line number, the line), ...] naming a machine's path (own: further absolute paths refused)."""
    patterns = [MACHINE_PATH] + [path_pattern(path) for path in own]
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)
            if any(pattern.search(line) for pattern in patterns)]


def tracked_text_files():
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (or no git): nothing is tracked")
    for name in listing.decode().split("\0"):
        path = os.path.join(ROOT, name)
        if name and os.path.isfile(path):
            with open(path, "rb") as f:
                data = f.read()
            if b"\0" not in data:                    # text only (figures are binary)
                yield name, data.decode("utf-8", errors="replace")


def test_no_tracked_file_names_a_machine_path():
    own = own_paths()
    found = [f"{name}:{number}: {line}" for name, text in tracked_text_files()
             for number, line in offenders(text, own)]
    assert found == [], "absolute paths of one machine in tracked files:\n" + "\n".join(found)


def test_the_rule_refuses_machine_paths_and_allows_system_paths():
    slash = "/"                           # built here, so that this file does not name them itself
    refused = [f"cd {slash}home{slash}alice{slash}zerompi", f'REPO = "{slash}Users{slash}bob{slash}src"',
               f"see {slash}root{slash}.cache", f"--data={slash}work{slash}data.npz",
               f"--json {slash}tmp{slash}step.json", f"({slash}tmp)", f"{slash}work{slash}main{slash}README.md"]
    allowed = ["#!/usr/bin/env python3", "SlurmctldPidFile=/run/slurmctld.pid", "/etc/slurm/slurm.conf",
               "open('/proc/self/status')", "/dev/shm", "/sys/fs/cgroup/memory.max", "~/.cache/zerompi",
               "tests/home/x", "https://example.org/home/x", "ranks/tmp/x", "a /homework folder"]
    assert all(offenders(line) for line in refused), [line for line in refused if not offenders(line)]
    assert not any(offenders(line) for line in allowed), [line for line in allowed if offenders(line)]
    assert offenders("cd " + ROOT, own_paths())           # this checkout, wherever it is
    assert offenders(f"cd {slash}opt{slash}ci{slash}zerompi", [f"{slash}opt{slash}ci{slash}zerompi"])
    assert not offenders(f"cd {slash}opt{slash}ci{slash}zerompi2", [f"{slash}opt{slash}ci{slash}zerompi"])
