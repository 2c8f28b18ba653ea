#!/usr/bin/env python3
"""Build the tiny reference-model fixtures under tests/fixtures/<name>/.

Each fixture folder holds:
  config.json        transformers' save_pretrained of the config (llama-linear is then rewritten
                     to the legacy `rope_theta` + `rope_scaling` form; quantized variants gain
                     `quantization` and `quantization_config`)
  model.safetensors  bf16 weights with HF tensor names; quantized variants hold MLX affine
                     tensors (`<m>.weight` U32 packed LSB-first, `<m>.scales`/`<m>.biases` bf16)
  ids.txt            48 prompt token ids, one line, comma-separated
  logits.f32         transformers' logits for the whole prompt at once, f32 little-endian,
                     row-major [n_ids, vocab_size]; model run in f32 on CPU, eager attention,
                     with exactly the weights the file describes (bf16 upcast, or the MLX
                     dequantization `scale_bf16 * q + bias_bf16` computed in f32)
  logits_kvbf16.f32  the same, with K (after RoPE) and V rounded to bf16 where attention reads
                     them: the reference for cinfer's bf16 KV codec
and tests/fixtures/MANIFEST.json summarises them (geometry, quantization, logits stats).

Everything is deterministic (numpy Generator seeded from the fixture name).

The quantization / packing / safetensors code is plain numpy, so it can be checked anywhere:
    /usr/bin/python3 tools/make_fixtures.py --selftest
Building the fixtures needs torch + transformers (5.x), which live on the GPU machine only.
Through the device tool (`run`), CPU torch is enough:
    cd <repo root> && PYTHONUNBUFFERED=1 python3 tools/make_fixtures.py --out $OUT/fx \
      && tar czf $OUT/fixtures.tgz -C $OUT/fx . && rm -rf $OUT/fx
then, here: mkdir -p tests/fixtures && tar xzf <files_at>/fixtures.tgz -C tests/fixtures
Locally (when torch/transformers are installed):
    python3 tools/make_fixtures.py --out tests/fixtures
Only some fixtures (a base name also builds its quantized variants):
    python3 tools/make_fixtures.py --out DIR --only qwen35
The Qwen3.5 fixtures (qwen35, qwen35-q4g64, qwen35-q8g32) also record in MANIFEST.json how far
transformers' own cached path (chunked prefill, then recurrent single steps) is from its uncached
logits; their MANIFEST entries are merged by hand when built with --only.
"""
import argparse
import copy
import json
import os
import re
import struct
import sys
import traceback
import zlib

import numpy as np

N_IDS = 48
F32 = np.float32

# ----------------------------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------------------------
COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, hidden_act="silu")

