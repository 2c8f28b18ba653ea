#!/usr/bin/env python3
"""Convert a cinfer/Hugging Face Llama, Gemma 3, Gemma 4 or Qwen3.5 text folder (config.json +
safetensors: bf16, or MLX affine q4/q8) to a GGUF that llama.cpp runs, as f32, bf16, q8_0 or q4_0,
so both engines benchmark the very same model.

Usage: gguf_from_hf.py MODEL_DIR OUT.gguf [--type f32|bf16|q8_0|q4_0] [--tokenizer DIR]

Needs only numpy and llama.cpp's gguf-py (found through $LLAMA_CPP_DIR, default
/work/llama.cpp). Metadata and tensor names follow llama.cpp's own converter
(convert_hf_to_gguf.py, conversion/*.py) at the reference commit:
- llama / mistral (arch "llama"): Q/K projections are permuted as LlamaModel.permute does
  (llama.cpp's rope pairs adjacent dims, HF pairs halves), and llama3 rope scaling becomes the
  rope_freqs tensor as in LlamaModel.generate_extra_tensors.
- gemma3_text (arch "gemma3", Gemma3Model): NeoX rope, so no permutation; every norm weight
  gets +1 (Gemma's RMSNorm scales by 1 + w, llama.cpp's by w; done in f32, exact, where the
  converter adds in bf16); sliding window, SWA rope base and final softcap as metadata, the
  sliding-window pattern left to llama.cpp's default of 6 as the converter does (written only
  when layer_types has another period).
- gemma4_text (arch "gemma4", Gemma4Model) and qwen3_5_text (arch "qwen35", Qwen3_5TextModel):
  tensor names through gguf-py's own name map; the per-architecture transforms and metadata are
  described at gemma4_plan / qwen35_plan below.
MLX affine-quantized matrices (uint32 codes + per-group scales and biases) are dequantized to f32
first (W = scale * q + bias), then written in the requested type (f32 keeps them exact).
Every 2-D weight, the embedding included, gets the requested type ("pure" quantization, so bits
per weight match cinfer's q8/q4 at group 64: 8.5 and 4.5); norms and rope_freqs stay f32. The
vocabulary is a synthetic SentencePiece-style list of vocab_size entries (the family's special
tokens at their ids, 256 byte tokens, then dummies): enough for llama-bench, which feeds random
token ids. With --tokenizer DIR (a folder holding a Llama 3 tokenizer.json and
tokenizer_config.json; llama arch only) the real byte-level BPE vocabulary is written instead,
as the converter's _set_vocab_gpt2 does: tokenizer.ggml.model "gpt2", pre "llama-bpe", the
tokens with their types (added tokens CONTROL when special), the merges, bos/eos ids and the
chat template (gguf-py's SpecialVocab), so llama-server can tokenize text and chat; the same
works for a Gemma 4 folder whose tokenizer.json is a byte-level BPE with the Llama 3 pre-tokenizer
(the bundled starter models).
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

    def __init__(self, folder, quant=None):
        self.entries = {}
        self.quant = quant or {}  # config.json "quantization": defaults + per-module overrides
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
        """The logical shape: a quantized matrix's columns are groups x group_size."""
        if self.is_quantized(name):
            rows, groups = self.entries[name[:-len("weight")] + "scales"][1]["shape"]
            return (rows, groups * self.group_size(name))
        return tuple(self.entries[name][1]["shape"])

    def is_quantized(self, name):
        return (name.endswith(".weight") and self.entries[name][1]["dtype"] == "U32"
                and name[:-len("weight")] + "scales" in self.entries)

    def group_size(self, name):
        module = self.quant.get(name[:-len(".weight")])
        if isinstance(module, dict) and "group_size" in module:
            return module["group_size"]
        return self.quant.get("group_size", 64)

    def dequantized(self, name, r0=0, r1=None):
        """Rows [r0, r1) of an MLX affine-quantized matrix as f32: W = scale * q + bias per group
        of group_size columns; q are `bits`-bit codes packed low bits first into uint32 words."""
        base = name[:-len("weight")]
        words = self._array(name)[r0:r1]
        scales = to_f32(np.asarray(self._array(base + "scales")[r0:r1]))
        biases = to_f32(np.asarray(self._array(base + "biases")[r0:r1]))
        rows, cols = words.shape[0], self.shape(name)[1]
        bits = words.shape[1] * 32 // cols
        if bits not in (2, 3, 4, 5, 6, 8) or words.shape[1] * 32 != cols * bits:
            raise SystemExit(f"{name}: {words.shape[1]} words do not hold {cols} codes")
        # Bit stream of each row, little-endian: code j occupies bits [j * bits, (j + 1) * bits).
        stream = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=1,
                               bitorder="little").reshape(rows, cols, bits)
        codes = (stream.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(axis=2)
        gs = self.group_size(name)
        return (codes.astype(np.float32) * np.repeat(scales, gs, axis=1)
                + np.repeat(biases, gs, axis=1))

    def _array(self, name):
        data, info = self.entries[name]
        dtypes = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "U32": np.uint32}
        if info["dtype"] not in dtypes:
            raise SystemExit(f"{name}: dtype {info['dtype']} unsupported")
        begin, end = info["data_offsets"]
        return data[begin:end].view(dtypes[info["dtype"]]).reshape(info["shape"])

    def raw(self, name):
        """The stored array (bf16 as uint16, f16/f32 as themselves), memory-mapped; a quantized
        matrix dequantized to f32."""
        if self.is_quantized(name):
            return self.dequantized(name)
        if self.entries[name][1]["dtype"] not in ("BF16", "F16", "F32"):
            raise SystemExit(f"{name}: dtype {self.entries[name][1]['dtype']} unsupported "
                             "(want BF16/F16/F32, or MLX-quantized U32 with scales and biases)")
        return self._array(name)


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


