#!/usr/bin/env python3
"""bench/gguf_from_hf.py on the Gemma 4 and Qwen3.5 fixtures and the starter draft model (MLX
q8): the GGUF it writes is read back with llama.cpp's own gguf-py reader, which must find the
architecture, every tensor under a name of llama.cpp's map (one per source tensor, MLX scales and
biases folded in, plus Gemma 4's rope_freqs), the metadata the loaders need, and the transformed
values (Qwen3.5 norms + 1, ssm_a = -exp(A_log) with V heads tiled, Gemma 4 norms unshifted and
the proportional-RoPE frequency factors). Unsupported features must fail with a message.

Needs numpy and gguf-py (a llama.cpp source folder's gguf-py/, found through $LLAMA_CPP_DIR,
default /work/llama.cpp); exits 77 (skipped) without them. llama.cpp itself need not be built.

Usage: test_gguf_convert.py REPO_ROOT
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77
LLAMA_CPP_DIR = os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp")
try:
    import numpy as np

    sys.path.insert(0, os.path.join(LLAMA_CPP_DIR, "gguf-py"))
    import gguf
except ImportError as e:
    print(f"SKIP: {e} (needs numpy and {LLAMA_CPP_DIR}/gguf-py)")
    sys.exit(SKIP)

failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += 0 if cond else 1


def source_tensors(folder):
    """{name: (dtype, shape, raw bytes)} of every safetensors file of the folder."""
    out = {}
    for fname in sorted(os.listdir(folder)):
        if not fname.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, fname), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            data = f.read()
        for name, info in header.items():
            if name != "__metadata__":
                a, b = info["data_offsets"]
                out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


def bf16(raw):
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)


def converted(r, what):
    """check() that a conversion succeeded; its stderr only when it did not."""
    check(r.returncode == 0, what + ("" if r.returncode == 0 else f": {r.stderr[-600:]}"))
    return r.returncode == 0


def convert(root, folder, out, gtype, tokenizer=False):
    cmd = [sys.executable, os.path.join(root, "bench/gguf_from_hf.py"), folder, out, "--type",
           gtype] + (["--tokenizer", folder] if tokenizer else [])
    return subprocess.run(cmd, capture_output=True, text=True)


def field(reader, key):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def tensors_of(reader):
    return {t.name: t for t in reader.tensors}


def check_names(ts, arch, n_layer, what):
    """Every tensor is one of the architecture's in gguf-py's table (llama.cpp's names)."""
    known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[arch]
             for i in range(n_layer)}
    bad = [n for n in ts if n not in known and n.rsplit(".", 1)[0] not in known]
    check(not bad, f"{what}: every tensor name is one of llama.cpp's for the arch {bad[:3]}")


def expected_count(src):
    return sum(1 for n in src if not (n.endswith((".scales", ".biases"))
                                     and n.rsplit(".", 1)[0] + ".weight" in src))


