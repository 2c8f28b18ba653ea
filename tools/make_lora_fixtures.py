#!/usr/bin/env python3
"""Build the LoRA adapter fixtures under tests/fixtures/lora-<name>/ on existing model fixtures.

Each adapter folder holds:
  adapter_config.json        PEFT's adapter config (written by peft's save_pretrained when peft is
                             installed, else the same fields written here)
  adapter_model.safetensors  PEFT's adapter weights, f32: base_model.model.model.layers.N.
                             <self_attn|mlp>.<proj>.lora_A.weight [r, in] and .lora_B.weight [out, r]
  ids.txt                    the base fixture's prompt ids (copied)
  logits_<base>.f32          f32 logits [n_ids, vocab] of base model <base> (a fixture folder name)
                             with the adapter applied, for the whole prompt at once: transformers
                             + peft (PeftModel.from_pretrained on the saved folder), f32 on CPU,
                             eager attention; quantized bases run with their MLX-dequantized
                             weights, exactly as tools/make_fixtures.py does
  REFERENCE.json             how the logits were made ("peft" or "merged": W + scale * B @ A
                             computed in torch when peft is missing or fails), versions, and the
                             max |logit diff| between peft and the merged-weight model

The adapter values are deterministic (numpy Generator seeded from the adapter name) and rounded to
bf16, so a converted copy (mlx-lm layout, bf16) holds exactly the same numbers. The folder has no
logits.f32 or greedy.txt, so the model-fixture tests do not take it for a model.

Needs torch + transformers (and peft, optional); the base fixtures must exist:
    python3 tools/make_lora_fixtures.py --fixtures tests/fixtures --out OUTDIR
writes OUTDIR/lora-llama/ and OUTDIR/lora-qwen3/; copy them to tests/fixtures/.
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

F32 = np.float32

# name, base fixtures (the first is the one the adapter's shapes come from), rank, alpha, rslora,
# target modules
ADAPTERS = [
    dict(name="lora-llama", bases=["llama", "llama-q8g32", "llama-q4g64"], r=4, alpha=8.0,
         rslora=False, targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj"]),
    dict(name="lora-qwen3", bases=["qwen3", "qwen3-q4g64"], r=8, alpha=4.0, rslora=True,
         targets=["q_proj", "v_proj", "down_proj"]),
]
STD_A = 0.3
STD_B = 0.3


def scale_of(ad):
    return ad["alpha"] / (np.sqrt(ad["r"]) if ad["rslora"] else ad["r"])


def module_path(proj):
    return ("mlp." if proj in ("gate_proj", "up_proj", "down_proj") else "self_attn.") + proj


def gen_adapter(ad, shapes, n_layers):
    """Returns {"model.layers.N.<path>": (A [r, in], B [out, r])} of bf16-representable f32."""
    rng = np.random.default_rng(mf.seed_of(ad["name"]))
    out = {}
    for li in range(n_layers):
        for proj in ad["targets"]:
            m = "model.layers.%d.%s" % (li, module_path(proj))
            n_out, n_in = shapes[m + ".weight"]
            a = mf.round_bf16(rng.normal(0.0, STD_A, (ad["r"], n_in)).astype(F32))
            b = mf.round_bf16(rng.normal(0.0, STD_B, (n_out, ad["r"])).astype(F32))
            out[m] = (a, b)
    return out


def peft_config_dict(ad):
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": None,
            "r": ad["r"], "lora_alpha": ad["alpha"], "lora_dropout": 0.0,
            "target_modules": sorted(ad["targets"]), "use_rslora": ad["rslora"],
            "use_dora": False, "bias": "none", "fan_in_fan_out": False,
            "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
            "inference_mode": True}


def write_peft_files(folder, ad, lora):
    tensors = {}
    for m, (a, b) in lora.items():
        tensors["base_model.model.%s.lora_A.weight" % m] = ("F32", a)
        tensors["base_model.model.%s.lora_B.weight" % m] = ("F32", b)
    mf.st_write(os.path.join(folder, "adapter_model.safetensors"), tensors)
    mf.write_json(os.path.join(folder, "adapter_config.json"), peft_config_dict(ad))


def base_weights(ctx, folder):
    """The model of a fixture folder, rebuilt from its config.json and weight file (as
    make_fixtures.greedy_existing does), with its prompt ids and its own logits checked."""
    with open(os.path.join(folder, "config.json")) as f:
        cj = json.load(f)
    model = ctx.build_model(ctx.load_config(folder))
    tied = bool(cj.get("tie_word_embeddings", False))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    path = os.path.join(folder, "model.safetensors")
    if "quantization" in cj:
        weights = mf.dequant_from_file(path, cj["quantization"], shapes)
    else:
        weights = {k: mf.bf16_bits_to_f32(a) for k, (dt, a) in mf.st_read(path).items()}
    ctx.load_weights(model, weights, tied)
    with open(os.path.join(folder, "ids.txt")) as f:
        ids = [int(x) for x in f.read().strip().split(",")]
    want = np.fromfile(os.path.join(folder, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
    got = ctx.logits(model, ids)
    if not np.array_equal(got, want):  # another torch version; the adapter logits stay our own
        print("WARN %s: rebuilt model differs from logits.f32 by up to %g" % (
            folder, float(np.abs(got - want).max())))
    return model, weights, tied, shapes, ids


def merged_logits(ctx, folder, weights, tied, ids, lora, scale):
    torch = ctx.torch
    merged = dict(weights)
    for m, (a, b) in lora.items():
        w = torch.from_numpy(np.array(weights[m + ".weight"], dtype=F32))
        delta = float(scale) * (torch.from_numpy(b) @ torch.from_numpy(a))
        merged[m + ".weight"] = (w + delta).numpy().astype(F32)
    model = ctx.build_model(ctx.load_config(folder))
    ctx.load_weights(model, merged, tied)
    return ctx.logits(model, ids)


def peft_save(ctx, model, ad, lora, folder):
    """Attaches a LoRA of this shape with peft, sets its weights to ours and saves it with
    save_pretrained (PEFT's own file layout). Returns peft's version."""
    import peft
    torch = ctx.torch
    cfg = peft.LoraConfig(r=ad["r"], lora_alpha=ad["alpha"], target_modules=ad["targets"],
                          lora_dropout=0.0, bias="none", use_rslora=ad["rslora"],
                          task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, cfg)
    params = dict(pm.named_parameters())
    seen = 0
    for m, (a, b) in lora.items():
        for part, arr in (("lora_A", a), ("lora_B", b)):
            key = "base_model.model.%s.%s.default.weight" % (m, part)
            assert key in params, "peft has no parameter %s" % key
            assert tuple(params[key].shape) == arr.shape, (key, params[key].shape, arr.shape)
            with torch.no_grad():
                params[key].copy_(torch.from_numpy(arr))
            seen += 1
    n_lora = sum(1 for k in params if ".lora_A." in k or ".lora_B." in k)
    assert n_lora == seen, "peft made %d LoRA tensors, the adapter has %d" % (n_lora, seen)
    pm.save_pretrained(folder, safe_serialization=True)
    card = os.path.join(folder, "README.md")  # peft's empty model card: not part of the fixture
    if os.path.exists(card):
        os.remove(card)
    return peft.__version__


def peft_logits(ctx, base_folder, weights, tied, ids, adapter_folder):
    import peft
    model = ctx.build_model(ctx.load_config(base_folder))
    ctx.load_weights(model, weights, tied)
    pm = peft.PeftModel.from_pretrained(model, adapter_folder).eval()
    torch = ctx.torch
    with torch.no_grad():
        out = pm(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    lg = out.logits[0].float().cpu().numpy().astype(F32)
    assert lg.shape == (len(ids), model.config.vocab_size) and np.all(np.isfinite(lg))
    return lg


def check_saved(folder, lora):
    """The saved adapter file holds exactly our values under PEFT's key names."""
    t = mf.st_read(os.path.join(folder, "adapter_model.safetensors"))
    want = set()
    for m, (a, b) in lora.items():
        for part, arr in (("lora_A", a), ("lora_B", b)):
            key = "base_model.model.%s.%s.weight" % (m, part)
            want.add(key)
            assert key in t, "saved adapter lacks %s (has %s)" % (key, sorted(t)[:4])
            dt, got = t[key]
            assert dt == "F32", (key, dt)
            assert np.array_equal(got, arr), key
    assert set(t) == want, sorted(set(t) ^ want)[:4]


def make_adapter(ctx, ad, fixtures, out, report):
    folder = os.path.join(out, ad["name"])
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    first = os.path.join(fixtures, ad["bases"][0])
    model, weights, tied, shapes, ids = base_weights(ctx, first)
    n_layers = model.config.num_hidden_layers
    lora = gen_adapter(ad, shapes, n_layers)
    scale = scale_of(ad)
    info = {"r": ad["r"], "alpha": ad["alpha"], "use_rslora": ad["rslora"], "scale": float(scale),
            "targets": ad["targets"], "bases": {}}
    use_peft = True
    try:
        info["peft"] = peft_save(ctx, model, ad, lora, folder)
        check_saved(folder, lora)
    except Exception:  # noqa
        use_peft = False
        info["peft_error"] = traceback.format_exc()
        print(info["peft_error"])
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))
        write_peft_files(folder, ad, lora)
        check_saved(folder, lora)
    with open(os.path.join(folder, "adapter_config.json")) as f:
        info["adapter_config"] = json.load(f)
    shutil.copy(os.path.join(first, "ids.txt"), os.path.join(folder, "ids.txt"))
    for base in ad["bases"]:
        bf = os.path.join(fixtures, base)
        _, w, t, _, bids = base_weights(ctx, bf)
        assert bids == ids, "%s has other prompt ids than %s" % (base, ad["bases"][0])
        ref = merged_logits(ctx, bf, w, t, ids, lora, scale)
        plain = np.fromfile(os.path.join(bf, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
        entry = {"adapter_effect_max_abs": float(np.abs(ref - plain).max())}
        lg, how = ref, "merged"
        if use_peft:
            try:
                lg = peft_logits(ctx, bf, w, t, ids, folder)
                how = "peft"
                entry["peft_vs_merged_max_abs"] = float(np.abs(lg - ref).max())
            except Exception:  # noqa
                entry["peft_error"] = traceback.format_exc()
                print(entry["peft_error"])
        entry["reference"] = how
        entry["logits"] = mf.stats(lg)
        np.ascontiguousarray(lg, dtype="<f4").tofile(os.path.join(folder, "logits_%s.f32" % base))
        info["bases"][base] = entry
        print("%s on %s: reference %s, adapter changes logits by up to %.3f%s" % (
            ad["name"], base, how, entry["adapter_effect_max_abs"],
            (", peft vs merged %.2e" % entry["peft_vs_merged_max_abs"])
            if "peft_vs_merged_max_abs" in entry else ""))
        if entry["adapter_effect_max_abs"] < 0.1:
            report.append("WARN %s on %s: the adapter barely changes the logits" % (ad["name"], base))
        if entry.get("peft_vs_merged_max_abs", 0.0) > 1e-4:
            report.append("WARN %s on %s: peft and merged weights differ by %g" % (
                ad["name"], base, entry["peft_vs_merged_max_abs"]))
    info["torch"] = ctx.torch.__version__
    info["transformers"] = ctx.tf.__version__
    mf.write_json(os.path.join(folder, "REFERENCE.json"), info)
    return folder


def selftest():
    """numpy-only: shapes, scale rule, and the PEFT file layout written without peft."""
    import tempfile
    shapes = {"model.layers.0.self_attn.q_proj.weight": (64, 64),
              "model.layers.0.self_attn.v_proj.weight": (32, 64),
              "model.layers.0.mlp.down_proj.weight": (64, 192)}
    ad = dict(name="lora-test", r=8, alpha=4.0, rslora=True,
              targets=["q_proj", "v_proj", "down_proj"])
    lora = gen_adapter(ad, shapes, 1)
    assert lora["model.layers.0.mlp.down_proj"][0].shape == (8, 192)
    assert lora["model.layers.0.mlp.down_proj"][1].shape == (64, 8)
    assert np.array_equal(mf.round_bf16(lora["model.layers.0.self_attn.q_proj"][0]),
                          lora["model.layers.0.self_attn.q_proj"][0])
    assert abs(scale_of(ad) - 4.0 / np.sqrt(8)) < 1e-12
    assert scale_of(dict(ad, rslora=False)) == 0.5
    with tempfile.TemporaryDirectory() as td:
        write_peft_files(td, ad, lora)
        check_saved(td, lora)
        with open(os.path.join(td, "adapter_config.json")) as f:
            assert json.load(f)["r"] == 8
    print("lora selftest OK")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fixtures", default="tests/fixtures", help="folder of the base fixtures")
    ap.add_argument("--out", help="output folder (gets lora-llama/ and lora-qwen3/)")
    ap.add_argument("--selftest", action="store_true", help="numpy-only checks, no torch")
    a = ap.parse_args()
    selftest()
    if a.selftest:
        return 0
    if not a.out:
        ap.error("--out is required")
    ctx = mf.Ctx()
    os.makedirs(a.out, exist_ok=True)
    report, failures = [], []
    for ad in ADAPTERS:
        try:
            make_adapter(ctx, ad, a.fixtures, a.out, report)
        except Exception:  # noqa
            failures.append(ad["name"])
            traceback.print_exc()
    for line in report:
        print(line)
    print("lora fixtures: failures: %s" % (failures or "none"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