def synthetic_vocab(n_vocab, specials):
    """(tokens, types): `specials` {id: (text, type)} at their ids, then 256 byte tokens and
    dummy pieces in the free ids, in order. A vocabulary too small for all 256 bytes (tiny test
    models) gets as many as fit, newline first (llama.cpp looks it up)."""
    if n_vocab < len(specials) + 2 or max(specials) >= n_vocab:
        raise SystemExit("vocab_size too small for the synthetic vocabulary")
    tokens, types = [None] * n_vocab, [gguf.TokenType.NORMAL] * n_vocab
    for i, (text, kind) in specials.items():
        tokens[i], types[i] = text, kind
    free = [i for i in range(n_vocab) if tokens[i] is None]
    byte_order = range(256) if len(free) > 256 else [10] + [b for b in range(256) if b != 10]
    for b, i in zip(byte_order, free[:min(256, len(free) - 1)]):
        tokens[i], types[i] = f"<0x{b:02X}>", gguf.TokenType.BYTE
    for n, i in enumerate(free[min(256, len(free) - 1):]):
        tokens[i] = f"\u2581t{n}"
    return tokens, types


# The Llama 3 pre-tokenizer regex; the converter recognises the family by hashing the tokens of
# a check text (needs transformers), this script by the regex itself.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def does_token_look_special(token):
    """conversion/base.py TextModel.does_token_look_special."""
    return (token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (token.startswith("<|") and token.endswith("|>"))
            or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
            or (token.startswith("<unused") and token.endswith(">")))


