#!/usr/bin/env python3
"""Write bench/cpu.md from the JSON files bench/run.sh leaves in bench/work/results: one section
per model (results/MODEL/) with cinfer vs llama.cpp throughput per dtype and decode bandwidth
against the measured read roofline, then the machine, date, commit and commands of the run.
Hand-written notes below the KEPT marker line of an existing report are carried over."""

import argparse
import datetime
import json
import os
import statistics

from report_common import commit_of_binary, cpu_model, fmt, load, sh

NO_LLAMA = "n/a (llama.cpp not built: see bench/README.md)"
KEPT = "<!-- Everything below this line is kept by bench/report.py when it rewrites the report. -->"
TITLES = {  # section title per model name of bench/run.sh
    "llama1b": "Llama 3.2 1B geometry",
    "gemma3-1b": "Gemma 3 1B geometry",
}


def llama_medians(results, n_prompt, n_gen):
    """{load_mode: [prefill tok/s, decode tok/s]}: medians of llama-bench's per-run samples."""
    out = {}
    for test in results or []:
        ts = test.get("samples_ts") or [test.get("avg_ts")]
        mode = out.setdefault(str(test.get("load_mode", "mmap")), [None, None])
        if test.get("n_prompt") == n_prompt and test.get("n_gen") == 0:
            mode[0] = statistics.median(ts)
        elif test.get("n_gen") == n_gen and test.get("n_prompt") == 0:
            mode[1] = statistics.median(ts)
    return out


def best(modes, i):
    """(best value of column i over load modes, that mode), or (None, None)."""
    vals = [(v[i], m) for m, v in modes.items() if v[i] is not None]
    return max(vals) if vals else (None, None)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def round_files(res, stem, rounds):
    """The loaded results of stem's rounds (None where a round has none), in round order."""
    return [load(os.path.join(res, f"{stem}.r{r}.json")) for r in range(1, rounds + 1)]


def cinfer_figures(runs):
    """{field: median over rounds} of cinfer bench's JSON, and {field: per-round values}."""
    fields = ("prefill_tok_s", "decode_tok_s", "ttft_ms", "peak_rss_mb", "weights_bytes")
    per_round = {f: [(r or {}).get(f) for r in runs] for f in fields}
    return {f: median(v) for f, v in per_round.items()}, per_round


def llama_figures(runs, n_prompt, n_gen):
    """llama.cpp per load mode: ({mode: [median prefill, median decode] over rounds}, {mode:
    ([per-round prefill], [per-round decode])})."""
    per_round = [llama_medians(r, n_prompt, n_gen) for r in runs]
    modes = sorted({m for r in per_round for m in r})
    series = {m: ([r.get(m, [None, None])[0] for r in per_round],
                  [r.get(m, [None, None])[1] for r in per_round]) for m in modes}
    return {m: [median(p), median(d)] for m, (p, d) in series.items()}, series


def paired_ratio(ours, theirs):
    """(median, min, max) of the per-round ratios ours[r] / theirs[r], or Nones."""
    rs = [ratio(a, b) for a, b in zip(ours, theirs)]
    rs = [r for r in rs if r is not None]
    return (statistics.median(rs), min(rs), max(rs)) if rs else (None, None, None)


def fmt_ratio(r):
    """A paired ratio as "median (min-max)" over rounds, or the median alone for one round."""
    mid, lo, hi = r
    if mid is None:
        return "n/a"
    return fmt(mid, 2) if lo == hi else f"{mid:.2f} ({lo:.2f}-{hi:.2f})"


def parse_pairs(text):
    """"bf16:bf16,q4:q4_0" -> [("bf16", "bf16"), ("q4", "q4_0")] (cinfer dtype, GGUF type)."""
    return [tuple(p.split(":", 1)) for p in text.split(",") if p]


def describe(cfg):
    """The geometry line of a config: sizes, then sliding-window layout where there is one."""
    text = (f"hidden {cfg.get('hidden_size')}, {cfg.get('num_hidden_layers')} layers, "
            f"{cfg.get('num_attention_heads')}/{cfg.get('num_key_value_heads')} heads, "
            f"head_dim {cfg.get('head_dim')}, FFN {cfg.get('intermediate_size')}, "
            f"vocab {cfg.get('vocab_size')}, "
            f"{'tied' if cfg.get('tie_word_embeddings') else 'untied'} embeddings")
    types = cfg.get("layer_types") or []
    n_sliding = sum(t == "sliding_attention" for t in types)
    if n_sliding:
        text += (f", sliding window {cfg.get('sliding_window')} on {n_sliding} of "
                 f"{len(types)} layers")
    if str(cfg.get("model_type", "")).startswith("gemma"):
        text += ", q/k norms, sandwich norms, GeGLU"
    return text


