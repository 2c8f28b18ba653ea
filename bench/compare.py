#!/usr/bin/env python3
"""Before/after comparison of two benchmark runs of different cinfer binaries (each run with its
own llama.cpp measurements), as a markdown section appended to a report.

  bench/compare.py cpu --before DIR --after DIR [options] --insert bench/cpu.md
      DIR: a results folder of bench/run.sh (bench/work/results, copied after the run);
      compares prefill and decode tok/s per model and dtype.
  bench/compare.py server --before DIR --after DIR --levels "16 64" [options] --insert bench/server.md
      DIR: a results folder of bench/server.sh (SERVER_WORK/results); compares output tok/s
      (and cinfer's TTFT / ITL / TPOT p50) per concurrency level, and the prefix-cache TTFTs when both have them.

Options: --title TEXT (the section heading), --before-commit / --after-commit (named in the
text), --command TEXT (repeatable: the commands that produced the runs, listed verbatim),
--note TEXT (repeatable: paragraphs after the tables). --insert FILE replaces the section with
the same heading in FILE, or appends it at the end; --out FILE writes the section alone."""

import argparse
import os
import re
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import TITLES, best, llama_medians, parse_pairs  # noqa: E402
from report_common import cpu_model, fmt, load  # noqa: E402
from server_report import get  # noqa: E402


def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def para(text):
    return textwrap.fill(" ".join(text.split()), 96, break_long_words=False,
                         break_on_hyphens=False)


def cpu_pairs(results):
    """[(model, cinfer dtype, gguf type)] found in a run.sh results folder."""
    out = []
    for model in sorted(os.listdir(results)):
        d = os.path.join(results, model)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            m = re.fullmatch(r"cinfer-(\w+)\.json", f)
            if m:
                gtype = {"bf16": "bf16", "q8": "q8_0", "q4": "q4_0"}.get(m.group(1), m.group(1))
                out.append((model, m.group(1), gtype))
    return out


def cpu_values(results, model, dtype, gtype, prompt, gen):
    c = load(os.path.join(results, model, f"cinfer-{dtype}.json")) or {}
    modes = llama_medians(load(os.path.join(results, model, f"llama-{gtype}.json")), prompt, gen)
    return (c.get("prefill_tok_s"), c.get("decode_tok_s"), best(modes, 0)[0], best(modes, 1)[0])


def cpu_section(a):
    order = ["llama1b", "gemma3-1b"]
    pairs = [p for p in cpu_pairs(a.after) if p in cpu_pairs(a.before)]
    dorder = ["bf16", "q8", "q4"]  # bench/run.sh's order
    pairs.sort(key=lambda p: (order.index(p[0]) if p[0] in order else 99, p[0],
                              dorder.index(p[1]) if p[1] in dorder else 99))
    tables = []
    for i, what in ((0, "Prefill"), (1, "Decode")):
        rows = [f"### {what} tok/s ({a.prompt}-token prompt)" if i == 0 else
                f"### {what} tok/s ({a.gen} generated tokens)", "",
                "| model | dtype (cinfer / llama.cpp) | cinfer before | cinfer after | "
                "after / before | llama.cpp (before run) | llama.cpp (after run) | "
                "cinfer / llama.cpp before | cinfer / llama.cpp after |",
                "|---|---|---|---|---|---|---|---|---|"]
        for model, dtype, gtype in pairs:
            b = cpu_values(a.before, model, dtype, gtype, a.prompt, a.gen)
            f = cpu_values(a.after, model, dtype, gtype, a.prompt, a.gen)
            rows.append(f"| {TITLES.get(model, model)} | {dtype} / {gtype} | {fmt(b[i])} | "
                        f"{fmt(f[i])} | {ratio(f[i], b[i])} | {fmt(b[2 + i])} | "
                        f"{fmt(f[2 + i])} | {ratio(b[i], b[2 + i])} | {ratio(f[i], f[2 + i])} |")
        tables.append("\n".join(rows))
    return "\n\n".join(tables)