def write_bpe_vocab(w, tok_dir, n_vocab):
    """TextModel._set_vocab_gpt2 / get_vocab_base for a Llama 3 tokenizer.json, without
    transformers: the vocabulary plus added tokens by id ([PADi] UNUSED for holes), added
    tokens CONTROL when special or special-looking, else USER_DEFINED; then SpecialVocab
    (merges, bos/eos, add_bos, chat template) exactly as the converter calls it."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        raise SystemExit("--tokenizer: only byte-level BPE tokenizer.json files are handled")
    splits = [p for p in (tj.get("pre_tokenizer") or {}).get("pretokenizers", [])
              if p.get("type") == "Split"]
    if len(splits) != 1 or splits[0].get("pattern", {}).get("Regex") != LLAMA3_SPLIT:
        raise SystemExit("--tokenizer: not the Llama 3 pre-tokenizer (only llama-bpe is handled)")
    reverse = {i: t for t, i in model["vocab"].items()}
    special = {}
    for tok in tj.get("added_tokens", []):
        reverse[tok["id"]] = tok["content"]
        special[tok["content"]] = tok.get("special", False)
    if max(reverse) >= n_vocab:
        raise SystemExit(f"--tokenizer: token id {max(reverse)} >= vocab_size {n_vocab}")
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in special:
            if special[token] or does_token_look_special(token):
                types.append(gguf.TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(tok_dir, load_merges=True).add_to_gguf(w)


def swa_period(cfg, n_layer):
    """Period P of the sliding/full layout in llama.cpp's form (layer il slides iff
    il % P < P - 1), 1 when every layer is full; SystemExit when llama.cpp cannot express it."""
    types = cfg.get("layer_types")
    if not types:
        p = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
        types = ["full_attention" if (i + 1) % p == 0 else "sliding_attention"
                 for i in range(n_layer)]
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding):
        return 1
    for p in range(2, n_layer + 2):  # n_layer + 1: every layer slides
        if all(s == (i % p < p - 1) for i, s in enumerate(sliding)):
            return p
    raise SystemExit("layer_types is not 'every P-th layer full': llama.cpp cannot load it")


# ==== Per-architecture plans: (gguf suffix, HF module under layers.N., how to transform) ====
# Transforms: "q"/"k" permute Q/K rows (Llama rope layout), "norm+1" adds 1 (Gemma norms).

LLAMA_LAYER = [
    ("attn_norm", "input_layernorm", None),
    ("attn_q", "self_attn.q_proj", "q"),
    ("attn_k", "self_attn.k_proj", "k"),
    ("attn_v", "self_attn.v_proj", None),
    ("attn_output", "self_attn.o_proj", None),
    ("ffn_norm", "post_attention_layernorm", None),
    ("ffn_gate", "mlp.gate_proj", None),
    ("ffn_up", "mlp.up_proj", None),
    ("ffn_down", "mlp.down_proj", None),
]

GEMMA3_LAYER = [
    ("attn_norm", "input_layernorm", "norm+1"),
    ("attn_q", "self_attn.q_proj", None),
    ("attn_k", "self_attn.k_proj", None),
    ("attn_v", "self_attn.v_proj", None),
    ("attn_output", "self_attn.o_proj", None),
    ("attn_q_norm", "self_attn.q_norm", "norm+1"),
    ("attn_k_norm", "self_attn.k_norm", "norm+1"),
    ("post_attention_norm", "post_attention_layernorm", "norm+1"),
    ("ffn_norm", "pre_feedforward_layernorm", "norm+1"),
    ("ffn_gate", "mlp.gate_proj", None),
    ("ffn_up", "mlp.up_proj", None),
    ("ffn_down", "mlp.down_proj", None),
    ("post_ffw_norm", "post_feedforward_layernorm", "norm+1"),
]

ARCHS = {  # model_type -> (gguf arch, per-layer plan, final norm transform)
    "llama": ("llama", LLAMA_LAYER, None),
    "mistral": ("llama", LLAMA_LAYER, None),
    "gemma3_text": ("gemma3", GEMMA3_LAYER, "norm+1"),
    "gemma3": ("gemma3", GEMMA3_LAYER, "norm+1"),
}


def write_llama_metadata(w, cfg, geo, tok_dir=None):
    """LlamaModel.set_gguf_parameters + the vocabulary (synthetic SentencePiece, or the real
    BPE one of tok_dir)."""
    theta, llama3 = rope_params(cfg)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-5))
    if cfg.get("head_dim"):
        w.add_key_length(geo["head_dim"])
        w.add_value_length(geo["head_dim"])
    w.add_rope_dimension_count(geo["head_dim"])
    if tok_dir is not None:
        write_bpe_vocab(w, tok_dir, geo["n_vocab"])
    else:
        tokens, types = synthetic_vocab(geo["n_vocab"], {
            0: ("<unk>", gguf.TokenType.UNKNOWN),
            1: ("<s>", gguf.TokenType.CONTROL),
            2: ("</s>", gguf.TokenType.CONTROL)})
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores([-float(i) for i in range(len(tokens))])
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
    if llama3 is not None:
        return {"rope_freqs.weight": llama3_rope_factors(theta, geo["head_dim"], llama3)}
    return {}


def write_gemma3_metadata(w, cfg, geo):
    """TextModel + Gemma3Model.set_gguf_parameters + Gemma's SentencePiece specials."""
    head_dim, n_layer = geo["head_dim"], geo["n_layer"]
    if cfg.get("attn_logit_softcapping") is not None:
        raise SystemExit("Gemma 3 has no attn_logit_softcapping (convert_hf_to_gguf asserts)")
    if cfg.get("attention_bias"):
        raise SystemExit("attention biases are not handled by this converter")
    # llama.cpp's attention scale (llama_model_gemma3::load_arch_hparams) must match
    # query_pre_attn_scalar^-0.5, which cinfer and transformers use.
    lcpp_scalar = geo["n_embd"] / geo["n_head"] if n_layer == 62 else head_dim
    if cfg.get("query_pre_attn_scalar", 256) != lcpp_scalar:
        raise SystemExit(f"query_pre_attn_scalar {cfg.get('query_pre_attn_scalar')}: llama.cpp "
                         f"would scale queries by {lcpp_scalar}^-0.5 instead")
    rp = cfg.get("rope_parameters") or {}
    full = rp.get("full_attention") or {"rope_type": "default",
                                        "rope_theta": cfg.get("rope_theta", 1e6)}
    local = rp.get("sliding_attention") or {"rope_type": "default",
                                            "rope_theta": cfg.get("rope_local_base_freq", 1e4)}
    if local.get("rope_type", "default") != "default":
        raise SystemExit("sliding-layer rope scaling is not handled (llama.cpp ignores it too)")
    kind = full.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    elif kind != "default":
        raise SystemExit(f"rope type {kind} not handled by this converter")
    w.add_rope_freq_base(full.get("rope_theta", 1e6))
    w.add_rope_freq_base_swa(local.get("rope_theta", 1e4))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    period = swa_period(cfg, n_layer)
    if period != 1:
        w.add_sliding_window(cfg["sliding_window"])
        if period != 6:  # llama.cpp's default; the converter never writes the key
            w.add_sliding_window_pattern(period)
    eos = cfg.get("eos_token_id", 1)
    eos = eos if isinstance(eos, list) else [eos]
    bos, pad, unk = cfg.get("bos_token_id", 2), cfg.get("pad_token_id", 0), 3
    specials = {pad: ("<pad>", gguf.TokenType.CONTROL), bos: ("<bos>", gguf.TokenType.CONTROL),
                unk: ("<unk>", gguf.TokenType.UNKNOWN)}
    for i in eos:
        specials[i] = ("<eos>" if i == eos[0] else "<end_of_turn>", gguf.TokenType.CONTROL)
    tokens, types = synthetic_vocab(geo["n_vocab"], specials)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_unk_token_id(unk)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos[0])
    w.add_pad_token_id(pad)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    return {}