BASE_FIXTURES = [
    dict(name="llama", model_type="llama", kw=dict(
        vocab_size=256, num_hidden_layers=2, intermediate_size=128, head_dim=16,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    dict(name="llama3-tied", model_type="llama", kw=dict(
        vocab_size=320, num_hidden_layers=2, intermediate_size=192, head_dim=16,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})),
    dict(name="llama-linear", model_type="llama", legacy_rope=True, kw=dict(
        vocab_size=288, num_hidden_layers=3, intermediate_size=128, head_dim=16,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    dict(name="mistral", model_type="mistral", kw=dict(
        vocab_size=384, num_hidden_layers=2, intermediate_size=192, head_dim=32,
        rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    dict(name="qwen2", model_type="qwen2", kw=dict(
        vocab_size=448, num_hidden_layers=2, intermediate_size=128,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    dict(name="qwen3", model_type="qwen3", kw=dict(
        vocab_size=512, num_hidden_layers=3, intermediate_size=192, head_dim=32,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
]

# Gemma fixtures: complete kwargs (no COMMON), sliding window W = 8 and 64 prompt ids (8 W), so
# windows slide many times; offset-norm families store zero-centred norm weights.
GEMMA_IDS = 64
GEMMA_COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    hidden_activation="gelu_pytorch_tanh", sliding_window=8, pad_token_id=0,
                    eos_token_id=1, bos_token_id=2)
GEMMA_FIXTURES = [
    dict(name="gemma2", model_type="gemma2", norm_offset=True, n_ids=GEMMA_IDS, quant=[], kw=dict(
        vocab_size=256, num_hidden_layers=4, intermediate_size=128, query_pre_attn_scalar=24,
        attn_logit_softcapping=20.0, final_logit_softcapping=15.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    dict(name="gemma3", model_type="gemma3_text", norm_offset=True, n_ids=GEMMA_IDS,
         quant=[("q4g64", 4, 64)], kw=dict(
        vocab_size=320, num_hidden_layers=6, intermediate_size=128, query_pre_attn_scalar=16,
        final_logit_softcapping=None,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    dict(name="gemma4", model_type="gemma4_text", n_ids=GEMMA_IDS, quant=[], kw=dict(
        vocab_size=384, num_hidden_layers=6, intermediate_size=128, global_head_dim=32,
        attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    dict(name="gemma4-ple", model_type="gemma4_text", n_ids=GEMMA_IDS, quant=[], kw=dict(
        vocab_size=352, num_hidden_layers=6, intermediate_size=96, global_head_dim=32,
        attention_k_eq_v=False, hidden_size_per_layer_input=16, vocab_size_per_layer_input=352,
        num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    dict(name="gemma4-moe", model_type="gemma4_text", n_ids=GEMMA_IDS, quant=[], kw=dict(
        vocab_size=288, num_hidden_layers=4, intermediate_size=64, global_head_dim=32,
        attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "proportional",
                                            "partial_rotary_factor": 0.25,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
]
N_GREEDY = 16  # greedy continuation length stored in greedy.txt

# Qwen3.5 hybrid (gated DeltaNet + gated full attention): COMMON geometry, partial RoPE (8 of 32
# dims), zero-centred (offset) norms except linear_attn.norm (plain). 80 prompt ids, so the
# reference prefill runs its chunked delta rule over two 64-token chunks. The quantized variants
# are stored in the MLX layout (conv1d [C, Kc, 1], offset norms with the +1 folded in, bf16) with
# linear_attn.in_proj_qkv at 8 bits, as shipped MLX Qwen3.5 checkpoints do.
QWEN35_IDS = 80
QWEN35_FIXTURES = [
    dict(name="qwen35", model_type="qwen3_5_text", norm_offset=True, n_ids=QWEN35_IDS,
         mlx_quant_layout=True, quant=[("q4g64", 4, 64), ("q8g32", 8, 32)], kw=dict(
        vocab_size=256, num_hidden_layers=4, intermediate_size=128, head_dim=32,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25})),
]

# Quantized variants: (suffix, bits, group_size); per-fixture module overrides.
QUANT_VARIANTS = [("q4g64", 4, 64), ("q8g32", 8, 32)]
QUANT_OVERRIDES = {
    "qwen3-q4g64": {"model.embed_tokens": {"bits": 8, "group_size": 64}},
    "qwen35-q4g64": {"model.layers.0.linear_attn.in_proj_qkv": {"bits": 8, "group_size": 64},
                     "model.layers.2.linear_attn.in_proj_qkv": {"bits": 8, "group_size": 64}},
    "llama-q8g32": {"model.layers.0.mlp.down_proj": False},
}

STD_MATRIX = 0.15   # attention / MLP weights
STD_EMBED = 0.25    # embedding and untied lm_head
STD_NORM = 0.3      # norm weights = 1 + N(0, STD_NORM)
STD_BIAS = 0.3


def seed_of(name):
    return zlib.crc32(name.encode()) & 0xFFFFFFFF


# ----------------------------------------------------------------------------------------------
# bf16 helpers (round to nearest even, as torch's .to(torch.bfloat16))
# ----------------------------------------------------------------------------------------------
def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    assert np.all(np.isfinite(np.asarray(x, dtype=F32)))
    r = ((u >> 16) & 1) + 0x7FFF
    return ((u + r) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def round_bf16(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


# ----------------------------------------------------------------------------------------------
# MLX affine quantization (docs/models.md §2)
# ----------------------------------------------------------------------------------------------
def quantize(w, bits, group):
    """w: f32 [..., in]. Returns codes uint32 [..., in], s f32, bias f32 [..., in/group]
    (s and bias NOT yet rounded to the storage dtype)."""
    w = np.asarray(w, dtype=F32)
    assert w.shape[-1] % group == 0
    shp = w.shape
    wg = w.reshape(-1, shp[-1] // group, group)
    n = F32(2 ** bits - 1)
    lo = wg.min(axis=-1)
    hi = wg.max(axis=-1)
    s = np.maximum((hi - lo) / n, F32(1e-7)).astype(F32)
    use_lo = np.abs(lo) > np.abs(hi)
    edge = np.where(use_lo, lo, hi).astype(F32)
    s = np.where(use_lo, s, -s).astype(F32)
    q0 = np.rint(edge / s).astype(F32)
    nz = q0 != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        s_edge = (edge / np.where(nz, q0, F32(1))).astype(F32)
    s = np.where(nz, s_edge, s).astype(F32)
    bias = np.where(nz, edge, F32(0)).astype(F32)
    code = np.rint((wg - bias[..., None]) / s[..., None]).astype(F32)
    code = np.clip(code, 0, n).astype(np.uint32)
    return (code.reshape(shp), s.reshape(shp[:-1] + (shp[-1] // group,)),
            bias.reshape(shp[:-1] + (shp[-1] // group,)))


def pack_codes(codes, bits):
    """codes uint [..., in] -> uint32 [..., in*bits/32]: each row a little-endian bit stream,
    element c at bits [c*bits, c*bits+bits)."""
    codes = np.asarray(codes, dtype=np.uint32)
    shp = codes.shape
    assert (shp[-1] * bits) % 32 == 0
    assert codes.max(initial=0) < (1 << bits)
    bitarr = ((codes[..., None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8)
    bitarr = bitarr.reshape(shp[:-1] + (shp[-1] * bits,))
    by = np.packbits(bitarr, axis=-1, bitorder="little")
    return np.ascontiguousarray(by).view("<u4").astype(np.uint32).reshape(
        shp[:-1] + (shp[-1] * bits // 32,))


def unpack_codes(packed, bits, n_in):
    """Independent word/shift implementation of the same rule (for b dividing 32), and a generic
    byte-stream path for other b."""
    packed = np.asarray(packed, dtype=np.uint32)
    shp = packed.shape
    if 32 % bits == 0:
        per = 32 // bits
        sh = (np.arange(per, dtype=np.uint32) * bits)
        c = (packed[..., None] >> sh) & np.uint32((1 << bits) - 1)
        c = c.reshape(shp[:-1] + (shp[-1] * per,))
    else:
        by = packed.astype("<u4").view(np.uint8).reshape(shp[:-1] + (shp[-1] * 4,))
        c = np.zeros(shp[:-1] + (n_in,), dtype=np.uint32)
        for i in range(n_in):
            v = np.zeros(shp[:-1], dtype=np.uint32)
            for k in range(bits):
                bit = i * bits + k
                v |= ((by[..., bit // 8] >> (bit % 8)) & 1).astype(np.uint32) << k
            c[..., i] = v
    assert c.shape[-1] == n_in
    return c


def dequantize(codes, scales_f32, biases_f32, group):
    codes = np.asarray(codes)
    s = np.repeat(np.asarray(scales_f32, dtype=F32), group, axis=-1)
    b = np.repeat(np.asarray(biases_f32, dtype=F32), group, axis=-1)
    return ((s * codes.astype(F32)).astype(F32) + b).astype(F32)


# ----------------------------------------------------------------------------------------------
# safetensors (minimal writer/reader; dtypes BF16 (stored as uint16 bits), U32, F32)
# ----------------------------------------------------------------------------------------------
_ST_NP = {"BF16": "<u2", "U32": "<u4", "F32": "<f4"}


def st_write(path, tensors):
    """tensors: name -> (dtype_str, ndarray). Writes names sorted."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        raw = np.ascontiguousarray(arr, dtype=_ST_NP[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    (hl,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hl])
    base = 8 + hl
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        arr = np.frombuffer(data[base + b:base + en], dtype=_ST_NP[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], arr.copy())
    return out


# ----------------------------------------------------------------------------------------------
# Weight generation and quantized file construction (numpy only)
# ----------------------------------------------------------------------------------------------
def is_norm(name):
    return re.search(r"norm(_\d+)?\.weight$", name) is not None


def gen_weights(specs, seed, norm_offset=False):
    """specs: list of (name, shape) in a fixed order. Returns name -> f32 array already rounded
    to bf16 (the values stored in the file). norm_offset: norms are applied as (1 + w), so the
    stored weights are zero-centred (Gemma 2/3)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in specs:
        if name.endswith("linear_attn.norm.weight"):
            w = 1.0 + rng.normal(0.0, STD_NORM, shape)  # gated RMSNorm: plain, never offset
        elif name.endswith("linear_attn.A_log"):
            w = np.log(rng.uniform(0.1, 2.0, shape))  # decay rates exp(A_log) in [0.1, 2]
        elif name.endswith("linear_attn.dt_bias"):
            w = 1.0 + rng.normal(0.0, STD_NORM, shape)
        elif is_norm(name):
            w = (0.0 if norm_offset else 1.0) + rng.normal(0.0, STD_NORM, shape)
        elif name.endswith("layer_scalar"):
            w = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("router.scale") or name.endswith("per_expert_scale"):
            w = 1.0 + rng.normal(0.0, STD_NORM, shape)
        elif len(shape) == 3:
            w = rng.normal(0.0, STD_MATRIX, shape)
        elif name.endswith(".bias"):
            w = rng.normal(0.0, STD_BIAS, shape)
        elif len(shape) == 2:
            std = STD_EMBED if ("embed_tokens" in name or name.startswith("lm_head")) else STD_MATRIX
            if "router.proj" in name:
                std = 1.0  # decisive expert choices: no near-ties in the top-k
            w = rng.normal(0.0, std, shape)
        else:
            raise ValueError("unexpected parameter %s %s" % (name, shape))
        out[name] = round_bf16(w.astype(F32))
    return out


def quantizable(name, arr):
    return (name.endswith(".weight") and arr.ndim == 2 and not is_norm(name)
            and not name.endswith("conv1d.weight"))


def is_qwen35_offset_norm(name):
    """The Qwen3.5 norms applied as (1 + w): every RMSNorm except the gated linear_attn.norm."""
    return is_norm(name) and not name.endswith("linear_attn.norm.weight")


def qwen35_to_mlx(weights):
    """HF-layout Qwen3.5 weights -> the MLX conversion's layout: conv1d [C, 1, Kc] -> [C, Kc, 1],
    offset norms stored as bf16(1 + w). Values stay bf16-representable f32."""
    out = {}
    for name, w in weights.items():
        if name.endswith("conv1d.weight"):
            assert w.ndim == 3 and w.shape[1] == 1, (name, w.shape)
            out[name] = np.ascontiguousarray(np.transpose(w, (0, 2, 1)))
        elif is_qwen35_offset_norm(name):
            out[name] = round_bf16((F32(1.0) + w).astype(F32))
        else:
            out[name] = w
    return out


def qwen35_from_mlx(weights):
    """Inverse of qwen35_to_mlx for the reference model (exact: bf16(1 + w) - 1 is an f32)."""
    out = {}
    for name, w in weights.items():
        if name.endswith("conv1d.weight"):
            assert w.ndim == 3 and w.shape[2] == 1, (name, w.shape)
            out[name] = np.ascontiguousarray(np.transpose(w, (0, 2, 1)))
        elif is_qwen35_offset_norm(name):
            out[name] = (w - F32(1.0)).astype(F32)
            assert np.array_equal((F32(1.0) + out[name]).astype(F32), w), name
        else:
            out[name] = w
    return out


def module_qparams(module, qmap):
    """Lookup rule of docs/models.md §2: exact path, else default. None = unquantized."""
    if module in qmap:
        o = qmap[module]
        if o is False:
            return None
        return (o.get("bits", qmap["bits"]), o.get("group_size", qmap["group_size"]))
    return (qmap["bits"], qmap["group_size"])


def build_quantized(weights, qmap):
    """weights: name -> f32 (bf16-representable). Returns (file_tensors, ref_weights, info):
    file_tensors name -> (dtype, array) for st_write; ref_weights name -> f32 weights the
    reference model must use (dequantized with the stored bf16 scales/biases)."""
    tensors, ref, info = {}, {}, {}
    for name, w in weights.items():
        if not quantizable(name, w):
            tensors[name] = ("BF16", f32_to_bf16_bits(w))
            ref[name] = w
            continue
        module = name[:-len(".weight")]
        qp = module_qparams(module, qmap)
        if qp is None:
            tensors[name] = ("BF16", f32_to_bf16_bits(w))
            ref[name] = w
            info[module] = "unquantized"
            continue
        bits, group = qp
        codes, s, bias = quantize(w, bits, group)
        s_bits, b_bits = f32_to_bf16_bits(s), f32_to_bf16_bits(bias)
        tensors[module + ".weight"] = ("U32", pack_codes(codes, bits))
        tensors[module + ".scales"] = ("BF16", s_bits)
        tensors[module + ".biases"] = ("BF16", b_bits)
        ref[name] = dequantize(codes, bf16_bits_to_f32(s_bits), bf16_bits_to_f32(b_bits), group)
        info[module] = (bits, group)
    return tensors, ref, info


def dequant_from_file(path, qmap, shapes):
    """Self-check path: read the saved file back and rebuild every weight from it alone.
    shapes: name -> original [out, in] shape of each weight."""
    t = st_read(path)
    out = {}
    for name, (dt, arr) in t.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        if name.endswith(".weight") and (name[:-7] + ".scales") in t:
            module = name[:-7]
            assert dt == "U32", name
            sdt, s = t[module + ".scales"]
            bdt, b = t[module + ".biases"]
            assert sdt == "BF16" and bdt == "BF16"
            n_out, n_in = shapes[name]
            bits = arr.shape[-1] * 32 // n_in
            group = n_in // s.shape[-1]
            assert (bits, group) == module_qparams(module, qmap), (name, bits, group)
            assert arr.shape == (n_out, n_in * bits // 32) and s.shape == (n_out, n_in // group)
            assert b.shape == s.shape
            codes = unpack_codes(arr, bits, n_in)
            out[name] = dequantize(codes, bf16_bits_to_f32(s), bf16_bits_to_f32(b), group)
        else:
            assert dt == "BF16", name
            out[name] = bf16_bits_to_f32(arr)
    return out


def make_qmap(bits, group, overrides):
    q = {"group_size": group, "bits": bits}
    q.update(copy.deepcopy(overrides))
    return q


# ----------------------------------------------------------------------------------------------
# numpy self-test (runs without torch)
# ----------------------------------------------------------------------------------------------
def selftest():
    rng = np.random.default_rng(1)
    # bf16 rounding: ties to even and a few exact cases
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, 3.140625, 1e-3], dtype=F32)
    # 1 + 2^-8 is a tie between 1 and 1+2^-7 -> even (1.0); 1 + 3*2^-8 -> tie -> 1 + 2^-6
    assert round_bf16(x)[0] == 1.0 and round_bf16(x)[1] == 1.0
    assert round_bf16(x)[2] == F32(1.015625), round_bf16(x)[2]
    assert round_bf16(x)[3] == -2.5
    # pack/unpack round trips, including the generic stream path for odd bit widths
    for bits in (2, 3, 4, 5, 6, 8):
        n_in = 64 if bits in (3, 5, 6) else 128
        codes = rng.integers(0, 1 << bits, size=(7, n_in)).astype(np.uint32)
        p = pack_codes(codes, bits)
        assert p.shape == (7, n_in * bits // 32)
        assert np.array_equal(unpack_codes(p, bits, n_in), codes), bits
    # explicit layout: 4-bit row 0..15 -> words 0x76543210, 0xFEDCBA98
    p = pack_codes(np.arange(16, dtype=np.uint32)[None], 4)
    assert p[0, 0] == 0x76543210 and p[0, 1] == 0xFEDCBA98, [hex(v) for v in p[0]]
    p = pack_codes(np.array([[1, 2, 3, 255]], dtype=np.uint32), 8)
    assert p[0, 0] == 0xFF030201
    # quantize rule properties
    for bits, group in ((4, 64), (8, 32), (4, 32), (8, 64), (4, 128)):
        n = 2 ** bits - 1
        w = round_bf16((rng.normal(0, 0.15, (33, 256)) + rng.normal(0, 0.05, (33, 1))).astype(F32))
        codes, s, b = quantize(w, bits, group)
        assert codes.max() <= n
        wg = w.reshape(33, -1, group)
        lo, hi = wg.min(-1), wg.max(-1)
        edge = np.where(np.abs(lo) > np.abs(hi), lo, hi)
        assert np.array_equal(b, edge)                      # bias is the larger-magnitude edge
        # the edge is hit exactly with the f32 s/bias; codes include 0 (the edge itself)
        dq = dequantize(codes, s, b, group).reshape(33, -1, group)
        assert np.all(codes.reshape(33, -1, group).min(-1) == 0)
        # inside the representable range the error is <= |s|/2; the clamp at the far end (after
        # s is re-derived from the rounded q0) can cost up to one step |s|
        err = np.abs(dq - wg).max(-1)
        assert np.all(err <= np.abs(s) * (1 + 1e-5) + 1e-7), (bits, group, (err / np.abs(s)).max())
        inside = (wg - b[..., None]) / s[..., None] <= n + 0.5
        assert np.all(np.abs(dq - wg)[inside] <= np.repeat(np.abs(s)[..., None], group, -1)[inside]
                      * 0.5 * (1 + 1e-5) + 1e-7)
        # sign rule: s > 0 when lo is the edge, s < 0 otherwise
        assert np.all((s > 0) == (np.abs(lo) > np.abs(hi)))
        # stored (bf16) scale/bias dequant stays close
        dq2 = dequantize(codes, round_bf16(s), round_bf16(b), group).reshape(33, -1, group)
        rel = np.abs(dq2 - wg).max() / np.abs(wg).max()
        assert rel < (0.15 if bits == 4 else 0.01), (bits, group, rel)
    # a hand-checked group: w = [-1, 0.5, 0, 0.25] with bits 2 (n = 3), group 4
    c, s, b = quantize(np.array([[-1.0, 0.5, 0.0, 0.25]], dtype=F32), 2, 4)
    # lo=-1 hi=.5: s=.5, edge=lo, q0=rint(-2)=-2, s=.5, bias=-1 -> codes rint([0,3,2,2.5]) = 0,3,2,2
    assert s[0, 0] == 0.5 and b[0, 0] == -1.0 and c.tolist() == [[0, 3, 2, 2]], (s, b, c)
    # hi the edge: w = [1, -0.5, 0, 0.25], 2 bits: s=-.5 q0=rint(1/-.5)=-2 s=.5?? -> s=1/-2=-.5
    c, s, b = quantize(np.array([[1.0, -0.5, 0.0, 0.25]], dtype=F32), 2, 4)
    assert s[0, 0] == -0.5 and b[0, 0] == 1.0 and c.tolist() == [[0, 3, 2, 2]], (s, b, c)
    # all-zero group: s = -1e-7, q0 = 0 -> bias 0, codes 0
    c, s, b = quantize(np.zeros((1, 32), dtype=F32), 4, 32)
    assert b[0, 0] == 0 and np.all(c == 0) and s[0, 0] == F32(-1e-7)
    # end-to-end on fake parameter specs, with overrides and a tied-embedding model
    specs = [("model.embed_tokens.weight", (96, 64)),
             ("model.layers.0.input_layernorm.weight", (64,)),
             ("model.layers.0.self_attn.q_proj.weight", (128, 64)),
             ("model.layers.0.self_attn.q_proj.bias", (128,)),
             ("model.layers.0.self_attn.q_norm.weight", (32,)),
             ("model.layers.0.self_attn.o_proj.weight", (64, 128)),
             ("model.layers.0.mlp.down_proj.weight", (64, 192)),
             ("model.norm.weight", (64,)),
             ("lm_head.weight", (96, 64))]
    w = gen_weights(specs, 7)
    assert np.array_equal(w["model.norm.weight"], gen_weights(specs, 7)["model.norm.weight"])
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        for qmap in (make_qmap(4, 64, {"model.embed_tokens": {"bits": 8, "group_size": 64}}),
                     make_qmap(8, 32, {"model.layers.0.mlp.down_proj": False})):
            tens, ref, info = build_quantized(w, qmap)
            path = os.path.join(td, "m.safetensors")
            st_write(path, tens)
            back = dequant_from_file(path, qmap, {k: v.shape for k, v in w.items()})
            assert set(back) == set(ref)
            for k in ref:
                assert np.array_equal(back[k], ref[k]), k
            if qmap["bits"] == 4:
                assert info["model.embed_tokens"] == (8, 64) and info["lm_head"] == (4, 64)
                assert tens["model.embed_tokens.weight"][1].shape == (96, 16)
            else:
                assert info["model.layers.0.mlp.down_proj"] == "unquantized"
                assert tens["model.layers.0.mlp.down_proj.weight"][0] == "BF16"
                assert "model.layers.0.mlp.down_proj.scales" not in tens
            assert tens["model.layers.0.self_attn.q_proj.bias"][0] == "BF16"
            with open(path, "rb") as f:
                (hl,) = struct.unpack("<Q", f.read(8))
                assert hl % 8 == 0
    # Qwen3.5: DeltaNet parameters get their own distributions; the MLX layout round-trips
    specs = [("model.layers.0.linear_attn.conv1d.weight", (24, 1, 4)),
             ("model.layers.0.linear_attn.A_log", (4,)),
             ("model.layers.0.linear_attn.dt_bias", (4,)),
             ("model.layers.0.linear_attn.norm.weight", (8,)),
             ("model.layers.0.linear_attn.in_proj_qkv.weight", (24, 64)),
             ("model.layers.0.input_layernorm.weight", (64,)),
             ("model.layers.1.self_attn.q_norm.weight", (16,)),
             ("model.norm.weight", (64,))]
    w = gen_weights(specs, 11, norm_offset=True)
    assert np.all(w["model.layers.0.linear_attn.A_log"] <= np.log(2.0) + 1e-2)
    assert abs(float(w["model.layers.0.linear_attn.norm.weight"].mean()) - 1.0) < 0.5
    assert abs(float(w["model.norm.weight"].mean())) < 0.2
    assert not quantizable("model.layers.0.linear_attn.conv1d.weight",
                           w["model.layers.0.linear_attn.conv1d.weight"])
    m = qwen35_to_mlx(w)
    assert m["model.layers.0.linear_attn.conv1d.weight"].shape == (24, 4, 1)
    assert np.array_equal(m["model.layers.0.linear_attn.norm.weight"],
                          w["model.layers.0.linear_attn.norm.weight"])
    assert np.array_equal(m["model.norm.weight"], round_bf16(1.0 + w["model.norm.weight"]))
    back = qwen35_from_mlx(m)
    assert np.array_equal(back["model.layers.0.linear_attn.conv1d.weight"],
                          w["model.layers.0.linear_attn.conv1d.weight"])
    assert np.array_equal(back["model.layers.0.linear_attn.A_log"],
                          w["model.layers.0.linear_attn.A_log"])
    tens, ref, info = build_quantized(m, make_qmap(4, 64, {}))
    assert tens["model.layers.0.linear_attn.conv1d.weight"][0] == "BF16"
    assert tens["model.layers.0.linear_attn.in_proj_qkv.weight"][0] == "U32"
    print("selftest OK")


# ----------------------------------------------------------------------------------------------
# torch / transformers part
# ----------------------------------------------------------------------------------------------
def spec_inv_freq(rp, head_dim):
    """inv_freq per docs/models.md §3.1 for default / linear / llama3 (f32 power, reciprocal)."""
    theta = F32(rp.get("rope_theta", 10000.0))
    d = head_dim
    w0 = (F32(1.0) / (theta ** (np.arange(0, d, 2).astype(F32) / F32(d)))).astype(F32)
    t = rp.get("rope_type", rp.get("type", "default"))
    if t == "default":
        return w0
    if t == "linear":
        return (w0 / F32(rp["factor"])).astype(F32)
    if t == "llama3":
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        L0 = rp["original_max_position_embeddings"]
        lam = 2 * np.pi / w0.astype(np.float64)
        out = []
        for w, l in zip(w0.astype(np.float64), lam):
            if l > L0 / lo:
                out.append(w / f)
            elif l < L0 / hi:
                out.append(w)
            else:
                s = (L0 / l - lo) / (hi - lo)
                out.append((1 - s) * w / f + s * w)
        return np.array(out, dtype=F32)
    raise ValueError(t)


def torch_kernels_only(model):
    """Qwen3.5: transformers may route the DeltaNet convolution and delta rule to hub / FLA
    kernels (GPU-only); the fixtures are computed with its own torch functions, which the
    decorators keep as __wrapped__."""
    import importlib
    module = importlib.import_module(type(model).__module__)
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                 "causal_conv1d_fn", "causal_conv1d_update"):
        f = getattr(module, name, None)
        while f is not None and hasattr(f, "__wrapped__"):
            f = f.__wrapped__
            setattr(module, name, f)


class Ctx:
    def __init__(self):
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
        self.torch = torch
        self.tf = transformers
        self.AutoConfig = AutoConfig
        self.AutoModel = AutoModelForCausalLM
        torch.set_num_threads(min(8, os.cpu_count() or 1))
        print("torch", torch.__version__, "transformers", transformers.__version__)

    def build_model(self, cfg):
        cfg = copy.deepcopy(cfg)
        try:
            cfg._attn_implementation = "eager"
        except Exception:
            pass
        try:
            m = self.AutoModel.from_config(cfg, attn_implementation="eager")
        except TypeError:
            m = self.AutoModel.from_config(cfg)
        m = m.float().eval()
        torch_kernels_only(m)
        impl = getattr(m.config, "_attn_implementation", None)
        if impl != "eager" and hasattr(m, "set_attn_implementation"):
            m.set_attn_implementation("eager")
            impl = getattr(m.config, "_attn_implementation", None)
        assert impl == "eager", "attention implementation is %r" % impl
        return m

    def load_config(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            d = json.load(f)
        d.pop("quantization", None)
        d.pop("quantization_config", None)
        import tempfile
        with tempfile.TemporaryDirectory() as td:
            with open(os.path.join(td, "config.json"), "w") as f:
                json.dump(d, f)
            return self.AutoConfig.from_pretrained(td)

    def param_specs(self, model, tied):
        specs = []
        for name, p in model.named_parameters():
            if tied and name.startswith("lm_head"):
                continue
            specs.append((name, tuple(p.shape)))
        seen = set(n for n, _ in specs)
        for name, t in model.state_dict().items():
            if name in seen or (tied and name.startswith("lm_head")) or "rotary_emb" in name:
                continue
            if t.is_floating_point():
                specs.append((name, tuple(t.shape)))
        names = [n for n, _ in specs]
        assert len(names) == len(set(names))
        return specs

    def load_weights(self, model, weights, tied):
        torch = self.torch
        sd = {k: torch.from_numpy(np.array(v, dtype=F32)) for k, v in weights.items()}
        res = model.load_state_dict(sd, strict=False)
        missing = [k for k in res.missing_keys if not (tied and k.startswith("lm_head"))]
        assert not missing and not res.unexpected_keys, (missing, res.unexpected_keys)
        params = dict(model.named_parameters(remove_duplicate=False))
        state = model.state_dict()
        for k, v in sd.items():
            t = params[k].data if k in params else state[k]
            assert torch.equal(t, v), k
            assert t.dtype == torch.float32
        if tied:
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        else:
            assert "lm_head.weight" in sd

    def logits(self, model, ids):
        torch = self.torch
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        lg = out.logits[0].float().cpu().numpy().astype(F32)
        assert lg.shape == (len(ids), model.config.vocab_size), lg.shape
        assert np.all(np.isfinite(lg))
        return lg

    def logits_kvbf16(self, model, ids):
        """Logits with K (after RoPE) and V rounded to bf16 where attention reads them: the
        semantics of cinfer's bf16 KV codec (docs/kv-cache.md §2.1) on an otherwise f32 model.
        The model module's eager attention function is wrapped (so masks are built exactly as for
        eager); the wrapper without rounding is checked to reproduce the plain logits exactly."""
        import importlib
        torch = self.torch
        module = importlib.import_module(type(model).__module__)
        eager = module.eager_attention_forward

        def make(round_kv):
            def attend(mod, query, key, value, attention_mask, *args, **kwargs):
                if round_kv:
                    key = key.to(torch.bfloat16).float()
                    value = value.to(torch.bfloat16).float()
                return eager(mod, query, key, value, attention_mask, *args, **kwargs)
            return attend

        plain = self.logits(model, ids)
        try:
            module.eager_attention_forward = make(False)
            assert np.array_equal(self.logits(model, ids), plain), "attention wrapper not exact"
            module.eager_attention_forward = make(True)
            lg = self.logits(model, ids)
        finally:
            module.eager_attention_forward = eager
        assert np.abs(lg - plain).max() > 0, "bf16 KV rounding changed nothing"
        return lg

    def greedy(self, model, ids, n_new):
        """Greedy continuation without a KV cache: n_new argmax steps over the growing prompt.
        Returns (tokens, smallest top-1 margin seen)."""
        torch = self.torch
        seq = list(ids)
        margin = float("inf")
        with torch.no_grad():
            for _ in range(n_new):
                out = model(input_ids=torch.tensor([seq], dtype=torch.long), use_cache=False)
                last = out.logits[0, -1].float()
                top = torch.topk(last, 2).values
                margin = min(margin, float(top[0] - top[1]))
                seq.append(int(torch.argmax(last)))
        return seq[len(ids):], margin

    def inv_freq(self, model):
        return model.model.rotary_emb.inv_freq.float().cpu().numpy()


def write_greedy(folder, tokens):
    with open(os.path.join(folder, "greedy.txt"), "w") as f:
        f.write(",".join(str(int(i)) for i in tokens) + "\n")


def write_common(folder, ids, logits, logits_kvbf16):
    with open(os.path.join(folder, "ids.txt"), "w") as f:
        f.write(",".join(str(int(i)) for i in ids) + "\n")
    np.ascontiguousarray(logits, dtype="<f4").tofile(os.path.join(folder, "logits.f32"))
    np.ascontiguousarray(logits_kvbf16, dtype="<f4").tofile(
        os.path.join(folder, "logits_kvbf16.f32"))


def write_json(path, d):
    with open(path, "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")


def stats(lg):
    return {"mean_abs": float(np.abs(lg).mean()), "std": float(lg.std()),
            "max_abs": float(np.abs(lg).max()),
            "argmax_distinct": int(len(set(lg.argmax(-1).tolist())))}


def folder_size(folder):
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def make_base(ctx, fx, out, warnings):
    torch = ctx.torch
    name = fx["name"]
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    kw = dict(GEMMA_COMMON if fx["model_type"].startswith("gemma") else COMMON)
    kw.update(copy.deepcopy(fx["kw"]))
    cfg0 = ctx.AutoConfig.for_model(fx["model_type"], **kw)
    cfg0.save_pretrained(folder)
    with open(os.path.join(folder, "config.json")) as f:
        saved = json.load(f)
    if fx.get("legacy_rope"):
        rp = saved.pop("rope_parameters")
        saved.pop("rope_scaling", None)
        saved["rope_theta"] = float(rp["rope_theta"])
        saved["rope_scaling"] = {"type": rp["rope_type"], "factor": float(rp["factor"])}
        write_json(os.path.join(folder, "config.json"), saved)

    # the reference config is what the saved file says
    cfg = ctx.load_config(folder)
    model = ctx.build_model(cfg)
    tied = bool(kw["tie_word_embeddings"])
    specs = ctx.param_specs(model, tied)
    seed = seed_of(name)
    weights = gen_weights(specs, seed, fx.get("norm_offset", False))
    # cross-check our bf16 rounding against torch's
    for k, v in weights.items():
        tb = torch.from_numpy(np.array(v)).to(torch.bfloat16).float().numpy()
        assert np.array_equal(tb, v), k
    st_write(os.path.join(folder, "model.safetensors"),
             {k: ("BF16", f32_to_bf16_bits(v)) for k, v in weights.items()})
    # load back with the official reader, upcast to f32
    from safetensors.torch import load_file
    back = load_file(os.path.join(folder, "model.safetensors"))
    assert set(back) == set(weights)
    wb = {}
    for k, t in back.items():
        assert t.dtype == torch.bfloat16, k
        wb[k] = t.float().numpy()
        assert np.array_equal(wb[k], weights[k]), k
    ctx.load_weights(model, wb, tied)
    rng = np.random.default_rng(seed ^ 0x5EED)
    ids = rng.integers(0, kw["vocab_size"], fx.get("n_ids", N_IDS)).tolist()
    lg = ctx.logits(model, ids)
    write_common(folder, ids, lg, ctx.logits_kvbf16(model, ids))
    greedy, margin = ctx.greedy(model, ids, N_GREEDY)
    write_greedy(folder, greedy)
    if margin < 1e-3:
        warnings.append("%s: greedy top-1 margin %.3g" % (name, margin))

    # checks: RoPE table vs the spec formula; scaling actually changes the output
    rp_eff, rel = None, None
    try:
        rp_eff = json.loads(json.dumps(getattr(model.config, "rope_parameters", None) or {}))
        inv = ctx.inv_freq(model)
        hd = kw.get("head_dim", kw["hidden_size"] // kw["num_attention_heads"])
        if fx["model_type"].startswith("qwen3_5"):  # partial RoPE: d_r = D * factor
            hd = int(hd * fx["kw"]["rope_parameters"].get("partial_rotary_factor", 0.25))
        want = spec_inv_freq(fx["kw"]["rope_parameters"], hd)
        rel = float(np.max(np.abs(inv - want) / want))
        msg = "%s: rope %s inv_freq max rel diff vs spec %.3g" % (name, rp_eff, rel)
        print(msg)
        if rel > 1e-5:
            warnings.append(msg)
        att = getattr(model.model.rotary_emb, "attention_scaling", 1.0)
        if float(att) != 1.0:
            warnings.append("%s: attention_scaling %r" % (name, att))
    except Exception as e:  # noqa
        warnings.append("%s: rope check failed: %r" % (name, e))
    info = {"rope_effective": rp_eff, "inv_freq_rel_diff_vs_spec": rel, "greedy_margin": margin}
    if fx["kw"]["rope_parameters"].get("rope_type", "default") != "default":
        kw2 = dict(kw)
        kw2["rope_parameters"] = {"rope_type": "default",
                                  "rope_theta": fx["kw"]["rope_parameters"]["rope_theta"]}
        m2 = ctx.build_model(ctx.AutoConfig.for_model(fx["model_type"], **kw2))
        ctx.load_weights(m2, wb, tied)
        d = float(np.abs(ctx.logits(m2, ids) - lg).max())
        info["max_logit_diff_vs_unscaled_rope"] = d
        print("%s: max |logit diff| vs unscaled rope = %.4g" % (name, d))
        if d < 1e-2:
            warnings.append("%s: rope scaling barely changes logits (%.3g)" % (name, d))
    if fx.get("legacy_rope"):
        # the same model built from the new-style config object must agree exactly
        m3 = ctx.build_model(cfg0)
        ctx.load_weights(m3, wb, tied)
        d = float(np.abs(ctx.logits(m3, ids) - lg).max())
        print("%s: legacy-config vs rope_parameters-config logits max diff %.3g" % (name, d))
        info["legacy_vs_new_config_logit_diff"] = d
        if d != 0.0:
            # transformers did not read the legacy form as linear x4: keep the file (it is what we
            # test) but take the reference from the equivalent rope_parameters config
            warnings.append("%s: legacy config parsed differently (diff %g); reference taken "
                            "from the rope_parameters config" % (name, d))
            lg = ctx.logits(m3, ids)
            want = spec_inv_freq(fx["kw"]["rope_parameters"], kw["head_dim"])
            assert np.max(np.abs(ctx.inv_freq(m3) - want) / want) < 1e-5
            write_common(folder, ids, lg, ctx.logits_kvbf16(m3, ids))
    if fx["model_type"].startswith("qwen3_5"):
        info.update(qwen35_checks(ctx, model, ids, lg, warnings, name))
    names = [n for n, _ in specs]
    info["n_params"] = int(sum(int(np.prod(s)) for _, s in specs))
    info["tensors"] = len(names)
    return dict(folder=folder, cfg=cfg, weights=wb, ids=ids, tied=tied, specs=specs, kw=kw,
                logits_stats=stats(lg), info=info, names=names)


def qwen35_checks(ctx, model, ids, lg, warnings, name):
    """Reference-side checks of the hybrid model: the cached path (chunked prefill of a prefix,
    then one token at a time through the recurrent form) reproduces the uncached logits; the
    layer types are the ones asked for; the DeltaNet kernels are transformers' torch code."""
    torch = ctx.torch
    info = {"layer_types": list(model.config.layer_types)}
    mod = __import__(type(model).__module__, fromlist=["x"])
    info["fla_available"] = bool(getattr(mod, "is_flash_linear_attention_available",
                                         lambda *a: False)())
    try:
        split = 37
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids[:split]], dtype=torch.long), use_cache=True)
            rows = [out.logits[0].float().numpy()]
            past = out.past_key_values
            for t in ids[split:]:
                out = model(input_ids=torch.tensor([[t]], dtype=torch.long),
                            past_key_values=past, use_cache=True)
                past = out.past_key_values
                rows.append(out.logits[0].float().numpy())
        cached = np.concatenate(rows, axis=0)
        d = float(np.abs(cached - lg).max())
        info["cached_vs_uncached_max_diff"] = d
        print("%s: cached (prefill %d + recurrent steps) vs uncached logits max diff %.3g"
              % (name, split, d))
        if d > 1e-3:
            warnings.append("%s: cached path differs from uncached by %.3g" % (name, d))
    except Exception as e:  # noqa
        warnings.append("%s: cached-path check failed: %r" % (name, e))
    return info


def make_quant(ctx, base, fx, suffix, bits, group, out):
    name = "%s-%s" % (fx["name"], suffix)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    overrides = QUANT_OVERRIDES.get(name, {})
    qmap = make_qmap(bits, group, overrides)
    src = base["weights"]
    if fx.get("mlx_quant_layout"):
        src = qwen35_to_mlx(src)
    tens, ref, qinfo = build_quantized(src, qmap)
    path = os.path.join(folder, "model.safetensors")
    st_write(path, tens)
    # self-check: dequantize again from the file alone, must equal the reference weights
    back = dequant_from_file(path, qmap, {k: v.shape for k, v in src.items()})
    assert set(back) == set(ref) == set(base["weights"])
    for k in ref:
        assert np.array_equal(back[k], ref[k]), k
    if fx.get("mlx_quant_layout"):
        ref = qwen35_from_mlx(ref)  # the reference model takes the HF layout
    for m, p in qinfo.items():
        if m in overrides:
            want = overrides[m]
            assert (p == "unquantized") if want is False else (p == (want["bits"], want["group_size"]))
    # official reader (U32 support depends on the safetensors/torch versions)
    try:
        from safetensors.torch import load_file
        t = load_file(path)
        assert set(t) == set(tens)
        for k, (dt, arr) in tens.items():
            tv = t[k]
            if dt == "U32":
                got = tv.view(ctx.torch.int32).numpy().view(np.uint32)
            else:
                got = tv.view(ctx.torch.int16).numpy().view(np.uint16)
            assert np.array_equal(got, arr), k
        official = "ok"
    except Exception as e:  # noqa
        official = "skipped: %r" % (e,)
    print("%s: official safetensors reader %s" % (name, official))
    err = max(float(np.abs(ref[k] - base["weights"][k]).max()) for k in ref)
    # config = base config + quantization map
    with open(os.path.join(base["folder"], "config.json")) as f:
        cj = json.load(f)
    cj["quantization"] = copy.deepcopy(qmap)
    cj["quantization_config"] = copy.deepcopy(qmap)
    write_json(os.path.join(folder, "config.json"), cj)
    model = ctx.build_model(ctx.load_config(folder))
    ctx.load_weights(model, ref, base["tied"])
    lg = ctx.logits(model, base["ids"])
    write_common(folder, base["ids"], lg, ctx.logits_kvbf16(model, base["ids"]))
    write_greedy(folder, ctx.greedy(model, base["ids"], N_GREEDY)[0])
    info = {"quantization": qmap, "max_abs_weight_err_vs_bf16": err,
            "official_reader": official,
            "modules": {m: (list(p) if isinstance(p, tuple) else p) for m, p in sorted(qinfo.items())}}
    return dict(folder=folder, logits_stats=stats(lg), info=info)


def run(out, only=None):
    ctx = Ctx()
    os.makedirs(out, exist_ok=True)
    manifest = {}
    warnings, failures = [], []
    for fx in BASE_FIXTURES + GEMMA_FIXTURES + QWEN35_FIXTURES:
        if only and not any(o == fx["name"] or o.startswith(fx["name"] + "-") for o in only):
            continue
        try:
            base = make_base(ctx, fx, out, warnings)
        except Exception:
            failures.append(fx["name"])
            traceback.print_exc()
            continue
        entries = [(fx["name"], base)]
        for suffix, bits, group in fx.get("quant", QUANT_VARIANTS):
            qn = "%s-%s" % (fx["name"], suffix)
            if only and qn not in only and fx["name"] not in only:
                continue
            try:
                entries.append((qn, make_quant(ctx, base, fx, suffix, bits, group, out)))
            except Exception:
                failures.append(qn)
                traceback.print_exc()
        for n, e in entries:
            size = folder_size(e["folder"])
            manifest[n] = {"model_type": fx["model_type"], "base": fx["name"],
                           "n_ids": fx.get("n_ids", N_IDS),
                           "vocab_size": base["kw"]["vocab_size"], "bytes": size,
                           "logits": e["logits_stats"], **e["info"]}
            print("%-22s %7d bytes  mean|logit| %.3f  std %.3f  max %.2f  distinct argmax %d"
                  % (n, size, e["logits_stats"]["mean_abs"], e["logits_stats"]["std"],
                     e["logits_stats"]["max_abs"], e["logits_stats"]["argmax_distinct"]))
            if size > 1 << 20:
                warnings.append("%s is %d bytes (> 1 MiB)" % (n, size))
    write_json(os.path.join(out, "MANIFEST.json"), manifest)
    for fx in BASE_FIXTURES:
        p = os.path.join(out, fx["name"], "config.json")
        if fx["name"] in ("llama3-tied", "llama-linear") and os.path.exists(p):
            print("==== %s/config.json" % fx["name"])
            print(open(p).read())
    for w in warnings:
        print("WARN", w)
    total = sum(m["bytes"] for m in manifest.values())
    print("fixtures: %d, total %d bytes, failures: %s" % (len(manifest), total, failures or "none"))
    return 1 if failures else 0


def greedy_existing(src, out):
    """Adds greedy.txt to already-built fixture folders under src (written to out/<name>.txt):
    the model is rebuilt from the folder's own config.json and weight file."""
    ctx = Ctx()
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        folder = os.path.join(src, name)
        if not os.path.exists(os.path.join(folder, "config.json")):
            continue
        with open(os.path.join(folder, "config.json")) as f:
            cj = json.load(f)
        model = ctx.build_model(ctx.load_config(folder))
        tied = bool(cj.get("tie_word_embeddings", False))
        shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        path = os.path.join(folder, "model.safetensors")
        if "quantization" in cj:
            weights = dequant_from_file(path, cj["quantization"], shapes)
        else:
            weights = {k: bf16_bits_to_f32(a) for k, (dt, a) in st_read(path).items()}
        ctx.load_weights(model, weights, tied)
        with open(os.path.join(folder, "ids.txt")) as f:
            ids = [int(x) for x in f.read().strip().split(",")]
        want = np.fromfile(os.path.join(folder, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
        if not np.array_equal(ctx.logits(model, ids), want):
            print("WARN %s: rebuilt model differs from logits.f32; no greedy written" % name)
            continue
        tokens, margin = ctx.greedy(model, ids, N_GREEDY)
        write_greedy(out, tokens)
        os.rename(os.path.join(out, "greedy.txt"), os.path.join(out, name + ".txt"))
        print("%s: greedy %s (margin %.3g)" % (name, tokens, margin))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=None, help="output folder (e.g. tests/fixtures)")
    ap.add_argument("--only", nargs="*", help="fixture names to build")
    ap.add_argument("--selftest", action="store_true", help="numpy-only checks, no torch")
    ap.add_argument("--greedy-existing", metavar="SRC",
                    help="write greedy continuations of the fixtures in SRC to --out/<name>.txt")
    a = ap.parse_args()
    if a.selftest:
        selftest()
        return 0
    if not a.out:
        ap.error("--out is required")
    if a.greedy_existing:
        return greedy_existing(a.greedy_existing, a.out)
    selftest()
    return run(a.out, a.only)


if __name__ == "__main__":
    sys.exit(main())