def server_section(a):
    levels = a.levels.split()
    rows = ["| concurrency | cinfer before | cinfer after | after / before | "
            "llama-server (before run) | llama-server (after run) | cinfer / llama.cpp before | "
            "cinfer / llama.cpp after |", "|---|---|---|---|---|---|---|---|"]
    lat = ["| concurrency | TTFT p50 ms before | TTFT p50 ms after | ITL p50 ms before | "
           "ITL p50 ms after | TPOT p50 ms before | TPOT p50 ms after | wall s before | "
           "wall s after |", "|---|---|---|---|---|---|---|---|---|"]
    for c in levels:
        cb = load(os.path.join(a.before, f"cinfer-c{c}.json"))
        ca = load(os.path.join(a.after, f"cinfer-c{c}.json"))
        lb = load(os.path.join(a.before, f"llama-c{c}.json"))
        la = load(os.path.join(a.after, f"llama-c{c}.json"))
        t = lambda r: get(r, "output_tok_s")
        rows.append(f"| {c} | {fmt(t(cb), 2)} | {fmt(t(ca), 2)} | {ratio(t(ca), t(cb))} | "
                    f"{fmt(t(lb), 2)} | {fmt(t(la), 2)} | {ratio(t(cb), t(lb))} | "
                    f"{ratio(t(ca), t(la))} |")
        lat.append(f"| {c} | {fmt(get(cb, 'ttft_ms', 'p50'), 0)} | "
                   f"{fmt(get(ca, 'ttft_ms', 'p50'), 0)} | {fmt(get(cb, 'itl_ms', 'p50'), 1)} | "
                   f"{fmt(get(ca, 'itl_ms', 'p50'), 1)} | {fmt(get(cb, 'tpot_ms', 'p50'), 1)} | "
                   f"{fmt(get(ca, 'tpot_ms', 'p50'), 1)} | {fmt(get(cb, 'wall_s'), 1)} | "
                   f"{fmt(get(ca, 'wall_s'), 1)} |")
    out = ["Output tok/s (all output tokens / wall time of the level; higher is better):", "",
           *rows, "", "cinfer latencies at the same levels:", "", *lat]
    pb = load(os.path.join(a.before, "cinfer-prefix.json"))
    pa = load(os.path.join(a.after, "cinfer-prefix.json"))
    if pb and pa:
        s = lambda r, k: r["summary"].get(k)
        out += ["", "Prefix cache (cinfer; cold = first request, warm = p50 of the others):", "",
                "| | cold TTFT ms | warm TTFT p50 ms | cold / warm |", "|---|---|---|---|",
                f"| before | {fmt(s(pb, 'cold_ttft_ms'), 0)} | {fmt(s(pb, 'warm_ttft_ms_p50'), 0)} "
                f"| {fmt(s(pb, 'cold_over_warm'), 2)} |",
                f"| after | {fmt(s(pa, 'cold_ttft_ms'), 0)} | {fmt(s(pa, 'warm_ttft_ms_p50'), 0)} "
                f"| {fmt(s(pa, 'cold_over_warm'), 2)} |"]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("cpu", "server"))
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--before-commit", default="?")
    ap.add_argument("--after-commit", default="?")
    ap.add_argument("--title", default="Before and after the step redesign")
    ap.add_argument("--levels", default="16 64")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--insert")
    ap.add_argument("--out")
    a = ap.parse_args()

    body = cpu_section(a) if a.kind == "cpu" else server_section(a)
    intro = para(f"""Two runs of the same benchmark, back to back on this machine ({cpu_model()},
{os.cpu_count()} threads), each measuring llama.cpp again beside cinfer: "before" is cinfer at
{a.before_commit}, "after" at {a.after_commit}. after / before compares the cinfer binaries;
the cinfer / llama.cpp columns are each run's own ratio, which cancels most of the machine's
drift between the runs (compare those when the llama.cpp figures moved).""")
    notes = "\n\n".join(para(n) for n in a.note)
    cmds = "\n".join(a.command)
    section = f"## {a.title}\n\n{intro}\n\n{body}\n"
    if notes:
        section += f"\n{notes}\n"
    if cmds:
        section += f"\nCommands (from the repository root):\n\n```\n{cmds}\n```\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(section)
    if a.insert:
        with open(a.insert) as f:
            text = f.read()
        head = f"## {a.title}\n"
        if head in text:  # replace up to the next level-2 heading (or the end)
            start = text.index(head)
            nxt = text.find("\n## ", start + len(head))
            text = text[:start] + section + ("" if nxt < 0 else text[nxt:])
        else:
            text = text.rstrip("\n") + "\n\n" + section
        with open(a.insert, "w") as f:
            f.write(text)
    if not a.out and not a.insert:
        sys.stdout.write(section)


if __name__ == "__main__":
    main()