METADATA = {"llama": write_llama_metadata, "gemma3": write_gemma3_metadata}


# ==== Gemma 4 and Qwen3.5: tensors named through gguf-py's map, as the converter does ====


class Tensor:
    """One GGUF tensor to write: its name, numpy shape, whether it is a matrix that takes the
    requested type (else f32), and a loader returning the array (bf16 bits as uint16, or f32)."""

    def __init__(self, name, shape, matrix, load):
        self.name, self.shape, self.matrix, self.load = name, tuple(shape), matrix, load


def mapped_tensors(st, arch_enum, n_layer, transform):
    """Every source tensor (MLX scales/biases folded into their weight) mapped to its GGUF name by
    gguf-py; transform(hf_name, gguf_name, shape) -> (shape, matrix, fn or None) where fn turns
    the loaded array into the one written."""
    tmap = gguf.get_tensor_name_map(arch_enum, n_layer)
    out = []
    for sname in sorted(st.names(), key=natural_key):
        if sname.endswith((".scales", ".biases")) and sname.rsplit(".", 1)[0] + ".weight" in st:
            continue
        name = sname
        for prefix in ("model.language_model.", "language_model.model."):
            if name.startswith(prefix):
                name = "model." + name[len(prefix):]
        if name.startswith("language_model.lm_head."):
            name = name[len("language_model."):]
        if name.endswith(("layer_scalar", "A_log")):
            name += ".weight" if name.endswith("layer_scalar") else ""
        if name.endswith(".dt_bias"):
            name = name[:-len("dt_bias")] + "dt_proj.bias"
        gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise SystemExit(f"{sname}: no GGUF name for this tensor in llama.cpp's "
                             f"{arch_enum.name} architecture")
        shape, matrix, fn = transform(name, gname, st.shape(sname))

        def load(sname=sname, fn=fn):
            arr = st.raw(sname)
            return fn(arr) if fn else arr
        out.append(Tensor(gname, shape, matrix, load))
    return out


def natural_key(name):
    """Sort layers numerically (layers.2 before layers.10), as the converter writes them."""
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def f32_vec(arr, add=0.0):
    return to_f32(np.asarray(arr)).reshape(-1) + np.float32(add)


