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
    """The CPU's model name with its family/model numbers and the vector ISA the kernels can use
    (a VM's model name alone, e.g. "AMD EPYC", does not tell a Zen 1 from a Zen 4)."""
    fields = {}
    for line in sh(["lscpu"]).splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    name = fields.get("Model name", "unknown")
    flags = set(fields.get("Flags", "").split())
    if "avx512f" in flags:
        extras = [f for f in ("avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags]
        isa = "AVX-512" + (" (" + ", ".join(extras) + ")" if extras else "")
    elif "avx2" in flags:
        isa = "AVX2, no AVX-512"
    else:
        isa = "no AVX2"
    family, model = fields.get("CPU family"), fields.get("Model")
    where = f"family {family}, model {model}; " if family and model else ""
    return f"{name} ({where}{isa})"


def fmt(x, digits=1):
    return "n/a" if x is None else f"{x:.{digits}f}"