def test_qwen35(root, tmp):
    folder = os.path.join(root, "tests/fixtures/qwen35")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    src = source_tensors(folder)
    out = os.path.join(tmp, "qwen35.gguf")
    r = convert(root, folder, out, "q8_0")
    if not converted(r, "qwen35 converts to q8_0"):
        return
    rd = gguf.GGUFReader(out)
    ts = tensors_of(rd)
    check(field(rd, "general.architecture") == "qwen35", "qwen35: architecture")
    check(len(ts) == expected_count(src), f"qwen35: {len(ts)} tensors, {expected_count(src)} "
                                          "in the folder")
    check_names(ts, gguf.MODEL_ARCH.QWEN35, cfg["num_hidden_layers"], "qwen35")
    check(field(rd, "qwen35.ssm.group_count") == cfg["linear_num_key_heads"]
          and field(rd, "qwen35.ssm.time_step_rank") == cfg["linear_num_value_heads"]
          and field(rd, "qwen35.ssm.state_size") == cfg["linear_key_head_dim"]
          and field(rd, "qwen35.ssm.conv_kernel") == cfg["linear_conv_kernel_dim"],
          "qwen35: ssm sizes")
    check(field(rd, "qwen35.full_attention_interval") == 2, "qwen35: full_attention_interval 2")
    check(field(rd, "qwen35.rope.dimension_count") == 8, "qwen35: rope dims 32 x 0.25")
    check(ts["blk.1.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0,
          "qwen35: matrices in Q8_0")
    # ssm_a = -exp(A_log), V heads from grouped-by-K [k0v0 k0v1 k1v0 k1v1] to tiled order.
    a_log = bf16(src["model.layers.0.linear_attn.A_log"][2])
    per_k = cfg["linear_num_value_heads"] // cfg["linear_num_key_heads"]
    tiled = a_log.reshape(cfg["linear_num_key_heads"], per_k).T.reshape(-1)
    got = np.asarray(ts["blk.0.ssm_a"].data, dtype=np.float32).reshape(-1)
    check(np.allclose(got, -np.exp(tiled), rtol=1e-6), "qwen35: ssm_a = -exp(A_log), tiled")
    norm = bf16(src["model.layers.1.self_attn.q_norm.weight"][2])
    got = np.asarray(ts["blk.1.attn_q_norm.weight"].data, dtype=np.float32).reshape(-1)
    check(np.array_equal(got, norm + 1), "qwen35: q_norm + 1")
    gated = bf16(src["model.layers.0.linear_attn.norm.weight"][2])
    got = np.asarray(ts["blk.0.ssm_norm.weight"].data, dtype=np.float32).reshape(-1)
    check(np.array_equal(got, gated), "qwen35: DeltaNet output norm unshifted")
    conv = ts["blk.0.ssm_conv1d.weight"]
    check(conv.tensor_type == gguf.GGMLQuantizationType.F32
          and list(conv.shape) == [cfg["linear_conv_kernel_dim"], 128],
          "qwen35: conv1d f32 [K, C]")


def test_gemma4(root, tmp):
    folder = os.path.join(root, "tests/fixtures/gemma4")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    src = source_tensors(folder)
    out = os.path.join(tmp, "gemma4.gguf")
    r = convert(root, folder, out, "bf16")
    if not converted(r, "gemma4 converts to bf16"):
        return
    rd = gguf.GGUFReader(out)
    ts = tensors_of(rd)
    check(field(rd, "general.architecture") == "gemma4", "gemma4: architecture")
    check(len(ts) == expected_count(src) + 1, f"gemma4: {len(ts)} tensors = folder's "
                                              f"{expected_count(src)} + rope_freqs")
    check_names(ts, gguf.MODEL_ARCH.GEMMA4, cfg["num_hidden_layers"], "gemma4")
    sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    check(field(rd, "gemma4.attention.sliding_window_pattern") == sliding,
          "gemma4: sliding pattern from layer_types")
    check(field(rd, "gemma4.attention.head_count_kv") == [2, 2, 1, 2, 2, 1],
          "gemma4: KV heads per layer from per_layer_config")
    check(field(rd, "gemma4.attention.key_length") == 32
          and field(rd, "gemma4.attention.key_length_swa") == 16, "gemma4: head dims per kind")
    check(field(rd, "gemma4.attention.sliding_window") == 8, "gemma4: window")
    check(abs(field(rd, "gemma4.final_logit_softcapping") - 30.0) < 1e-6, "gemma4: softcap")
    freqs = np.asarray(ts["rope_freqs.weight"].data, dtype=np.float32)
    check(list(freqs[:4]) == [1.0] * 4 and bool(np.all(freqs[4:] == np.float32(1e30)))
          and freqs.size == 16, "gemma4: rope_freqs, 4 of 16 pairs rotate (0.25 x 32 / 2)")
    check("blk.2.attn_v.weight" not in ts and "blk.0.attn_v.weight" in ts,
          "gemma4: no V on k_eq_v full layers, V on sliding layers")
    norm = bf16(src["model.layers.0.input_layernorm.weight"][2])
    got = np.asarray(ts["blk.0.attn_norm.weight"].data, dtype=np.float32).reshape(-1)
    check(np.array_equal(got, norm), "gemma4: norms unshifted")
    check("blk.0.layer_output_scale.weight" in ts, "gemma4: layer_scalar kept")


def test_starter_draft(root, tmp):
    folder = os.path.join(root, "models/starter-draft")
    src = source_tensors(folder)
    out = os.path.join(tmp, "draft.gguf")
    r = convert(root, folder, out, "f32", tokenizer=True)
    if not converted(r, "starter-draft (MLX q8) converts"):
        return
    rd = gguf.GGUFReader(out)
    ts = tensors_of(rd)
    check(len(ts) == expected_count(src) + 1, "starter-draft: scales/biases folded in")
    check(field(rd, "tokenizer.ggml.model") == "gpt2" and field(rd, "tokenizer.ggml.pre") ==
          "llama-bpe" and field(rd, "tokenizer.ggml.add_bos_token") is True,
          "starter-draft: byte-level BPE vocabulary with BOS")
    # One MLX row by hand: W = scale * q + bias, 8-bit codes little-endian in uint32 words.
    words = np.frombuffer(src["model.layers.0.mlp.up_proj.weight"][2], np.uint32)
    cols = src["model.layers.0.mlp.up_proj.weight"][1][1] * 4
    codes = words[:cols // 4].view(np.uint8).astype(np.float32)
    scales = bf16(src["model.layers.0.mlp.up_proj.scales"][2])
    biases = bf16(src["model.layers.0.mlp.up_proj.biases"][2])
    groups = src["model.layers.0.mlp.up_proj.scales"][1][1]
    want = codes * np.repeat(scales[:groups], 64) + np.repeat(biases[:groups], 64)
    got = np.asarray(ts["blk.0.ffn_up.weight"].data, dtype=np.float32)[0]
    check(np.array_equal(got, want), "starter-draft: MLX q8 row dequantized exactly")


def test_llama_affine(root, tmp):
    """A Mistral (Llama-family) folder of MLX q4 weights: their `.biases` (the groups' offsets)
    are not attention or MLP biases, and fold into the weights as the scales do."""
    folder = os.path.join(root, "tests/fixtures/mistral-q4g64")
    src = source_tensors(folder)
    out = os.path.join(tmp, "mistral-q4.gguf")
    r = convert(root, folder, out, "f32")
    if not converted(r, "mistral-q4g64 (MLX q4) converts"):
        return
    ts = tensors_of(gguf.GGUFReader(out))
    check(len(ts) == expected_count(src), "mistral q4: scales/biases folded in")
    # One MLX row by hand: W = scale * q + bias, eight 4-bit codes per little-endian uint32 word.
    name = "model.layers.0.mlp.up_proj"
    words = np.frombuffer(src[name + ".weight"][2], np.uint32)
    per_row = src[name + ".weight"][1][1]
    row = words[:per_row]
    codes = ((row[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).reshape(-1)
    scales = bf16(src[name + ".scales"][2])
    biases = bf16(src[name + ".biases"][2])
    groups = src[name + ".scales"][1][1]
    want = codes.astype(np.float32) * np.repeat(scales[:groups], 64) + np.repeat(
        biases[:groups], 64)
    got = np.asarray(ts["blk.0.ffn_up.weight"].data, dtype=np.float32)[0]
    check(np.array_equal(got, want), "mistral q4: MLX q4 row dequantized exactly")


def test_refusals(root, tmp):
    for name, word in (("gemma4-ple", "not handled"), ("gemma4-moe", "not handled"),
                       ("llama3-tied-q8g32", "biases are not handled")):
        r = convert(root, os.path.join(root, "tests/fixtures", name),
                    os.path.join(tmp, name + ".gguf"), "bf16")
        check(r.returncode != 0 and word in r.stderr and "Traceback" not in r.stderr,
              f"{name}: refused with a message ({r.stderr.strip()[-120:]})")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        test_qwen35(root, tmp)
        test_gemma4(root, tmp)
        test_starter_draft(root, tmp)
        test_llama_affine(root, tmp)
        test_refusals(root, tmp)
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
