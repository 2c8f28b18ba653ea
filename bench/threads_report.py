"""Writes the thread-scaling report (bench/threads.md) from the results of bench/threads.sh:
per dtype and thread count, cinfer's and llama.cpp's prefill and decode tokens/s, their ratio,
and each engine's speed-up over its own 1-thread figure."""
import argparse
import datetime
import os

from report_common import commit_of_binary, cpu_model, fmt, load, sh


def cinfer_figures(path):
    d = load(path)
    if not isinstance(d, dict):
        return None, None
    return d.get("prefill_tok_s"), d.get("decode_tok_s")


def llama_figures(path):
    d = load(path)
    if not isinstance(d, list):
        return None, None
    prefill = decode = None
    for entry in d:
        if entry.get("n_prompt", 0) > 0 and entry.get("n_gen", 0) == 0:
            prefill = entry.get("avg_ts")
        elif entry.get("n_gen", 0) > 0 and entry.get("n_prompt", 0) == 0:
            decode = entry.get("avg_ts")
    return prefill, decode


def ratio(a, b):
    return None if a is None or not b else a / b


def prefill_kernels():
    """Which panel kernels cinfer's fast prefill runs on this CPU (its flags, as cinfer's CPUID
    check sees them) and whether llama.cpp has the same hardware to hand."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    if "amx_bf16" in flags and "avx512_bf16" in flags:
        return ("AMX-BF16 tile products (this CPU has AMX; `CINFER_AMX=0` turns them off), "
                "against llama.cpp built with AMX off")
    if "avx512_bf16" in flags:
        return "AVX512-BF16 `vdpbf16ps`"
    return "f32 FMA on x rounded to bf16"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--dtypes", required=True)
    ap.add_argument("--threads", required=True)
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--gen", type=int, required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--precision", required=True)
    ap.add_argument("--seconds", type=int, default=0)
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split()]
    pairs = [p.split(":") for p in a.dtypes.split()]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    have_llama = any(os.path.exists(os.path.join(a.results, f"llama-{g}-{t}.json"))
                     for _, g in pairs for t in threads)
    out = []
    out.append("# Thread scaling: cinfer vs llama.cpp on the CPU\n")
    out.append(f"Random-weight model from `{a.config}`; prefill = {a.prompt}-token prompt, "
               f"decode = {a.gen} generated tokens from an empty context, median of {a.runs} runs "
               "(llama.cpp: mean); "
               f"cinfer `--precision {a.precision}`, llama.cpp `-lm none` (weights in allocated "
               "memory). Ratios are cinfer / llama.cpp (above 1: cinfer faster); speed-up is "
               "each engine's figure over its own 1-thread figure.\n")
    out.append(f"- CPU: {cpu_model()} (`nproc` = {sh(['nproc'])})")
    out.append(f"- cinfer's prefill products: {prefill_kernels()}")
    out.append(f"- Date: {now}; whole run {a.seconds} s")
    out.append(f"- cinfer commit: {commit_of_binary()}")
    out.append("- Command: `bench/threads.sh`" + ("" if have_llama else
                                                  " (no llama.cpp sources: cinfer only)"))
    out.append("")
    for dtype, gtype in pairs:
        out.append(f"## {dtype} (llama.cpp {gtype})\n")
        out.append("| threads | cinfer prefill | llama.cpp prefill | prefill ratio | cinfer decode "
                   "| llama.cpp decode | decode ratio | cinfer prefill speed-up | llama.cpp "
                   "prefill speed-up | cinfer decode speed-up | llama.cpp decode speed-up |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|")
        # rows by thread count, speed-ups over the fewest threads measured (the run may go from
        # the most threads down)
        least = min(threads)
        base = (cinfer_figures(os.path.join(a.results, f"cinfer-{dtype}-{least}.json")) +
                llama_figures(os.path.join(a.results, f"llama-{gtype}-{least}.json")))
        for t in sorted(threads):
            cp, cd = cinfer_figures(os.path.join(a.results, f"cinfer-{dtype}-{t}.json"))
            lp, ld = llama_figures(os.path.join(a.results, f"llama-{gtype}-{t}.json"))
            out.append(f"| {t} | {fmt(cp)} | {fmt(lp)} | {fmt(ratio(cp, lp), 2)} | {fmt(cd)} | "
                       f"{fmt(ld)} | {fmt(ratio(cd, ld), 2)} | {fmt(ratio(cp, base[0]), 2)} | "
                       f"{fmt(ratio(lp, base[2]), 2)} | {fmt(ratio(cd, base[1]), 2)} | "
                       f"{fmt(ratio(ld, base[3]), 2)} |")
        out.append("")
    out.append("## Thread-pool job cost (`build/pool_bench`)\n")
    out.append("Microseconds per job of near-empty tasks (4 per thread): back to back, and after 20 "
               "us of serial work on the caller (as between a decode step's matmuls), with idle "
               "threads spinning 20 us or 1 ms (`CINFER_POOL_SPIN_US`) before they sleep (the "
               "default: 1 ms; 20 us was the default of pools of up to 2 threads until 2026-12-05).\n")
    out.append("| threads | back to back (20 us spin) | after a gap (20 us spin) | back to back (1 ms "
               "spin) | after a gap (1 ms spin) |")
    out.append("|---|---|---|---|---|")
    for t in sorted(threads):
        d20 = load(os.path.join(a.results, f"pool-{t}-20.json")) or {}
        d1k = load(os.path.join(a.results, f"pool-{t}-1000.json")) or {}
        out.append(f"| {t} | {fmt(d20.get('us_per_job'), 2)} | "
                   f"{fmt(d20.get('us_per_job_after_gap'), 2)} | {fmt(d1k.get('us_per_job'), 2)} | "
                   f"{fmt(d1k.get('us_per_job_after_gap'), 2)} |")
    out.append("")
    last, most = pairs[-1][0], max(threads)
    cp, cd = cinfer_figures(os.path.join(a.results, f"cinfer-spin20-{last}-{most}.json"))
    dp, dd = cinfer_figures(os.path.join(a.results, f"cinfer-{last}-{most}.json"))
    out.append(f"cinfer {last} at {most} threads with a 20 us spin: prefill {fmt(cp)} "
               f"tok/s, decode {fmt(cd)} tok/s (default spin, table above: {fmt(dp)} / "
               f"{fmt(dd)}).\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