def gemma4_layers(cfg, n_layer):
    """(is_sliding per layer, head_dim, n_kv_heads per layer) as cinfer and transformers read
    them: layer_types (the last layer is always full), head dims and KV heads of full layers
    from per_layer_config entries or the flat global_head_dim / num_global_key_value_heads."""
    types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % cfg.get("sliding_window_pattern", 6) == 0
        else "sliding_attention" for i in range(n_layer)]
    sliding = [t == "sliding_attention" for t in types[:n_layer]]
    sliding[-1] = False
    head_dim = [cfg.get("head_dim", 256)] * n_layer
    kv = [cfg.get("num_key_value_heads", cfg["num_attention_heads"])] * n_layer
    per_layer = cfg.get("per_layer_config")
    if per_layer:
        for key, entry in per_layer.items():
            i = int(key)
            if entry.get("num_attention_heads", cfg["num_attention_heads"]) != \
                    cfg["num_attention_heads"]:
                raise SystemExit(f"per_layer_config[{key}] changes num_attention_heads")
            head_dim[i] = entry.get("head_dim", head_dim[i])
            kv[i] = entry.get("num_key_value_heads", kv[i])
    else:
        for i in range(n_layer):
            if not sliding[i]:
                head_dim[i] = cfg.get("global_head_dim", 512)
                if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
                    kv[i] = cfg["num_global_key_value_heads"]
    for kind in (True, False):
        dims = {head_dim[i] for i in range(n_layer) if sliding[i] == kind}
        if len(dims) > 1:
            raise SystemExit(f"{'sliding' if kind else 'full'} layers with different head_dim "
                             f"{sorted(dims)}: llama.cpp has one head size per layer kind")
    return sliding, head_dim, kv


