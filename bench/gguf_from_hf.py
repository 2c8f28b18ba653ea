#!/usr/bin/env python3
"""Convert a cinfer/Hugging Face Llama folder (config.json + bf16 safetensors) to a GGUF that
llama.cpp runs, as bf16, q8_0 or q4_0, so both engines benchmark the very same model.

Usage: gguf_from_hf.py MODEL_DIR OUT.gguf [--type bf16|q8_0|q4_0]

Needs only numpy and llama.cpp's gguf-py (found through $LLAMA_CPP_DIR, default
/work/llama.cpp). Q/K projections are permuted exactly as convert_hf_to_gguf.py's
LlamaModel.permute does (llama.cpp's rope pairs adjacent dims, HF pairs halves), and llama3
rope scaling becomes the rope_freqs tensor as in LlamaModel.generate_extra_tensors. Every 2-D
weight, the embedding included, gets the requested type ("pure" quantization, so bits per
weight match cinfer's q8/q4 at group 64: 8.5 and 4.5); norms and rope_freqs stay f32. The
vocabulary is a synthetic SentencePiece-style list (<unk>, <s>, </s>, 256 byte tokens, then
dummies) of vocab_size entries: enough for llama-bench, which feeds random token ids.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

LLAMA_CPP_DIR = os.environ.get("LLAMA_CPP_DIR", "/work/llama.cpp")
sys.path.insert(0, os.path.join(LLAMA_CPP_DIR, "gguf-py"))
import gguf  # noqa: E402  (path set just above)

ROW_CHUNK = 4096  # rows converted/quantized at a time, to bound memory on big matrices


class SafetensorsFolder:
    """Lazily maps the tensors of model.safetensors or its sharded index."""

    def __init__(self, folder):
        self.entries = {}
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = ["model.safetensors"]
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                (hlen,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(hlen))
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + hlen)
            for tname, info in header.items():
                if tname != "__metadata__":
                    self.entries[tname] = (data, info)

    def __contains__(self, name):
        return name in self.entries

    def names(self):
        return list(self.entries)

    def shape(self, name):
        return tuple(self.entries[name][1]["shape"])

    def raw(self, name):
        """The stored array (bf16 as uint16, f16/f32 as themselves), memory-mapped."""
        data, info = self.entries[name]
        dtypes = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}
        if info["dtype"] not in dtypes:
            raise SystemExit(f"{name}: dtype {info['dtype']} unsupported (want BF16/F16/F32)")
        begin, end = info["data_offsets"]
        return data[begin:end].view(dtypes[info["dtype"]]).reshape(info["shape"])


def to_f32(arr):
    """bf16 (stored as uint16) or f16/f32 array -> float32."""
    if arr.dtype == np.uint16:
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def f32_to_bf16(arr):
    """float32 -> bf16 bits (round to nearest even, NaN kept quiet), as uint16."""
    n = arr.astype(np.float32).view(np.uint32)
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    r = ((n.astype(np.uint64) + (0x7FFF + ((n >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((n >> 16) | 0x40).astype(np.uint16), r)


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute: HF rotate-half layout -> llama.cpp's."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def rope_params(cfg):
    """(theta, llama3 scaling dict or None) from either config serialisation."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "full_attention" in rp:
        rp = rp["full_attention"]
    scaling = cfg.get("rope_scaling") or rp or {}
    theta = (rp or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = (scaling.get("rope_type") or scaling.get("type") or "default").lower()
    if kind == "llama3":
        return theta, scaling
    if kind not in ("default", "none"):
        raise SystemExit(f"rope type {kind} not handled by this converter")
    return theta, None


def llama3_rope_factors(theta, dim, s):
    """LlamaModel.generate_extra_tensors: per-frequency divisors for llama3 rope scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = s.get("factor", 8.0)
    low = s.get("low_freq_factor", 1.0)
    high = s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def encode_2d(raw, qtype):
    """A 2-D weight (stored dtype) -> the bytes/array gguf-py writes, in row chunks."""
    if qtype == gguf.GGMLQuantizationType.BF16 and raw.dtype == np.uint16:
        return np.ascontiguousarray(raw)  # already bf16 bits
    parts = []
    for r0 in range(0, raw.shape[0], ROW_CHUNK):
        rows = to_f32(np.asarray(raw[r0:r0 + ROW_CHUNK]))
        if qtype == gguf.GGMLQuantizationType.BF16:
            parts.append(f32_to_bf16(rows))
        else:
            parts.append(gguf.quants.quantize(rows, qtype))
    return np.concatenate(parts, axis=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=["bf16", "q8_0", "q4_0"], default="bf16")
    args = ap.parse_args()

    qtype, ftype = {
        "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    }[args.type]

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = {**cfg, **cfg.get("text_config", {})}
    if cfg.get("model_type", "llama") not in ("llama", "mistral"):
        raise SystemExit(f"model_type {cfg.get('model_type')} is not a llama")
    n_layer = cfg["num_hidden_layers"]
    n_embd = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or n_embd // n_head
    n_vocab = cfg["vocab_size"]
    theta, llama3 = rope_params(cfg)

    st = SafetensorsFolder(args.model_dir)

    def src(name):
        for prefix in ("model.", "model.language_model.", "language_model.model."):
            if prefix + name in st:
                return prefix + name
        raise SystemExit(f"missing tensor {name}")

    # (gguf name, source tensor name or None for generated ones, (n_head, n_head_kv) to permute)
    plan = [("token_embd.weight", src("embed_tokens.weight"), None)]
    for i in range(n_layer):
        p = f"layers.{i}."
        plan += [
            (f"blk.{i}.attn_norm.weight", src(p + "input_layernorm.weight"), None),
            (f"blk.{i}.attn_q.weight", src(p + "self_attn.q_proj.weight"), (n_head, n_head)),
            (f"blk.{i}.attn_k.weight", src(p + "self_attn.k_proj.weight"), (n_head, n_head_kv)),
            (f"blk.{i}.attn_v.weight", src(p + "self_attn.v_proj.weight"), None),
            (f"blk.{i}.attn_output.weight", src(p + "self_attn.o_proj.weight"), None),
            (f"blk.{i}.ffn_norm.weight", src(p + "post_attention_layernorm.weight"), None),
            (f"blk.{i}.ffn_gate.weight", src(p + "mlp.gate_proj.weight"), None),
            (f"blk.{i}.ffn_up.weight", src(p + "mlp.up_proj.weight"), None),
            (f"blk.{i}.ffn_down.weight", src(p + "mlp.down_proj.weight"), None),
        ]
    plan.append(("output_norm.weight", src("norm.weight"), None))
    tied = cfg.get("tie_word_embeddings", False)
    for head in ("lm_head.weight", "language_model.lm_head.weight"):
        if head in st and not tied:
            plan.append(("output.weight", head, None))
            break
    if any(k.startswith(("model.layers.", "layers.")) and ".bias" in k for k in st.names()):
        raise SystemExit("attention/MLP biases are not handled by this converter")

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    if cfg.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)
    w.add_vocab_size(n_vocab)
    w.add_rope_dimension_count(head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # Synthetic SentencePiece vocabulary.
    if n_vocab < 259 + 1:
        raise SystemExit("vocab_size must be at least 260 for the synthetic vocabulary")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(n_vocab)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    # Declare every tensor first (sizes are known), then stream the data one tensor at a time.
    extra = {}
    if llama3 is not None:
        extra["rope_freqs.weight"] = llama3_rope_factors(theta, head_dim, llama3)
        plan.insert(1, ("rope_freqs.weight", None, None))
    for gname, sname, _ in plan:
        if sname is None:
            arr = extra[gname]
            w.add_tensor_info(gname, arr.shape, arr.dtype, arr.nbytes)
            continue
        shape = st.shape(sname)
        if len(shape) == 1:
            w.add_tensor_info(gname, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            block, tsize = gguf.GGML_QUANT_SIZES[qtype]
            if shape[-1] % block:
                raise SystemExit(f"{sname}: {shape[-1]} columns not a multiple of {block}")
            nbytes = shape[0] * (shape[1] // block) * tsize
            w.add_tensor_info(gname, shape, np.dtype(np.float16), nbytes, raw_dtype=qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for gname, sname, perm in plan:
        if sname is None:
            w.write_tensor_data(extra[gname])
            continue
        raw = st.raw(sname)
        if raw.ndim == 1:
            w.write_tensor_data(to_f32(np.asarray(raw)))
            continue
        if perm is not None:
            raw = permute(np.asarray(raw), *perm)
        w.write_tensor_data(encode_2d(raw, qtype))
        print(f"  {gname:32s} {args.type}", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
