#!/usr/bin/env python3
"""Writes a random PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, f32) for a
Llama-family model folder, for bench/adapters.sh: every attention and MLP projection of every
layer, rank R, lora_alpha 2R (scale 2), values seeded by --seed. Shapes come from config.json.

    /usr/bin/python3 bench/make_adapter.py MODEL_DIR OUT_DIR [--rank 16] [--seed 1]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import make_fixtures as mf  # noqa: E402  (st_write, write_json)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json")) as f:
        c = json.load(f)
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    inter = c["intermediate_size"]
    shapes = {"self_attn.q_proj": (heads * head_dim, hidden),
              "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden),
              "self_attn.o_proj": (hidden, heads * head_dim),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
              "mlp.down_proj": (hidden, inter)}
    rng = np.random.default_rng(a.seed)
    r = a.rank
    tensors = {}
    for layer in range(c["num_hidden_layers"]):
        for module, (n_out, n_in) in shapes.items():
            name = "base_model.model.model.layers.%d.%s" % (layer, module)
            tensors[name + ".lora_A.weight"] = (
                "F32", rng.normal(0, 1 / np.sqrt(n_in), (r, n_in)).astype(np.float32))
            tensors[name + ".lora_B.weight"] = (
                "F32", rng.normal(0, 0.02, (n_out, r)).astype(np.float32))
    os.makedirs(a.out, exist_ok=True)
    mf.st_write(os.path.join(a.out, "adapter_model.safetensors"), tensors)
    mf.write_json(os.path.join(a.out, "adapter_config.json"), {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r,
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False,
        "target_modules": sorted(m.split(".")[1] for m in shapes)})
    print("adapter %s: rank %d, %d tensors" % (a.out, r, len(tensors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