def gemma4_plan(w, cfg, st, geo, tok_dir):
    """Gemma4Model (conversion/gemma.py): norms as they are (Gemma 4's RMSNorm scales by w),
    layer_scalar -> layer_output_scale, full layers' K doubles as V when v_proj is absent
    (attention_k_eq_v; llama.cpp then takes V = K, as transformers does); a rope_freqs tensor
    makes the full layers' "proportional" RoPE: all head_dim dims go to ggml's NeoX rope with
    exponent over head_dim, and the pairs past partial_rotary_factor get frequency divisor 1e30
    (unrotated). Metadata: head dims and RoPE dims per layer kind, the sliding pattern as a bool
    array, head_count_kv per layer when it varies, softcap, window, both RoPE bases."""
    n_layer = geo["n_layer"]
    for key in ("enable_moe_block", "use_double_wide_mlp", "attention_bias"):
        if cfg.get(key):
            raise SystemExit(f"{key} is not handled by this converter")
    if cfg.get("hidden_size_per_layer_input"):
        raise SystemExit("per-layer inputs (hidden_size_per_layer_input) are not handled")
    sliding, head_dim, kv = gemma4_layers(cfg, n_layer)
    full_dim = next((head_dim[i] for i in range(n_layer) if not sliding[i]))
    swa_dim = next((head_dim[i] for i in range(n_layer) if sliding[i]), full_dim)
    rp = cfg.get("rope_parameters") or {}
    full = rp.get("full_attention") or {"rope_type": "proportional",
                                        "partial_rotary_factor": 0.25, "rope_theta": 1e6}
    local = rp.get("sliding_attention") or {"rope_type": "default", "rope_theta": 1e4}
    if local.get("rope_type", "default") != "default":
        raise SystemExit("sliding-layer rope scaling is not handled")
    if full.get("rope_type", "default") not in ("proportional", "default"):
        raise SystemExit(f"full-layer rope type {full.get('rope_type')} is not handled")
    partial = full.get("partial_rotary_factor", 1.0)
    factor = full.get("factor", 1.0)
    n_rot = int(full_dim * partial / 2)
    rope_freqs = np.array([factor] * n_rot + [1e30] * (full_dim // 2 - n_rot), np.float32)

    w.add_head_count_kv(kv[0] if len(set(kv)) == 1 else kv)
    w.add_rope_freq_base(full.get("rope_theta", 1e6))
    w.add_rope_freq_base_swa(local.get("rope_theta", 1e4))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(full_dim)
    w.add_value_length(full_dim)
    w.add_key_length_swa(swa_dim)
    w.add_value_length_swa(swa_dim)
    w.add_rope_dimension_count(full_dim)
    w.add_rope_dimension_count_swa(int(swa_dim * local.get("partial_rotary_factor", 1.0)))
    w.add_sliding_window(cfg.get("sliding_window", 512))
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(cfg.get("num_kv_shared_layers", 0))
    w.add_embedding_length_per_layer_input(0)
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    write_vocab(w, cfg, geo, tok_dir, gemma=True)

    def transform(name, gname, shape):
        if len(shape) == 1:
            return shape, False, f32_vec
        return shape, True, None

    tensors = mapped_tensors(st, gguf.MODEL_ARCH.GEMMA4, n_layer, transform)
    tensors.insert(1, Tensor("rope_freqs.weight", rope_freqs.shape, False, lambda: rope_freqs))
    return tensors


def qwen35_plan(w, cfg, st, geo, tok_dir):
    """Qwen3_5TextModel (conversion/qwen.py): RMSNorm weights + 1 (Qwen3.5 scales by 1 + w)
    except the DeltaNet output norm (linear_attn.norm, plain w), unless the folder is an MLX
    conversion (conv1d stored [C, K, 1]), which has the +1 folded in already; A_log ->
    -exp(A_log) (ssm_a); dt_bias -> ssm_dt.bias; conv1d -> [C, K], kept f32; the full layers'
    q_proj keeps its per-head [query | gate] rows. When linear_num_value_heads >
    linear_num_key_heads the V heads are reordered from grouped by K head to tiled (rows of the
    V part of in_proj_qkv, of in_proj_z, in_proj_a/b, A_log, dt_bias, conv1d; columns of
    out_proj), as the converter's _LinearAttentionVReorderBase does for ggml's broadcast.
    Metadata: ssm conv kernel / state size (key head dim) / group count (K heads) / time-step
    rank (V heads) / inner size, the layer kinds (full_attention_interval, or recurrent_layers
    when not periodic), RoPE dims = head_dim x partial_rotary_factor and the M-RoPE sections
    (text positions make them equivalent to NeoX RoPE)."""
    n_layer = geo["n_layer"]
    if cfg.get("attention_bias"):
        raise SystemExit("attention biases are not handled by this converter")
    if cfg.get("num_experts") or cfg.get("mlp_only_layers"):
        raise SystemExit("Qwen3.5 MoE is not handled by this converter")
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    if dk != dv:
        raise SystemExit("llama.cpp's qwen35 needs linear_key_head_dim == linear_value_head_dim")
    if nv % nk:
        raise SystemExit("linear_num_value_heads must be a multiple of linear_num_key_heads")
    per_k = nv // nk
    types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0
        else "linear_attention" for i in range(n_layer)]
    recurrent = [t == "linear_attention" for t in types[:n_layer]]
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type", rp.get("type", "default")) != "default":
        raise SystemExit(f"rope type {rp.get('rope_type')} is not handled by this converter")
    theta = rp.get("rope_theta", cfg.get("rope_theta", 1e7))
    partial = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    sections = list(rp.get("mrope_section") or [11, 11, 10])
    sections = (sections + [0, 0, 0, 0])[:4]

    w.add_head_count_kv(cfg.get("num_key_value_heads", geo["n_head"]))
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_key_length(geo["head_dim"])
    w.add_value_length(geo["head_dim"])
    w.add_ssm_conv_kernel(cfg.get("linear_conv_kernel_dim", 4))
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(dv * nv)
    period = next((p for p in range(1, n_layer + 1)
                   if all(r == ((i + 1) % p != 0) for i, r in enumerate(recurrent))), None)
    if period is not None:
        w.add_full_attention_interval(period)
    else:
        w.add_array(f"{gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN35]}.attention."
                    "recurrent_layers", recurrent)
    w.add_rope_dimension_count(int(geo["head_dim"] * partial))
    w.add_rope_dimension_sections(sections)
    write_vocab(w, cfg, geo, tok_dir, gemma=False)

    def tiled(arr, axis, head):
        """Grouped-by-K-head V heads [k0: v0..v{r-1}, k1: ...] -> tiled [v0: k0, k1, ..]."""
        if per_k == 1:
            return arr
        arr = np.asarray(arr)
        shape = list(arr.shape)
        grouped = arr.reshape(shape[:axis] + [nk, per_k, head] + shape[axis + 1:])
        return np.ascontiguousarray(np.swapaxes(grouped, axis, axis + 1)).reshape(shape)

    # MLX conversions store conv1d as [C, K, 1] and fold the +1 into the norms already.
    convs = [st.shape(n) for n in st.names() if n.endswith("conv1d.weight")]
    norm_shift = 0.0 if any(c[-1] == 1 and c[1] != 1 for c in convs) else 1.0

    def transform(name, gname, shape):
        linear = ".linear_attn." in name
        if name.endswith(".A_log"):
            return shape, False, lambda a: tiled(-np.exp(f32_vec(a)), 0, 1)
        if name.endswith(".dt_proj.bias"):
            return shape, False, lambda a: tiled(f32_vec(a), 0, 1)
        if name.endswith("conv1d.weight"):
            # [C, 1, K] as transformers stores it, [C, K, 1] as MLX does: both are [C, K].
            qk, kernel = 2 * nk * dk, int(np.prod(shape[1:]))
            if len(shape) != 3 or 1 not in shape[1:]:
                raise SystemExit(f"{name}: unexpected conv1d shape {shape}")

            def conv(a):
                a = to_f32(np.asarray(a)).reshape(shape[0], kernel)
                return np.concatenate([a[:qk], tiled(a[qk:], 0, dv)])
            return (shape[0], kernel), False, conv
        if len(shape) == 1:
            shift = 0.0 if name.endswith("linear_attn.norm.weight") else norm_shift
            return shape, False, lambda a: f32_vec(a, shift)
        if linear and name.endswith("in_proj_qkv.weight"):
            qk = 2 * nk * dk
            return shape, True, lambda a: np.concatenate([np.asarray(a[:qk]),
                                                          tiled(a[qk:], 0, dv)])
        if linear and name.endswith("in_proj_z.weight"):
            return shape, True, lambda a: tiled(a, 0, dv)
        if linear and name.endswith(("in_proj_a.weight", "in_proj_b.weight")):
            return shape, True, lambda a: tiled(a, 0, 1)
        if linear and name.endswith("out_proj.weight"):
            return shape, True, lambda a: tiled(a, 1, dv)
        return shape, True, None

    return mapped_tensors(st, gguf.MODEL_ARCH.QWEN35, n_layer, transform)


def write_vocab(w, cfg, geo, tok_dir, gemma):
    """The real byte-level BPE vocabulary of tok_dir, else a synthetic one with the config's
    special-token ids (enough for llama-bench and token-id prompts)."""
    if tok_dir is not None:
        write_bpe_vocab(w, tok_dir, geo["n_vocab"])
        if gemma:  # Gemma4Model.set_vocab
            w.add_add_space_prefix(False)
            w.add_add_bos_token(True)
        return
    eos = cfg.get("eos_token_id", 1)
    eos = eos if isinstance(eos, list) else [eos]
    bos = cfg.get("bos_token_id", eos[0])
    specials = {}
    if gemma:
        specials[cfg.get("pad_token_id", 0)] = ("<pad>", gguf.TokenType.CONTROL)
    for i in eos:
        specials[i] = ("<eos>" if i == eos[0] else f"<eos{i}>", gguf.TokenType.CONTROL)
    if bos not in specials:
        specials[bos] = ("<bos>", gguf.TokenType.CONTROL)
    tokens, types = synthetic_vocab(geo["n_vocab"], specials)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos[0])
    w.add_add_bos_token(gemma)
    w.add_add_space_prefix(False)


