"""Helpers shared by the benchmark report writers (bench/report.py, bench/server_report.py):
reading result JSON, running a command for a machine fact, the CPU model, number formatting."""
import json
import os
import subprocess


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def commit_of_binary():
    """The cinfer commit the report names: $CINFER_COMMIT when set (a binary built from another
    checkout, e.g. a git worktree of an older commit), else this checkout's HEAD, flagged when
    tracked files differ from it."""
    if os.environ.get("CINFER_COMMIT"):
        return os.environ["CINFER_COMMIT"]
    commit = sh(["git", "rev-parse", "--short=12", "HEAD"])
    if sh(["git", "status", "--porcelain", "--untracked-files=no"]) not in ("", "unknown"):
        commit += " (with uncommitted changes)"
    return commit


def cpu_model():
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fmt(x, digits=1):
    return "n/a" if x is None else f"{x:.{digits}f}"