def model_section(a, name, config, pairs, have_llama, roof, membw):
    """The markdown section of one model, and its run-condition entries."""
    res = os.path.join(a.results, name)
    cfg = load(config) or {}
    cfg = {**cfg, **(cfg.get("text_config") or {})}
    rows, bw_rows, mode_rows, exact_rows = [], [], [], []
    for cdt, gdt in pairs:
        c, c_rounds = cinfer_figures(round_files(res, f"cinfer-{cdt}", a.rounds))
        cp, cd = c["prefill_tok_s"], c["decode_tok_s"]
        wbytes = c["weights_bytes"]
        lp_rounds = ld_rounds = [None] * a.rounds
        if have_llama:
            modes, series = llama_figures(round_files(res, f"llama-{gdt}", a.rounds), a.prompt,
                                          a.gen)
            (lp, lpm), (ld, ldm) = best(modes, 0), best(modes, 1)
            if lpm:
                lp_rounds = series[lpm][0]
            if ldm:
                ld_rounds = series[ldm][1]
            lp_s = fmt(lp) + (f" ({lpm})" if lpm else "")
            ld_s = fmt(ld) + (f" ({ldm})" if ldm else "")
            for m, (p, d) in sorted(modes.items()):
                mode_rows.append(f"| {gdt} | {m} | {fmt(p)} | {fmt(d)} |")
        else:
            lp = ld = None
            lp_s = ld_s = NO_LLAMA
        rows.append(f"| {cdt} / {gdt} | {fmt(cp)} | {fmt(cd)} | {lp_s} | {ld_s} | "
                    f"{fmt_ratio(paired_ratio(c_rounds['prefill_tok_s'], lp_rounds))} | "
                    f"{fmt_ratio(paired_ratio(c_rounds['decode_tok_s'], ld_rounds))} | "
                    f"{fmt(c['ttft_ms'])} | {fmt(c['peak_rss_mb'], 0)} |")
        e, e_rounds = cinfer_figures(round_files(res, f"cinfer-exact-{cdt}", a.rounds))
        ep, ed = e["prefill_tok_s"], e["decode_tok_s"]
        exact_rows.append(
            f"| {cdt} | {fmt(cp)} | {fmt(ep)} | "
            f"{fmt_ratio(paired_ratio(c_rounds['prefill_tok_s'], e_rounds['prefill_tok_s']))} | "
            f"{fmt_ratio(paired_ratio(e_rounds['prefill_tok_s'], lp_rounds))} | {fmt(cd)} | "
            f"{fmt(ed)} | "
            f"{fmt_ratio(paired_ratio(c_rounds['decode_tok_s'], e_rounds['decode_tok_s']))} | "
            f"{fmt_ratio(paired_ratio(e_rounds['decode_tok_s'], ld_rounds))} |")
        c_bw = None if wbytes is None or cd is None else wbytes * cd / 1e9
        l_bw = None if wbytes is None or ld is None else wbytes * ld / 1e9
        bw_rows.append(f"| {cdt} | {fmt(None if wbytes is None else wbytes / 1e6, 0)} | "
                       f"{fmt(c_bw)} | {fmt(ratio(c_bw, roof), 2)} | {fmt(l_bw)} | "
                       f"{fmt(ratio(l_bw, roof), 2)} |")
    conditions = []
    for stem in ([f"cinfer-{c}" for c, _ in pairs] + [f"cinfer-exact-{c}" for c, _ in pairs] +
                 [f"llama-{g}" for _, g in pairs]):
        metas = [m for m in (load(os.path.join(res, f"{stem}.r{r}.json.meta.json"))
                             for r in range(1, a.rounds + 1)) if m]
        if metas:
            attempts = sum(m["attempts"] for m in metas)
            conditions.append(f"{name}/{stem} at most "
                              f"{100 * max(m['interference'] for m in metas):.1f}% "
                              f"({attempts} attempts over {len(metas)} rounds)")
    mode_table = ""
    if mode_rows:
        mode_table = ("\n| llama.cpp type | load mode | prefill | decode |\n|---|---|---|---|\n" +
                      "\n".join(mode_rows) + "\n")
    section = f"""## {TITLES.get(name, name)} (`{name}`)

Random-weight model from `{config}` ({describe(cfg)}).

### Throughput (tokens/s)

| dtype (cinfer / llama.cpp) | cinfer prefill | cinfer decode | llama.cpp prefill | \
llama.cpp decode | prefill ratio | decode ratio | cinfer TTFT ms | cinfer peak RSS MB |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
{mode_table}
### fast and exact precision

cinfer's default `--precision fast` (bf16 activations into bf16 products; q8/q4 decode with two
int8 planes of x, 16-bit fixed point per group) beside `--precision exact` (f32 activations, three int8 planes: logits within
1e-3 of transformers in f32), each exact figure also against llama.cpp's best.

| dtype | prefill fast | prefill exact | fast / exact | exact / llama.cpp | decode fast | decode exact | fast / exact | exact / llama.cpp |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(exact_rows)}

### Decode bandwidth

Measured read roofline (`build/membw`): {fmt(membw.get('read_gbs_1t'))} GB/s on 1 thread,
{fmt(roof)} GB/s on {membw.get('threads', a.threads)} threads ({membw.get('isa', '?')} read loop).

| dtype | weights MB/token | cinfer GB/s | cinfer / roofline | llama.cpp GB/s | \
llama.cpp / roofline |
|---|---|---|---|---|---|
{chr(10).join(bw_rows)}
"""
    return section, conditions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--gen", type=int, required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", nargs=3, action="append", required=True,
                    metavar=("NAME", "CONFIG", "PAIRS"),
                    help="a benchmarked model: its name (results/NAME/), config and "
                    "cinfer:gguf dtype pairs, e.g. bf16:bf16,q4:q4_0; repeat per model")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    membw = load(os.path.join(a.results, "membw.json")) or {}
    roof = membw.get("read_gbs_nt")
    have_llama = os.access(a.llama_bench, os.X_OK)
    commit = commit_of_binary()
    llama_commit = "not built"
    for name, _, pairs in a.model:  # llama-bench reports the commit it was built from
        for _, gdt in parse_pairs(pairs):
            for test in load(os.path.join(a.results, name, f"llama-{gdt}.r1.json")) or []:
                llama_commit = str(test.get("build_commit"))
    if llama_commit == "unknown":  # built from a tree without .git
        llama_commit = os.environ.get("LLAMA_CPP_COMMIT", "unknown (see bench/README.md)")

    sections, conditions = [], []
    for name, config, pairs in a.model:
        section, cond = model_section(a, name, config, parse_pairs(pairs), have_llama, roof,
                                      membw)
        sections.append(section)
        conditions += cond
    meta = load(os.path.join(a.results, "membw.json.meta.json"))
    if meta:
        conditions.append(f"membw {100 * meta['interference']:.1f}% "
                          f"({meta['attempts']} attempt{'s' if meta['attempts'] > 1 else ''})")
    with open(os.path.join(a.results, "commands.txt")) as f:
        commands = f.read().strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = f"""# CPU benchmark: cinfer vs llama.cpp

Random-weight models, one section each below. cinfer q8/q4 are
MLX affine with group size 64 (bf16 scale + bias: 8.5 / 4.5 bits per weight); llama.cpp runs the
same weights converted by `bench/gguf_from_hf.py` to bf16 / Q8_0 / Q4_0 (8.5 / 4.5 bits per
weight, every matrix including the embedding). Prefill = {a.prompt}-token prompt, decode =
{a.gen} generated tokens from an empty context (both engines time the two apart, as llama-bench's
pp and tg tests), {a.threads} threads. Every measurement runs in {a.rounds} rounds (each
invocation timing {a.runs} run{"s" if a.runs > 1 else ""} after a warm-up); a figure is the median over the rounds.

- Machine: {cpu_model()}, {a.threads} threads (`nproc` = {os.cpu_count()})
- Date: {now}
- cinfer commit: {commit}; llama.cpp: {llama_commit}
- Command: `make bench` (runs `bench/run.sh`)

Throughput ratios are cinfer / llama.cpp (above 1: cinfer faster); the throughput table is cinfer
in its default fast precision, exact beside it in its own table. llama.cpp is run with both
weight load modes (`-lm none,mmap`: weights read into allocated memory, or used in place from
the mapped file) and the faster one (by median) is shown in parentheses. In each round, each
engine's run of a dtype follows the other's directly; on a shared host, memory bandwidth drifts by
20-30% over minutes, so a ratio is the median of the per-round ratios (their range over the rounds
in parentheses), and ratios compare across reports better than absolute numbers. Decode bandwidth: achieved =
bytes of weights read per decoded token (reported by cinfer; the tied embedding counts once, as
the output head) x decode tok/s; the llama.cpp column applies the same byte count (its formats
have the same bits per weight).

{chr(10).join(sections)}
## Run conditions

CPU time taken by other processes during each measurement, as a share of all CPUs (each is
retried up to `BENCH_ATTEMPTS` times, keeping the cleanest run; the worst round shown): {", ".join(conditions) or "n/a"}.

## Commands

Each measurement command below ran once per round ({a.rounds} rounds).

```
{commands}
```
"""
    kept = ""
    if os.path.exists(a.out):
        with open(a.out) as f:
            previous = f.read()
        if KEPT in previous:
            kept = "\n" + previous[previous.index(KEPT):]
    with open(a.out, "w") as f:
        f.write(out + kept)


if __name__ == "__main__":
    main()
