"""Helpers shared by the benchmark report writers (bench/report.py, bench/server_report.py):
reading result JSON, running a command for a machine fact, the CPU model, number formatting."""
import json
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


def cpu_model():
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fmt(x, digits=1):
    return "n/a" if x is None else f"{x:.{digits}f}"