MAPPED = {"gemma4_text": ("gemma4", gemma4_plan), "gemma4": ("gemma4", gemma4_plan),
          "qwen3_5_text": ("qwen35", qwen35_plan), "qwen3_5": ("qwen35", qwen35_plan)}


def legacy_tensors(cfg, st, geo, arch, layer_plan, final_norm_op, extra):
    """The Llama / Gemma 3 plan as Tensor entries."""
    n_head, n_head_kv = geo["n_head"], cfg.get("num_key_value_heads", geo["n_head"])

    def src(name):
        for prefix in ("model.", "model.language_model.", "language_model.model."):
            if prefix + name in st:
                return prefix + name
        raise SystemExit(f"missing tensor {name}")

    permutes = {"q": (n_head, n_head), "k": (n_head, n_head_kv)}
    plan = [("token_embd.weight", src("embed_tokens.weight"), None)]
    for i in range(geo["n_layer"]):
        plan += [(f"blk.{i}.{g}.weight", src(f"layers.{i}.{h}.weight"), op)
                 for g, h, op in layer_plan]
    plan.append(("output_norm.weight", src("norm.weight"), final_norm_op))
    tied = cfg.get("tie_word_embeddings", arch == "gemma3")
    for head in ("lm_head.weight", "language_model.lm_head.weight"):
        if head in st and not tied:
            plan.append(("output.weight", head, None))
            break
    if any(k.startswith(("model.layers.", "layers.")) and k.endswith(".bias") for k in st.names()):
        raise SystemExit("attention/MLP biases are not handled by this converter")
    tensors = [Tensor(g, a.shape, False, lambda a=a: a) for g, a in extra.items()]
    for gname, sname, op in plan:
        shape = st.shape(sname)
        if len(shape) == 1:
            tensors.append(Tensor(gname, shape, False,
                                  lambda s=sname, op=op: f32_vec(st.raw(s),
                                                                 1.0 if op == "norm+1" else 0)))
        elif op in permutes:
            tensors.append(Tensor(gname, shape, True,
                                  lambda s=sname, op=op: permute(np.asarray(st.raw(s)),
                                                                 *permutes[op])))
        else:
            tensors.append(Tensor(gname, shape, True, lambda s=sname: st.raw(s)))
    return tensors[len(extra):len(extra) + 1] + tensors[:len(extra)] + tensors[len(extra) + 1:]


def encode_2d(raw, qtype):
    """A 2-D weight (stored dtype) -> the bytes/array gguf-py writes, in row chunks."""
    if qtype == gguf.GGMLQuantizationType.BF16 and raw.dtype == np.uint16:
        return np.ascontiguousarray(raw)  # already bf16 bits
    parts = []
    for r0 in range(0, raw.shape[0], ROW_CHUNK):
        rows = to_f32(np.asarray(raw[r0:r0 + ROW_CHUNK]))
        if qtype == gguf.GGMLQuantizationType.BF16:
            parts.append(f32_to_bf16(rows))
        elif qtype == gguf.GGMLQuantizationType.F32:
            parts.append(rows)
        else:
            parts.append(gguf.quants.quantize(rows, qtype))
    return np.concatenate(parts, axis=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=["f32", "bf16", "q8_0", "q4_0"], default="bf16")
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="write the real byte-level BPE vocabulary of DIR/tokenizer.json "
                         "(Llama 3 pre-tokenizer; llama and gemma4 archs) instead of a "
                         "synthetic one")
    args = ap.parse_args()

    qtype, ftype = {
        "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
        "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    }[args.type]

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = {**cfg, **cfg.get("text_config", {})}
    model_type = cfg.get("model_type", "llama")
    if model_type not in ARCHS and model_type not in MAPPED:
        raise SystemExit(f"model_type {model_type} is not handled (want one of "
                         f"{', '.join(list(ARCHS) + list(MAPPED))})")
    arch = (MAPPED.get(model_type) or ARCHS[model_type])[0]
    n_layer = cfg["num_hidden_layers"]
    n_embd = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or (256 if arch == "gemma3" else n_embd // n_head)
    geo = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "head_dim": head_dim,
           "n_vocab": cfg["vocab_size"]}

    st = SafetensorsFolder(args.model_dir, cfg.get("quantization"))

    w = gguf.GGUFWriter(args.out, arch)
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    if model_type in MAPPED:
        tensors = MAPPED[model_type][1](w, cfg, st, geo, args.tokenizer)
    else:
        _, layer_plan, final_norm_op = ARCHS[model_type]
        w.add_head_count_kv(cfg.get("num_key_value_heads", n_head))
        if args.tokenizer is not None:
            if arch != "llama":
                raise SystemExit("--tokenizer is handled for the llama and gemma4 archs only")
            extra = write_llama_metadata(w, cfg, geo, args.tokenizer)
        else:
            extra = METADATA[arch](w, cfg, geo)
        tensors = legacy_tensors(cfg, st, geo, arch, layer_plan, final_norm_op, extra)
    w.add_file_type(ftype)
    w.add_vocab_size(geo["n_vocab"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # Declare every tensor first (sizes are known), then stream the data one tensor at a time.
    for t in tensors:
        if not t.matrix:
            w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), 4 * int(np.prod(t.shape)))
            continue
        if len(t.shape) != 2:
            raise SystemExit(f"{t.name}: a {len(t.shape)}-D matrix is not handled")
        block, tsize = gguf.GGML_QUANT_SIZES[qtype]
        if t.shape[-1] % block:
            raise SystemExit(f"{t.name}: {t.shape[-1]} columns not a multiple of {block}")
        nbytes = t.shape[0] * (t.shape[1] // block) * tsize
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float16), nbytes, raw_dtype=qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in tensors:
        arr = t.load()
        if tuple(arr.shape) != t.shape:
            raise SystemExit(f"{t.name}: loaded shape {arr.shape}, declared {t.shape}")
        if not t.matrix:
            w.write_tensor_data(np.ascontiguousarray(arr, dtype=np.float32))
            continue
        w.write_tensor_data(encode_2d(arr, qtype))
        print(f"  {t.name:32s} {args.type}", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
