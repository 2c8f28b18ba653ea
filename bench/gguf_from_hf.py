#!/usr/bin/env python3
"""Convert a cinfer/Hugging Face Llama or Gemma 3 folder (config.json + bf16 safetensors) to a
GGUF that llama.cpp runs, as bf16, q8_0 or q4_0, so both engines benchmark the very same model.

Usage: gguf_from_hf.py MODEL_DIR OUT.gguf [--type bf16|q8_0|q4_0] [--tokenizer DIR]

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
Every 2-D weight, the embedding included, gets the requested type ("pure" quantization, so bits
per weight match cinfer's q8/q4 at group 64: 8.5 and 4.5); norms and rope_freqs stay f32. The
vocabulary is a synthetic SentencePiece-style list of vocab_size entries (the family's special
tokens at their ids, 256 byte tokens, then dummies): enough for llama-bench, which feeds random
token ids. With --tokenizer DIR (a folder holding a Llama 3 tokenizer.json and
tokenizer_config.json; llama arch only) the real byte-level BPE vocabulary is written instead,
as the converter's _set_vocab_gpt2 does: tokenizer.ggml.model "gpt2", pre "llama-bpe", the
tokens with their types (added tokens CONTROL when special), the merges, bos/eos ids and the
chat template (gguf-py's SpecialVocab), so llama-server can tokenize text and chat.
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


def synthetic_vocab(n_vocab, specials):
    """(tokens, types): `specials` {id: (text, type)} at their ids, then 256 byte tokens and
    dummy pieces in the free ids, in order."""
    if n_vocab < len(specials) + 256 + 1:
        raise SystemExit("vocab_size too small for the synthetic vocabulary")
    tokens, types = [None] * n_vocab, [gguf.TokenType.NORMAL] * n_vocab
    for i, (text, kind) in specials.items():
        tokens[i], types[i] = text, kind
    free = [i for i in range(n_vocab) if tokens[i] is None]
    for b, i in enumerate(free[:256]):
        tokens[i], types[i] = f"<0x{b:02X}>", gguf.TokenType.BYTE
    for n, i in enumerate(free[256:]):
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
    ap.add_argument("--tokenizer", metavar="DIR",
                    help="write the real Llama 3 BPE vocabulary of DIR/tokenizer.json "
                         "(llama arch only) instead of a synthetic one")
    args = ap.parse_args()

    qtype, ftype = {
        "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    }[args.type]

    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg = {**cfg, **cfg.get("text_config", {})}
    model_type = cfg.get("model_type", "llama")
    if model_type not in ARCHS:
        raise SystemExit(f"model_type {model_type} is not handled (want one of "
                         f"{', '.join(ARCHS)})")
    arch, layer_plan, final_norm_op = ARCHS[model_type]
    n_layer = cfg["num_hidden_layers"]
    n_embd = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    n_head_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or (256 if arch == "gemma3" else n_embd // n_head)
    geo = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "head_dim": head_dim,
           "n_vocab": cfg["vocab_size"]}

    st = SafetensorsFolder(args.model_dir)

    def src(name):
        for prefix in ("model.", "model.language_model.", "language_model.model."):
            if prefix + name in st:
                return prefix + name
        raise SystemExit(f"missing tensor {name}")

    # (gguf name, source tensor name or None for generated ones, transform)
    permutes = {"q": (n_head, n_head), "k": (n_head, n_head_kv)}
    plan = [("token_embd.weight", src("embed_tokens.weight"), None)]
    for i in range(n_layer):
        plan += [(f"blk.{i}.{g}.weight", src(f"layers.{i}.{h}.weight"), op)
                 for g, h, op in layer_plan]
    plan.append(("output_norm.weight", src("norm.weight"), final_norm_op))
    tied = cfg.get("tie_word_embeddings", arch == "gemma3")
    for head in ("lm_head.weight", "language_model.lm_head.weight"):
        if head in st and not tied:
            plan.append(("output.weight", head, None))
            break
    if any(k.startswith(("model.layers.", "layers.")) and ".bias" in k for k in st.names()):
        raise SystemExit("attention/MLP biases are not handled by this converter")

    w = gguf.GGUFWriter(args.out, arch)
    w.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    w.add_block_count(n_layer)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if args.tokenizer is not None:
        if arch != "llama":
            raise SystemExit("--tokenizer is handled for the llama arch only")
        extra = write_llama_metadata(w, cfg, geo, args.tokenizer)
    else:
        extra = METADATA[arch](w, cfg, geo)
    w.add_file_type(ftype)
    w.add_vocab_size(geo["n_vocab"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # Declare every tensor first (sizes are known), then stream the data one tensor at a time.
    for gname in extra:
        plan.insert(1, (gname, None, None))
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
    for gname, sname, op in plan:
        if sname is None:
            w.write_tensor_data(extra[gname])
            continue
        raw = st.raw(sname)
        if raw.ndim == 1:
            vec = to_f32(np.asarray(raw))
            w.write_tensor_data(vec + np.float32(1) if op == "norm+1" else vec)
            continue
        if op in permutes:
            raw = permute(np.asarray(raw), *permutes[op])
        w.write_tensor_data(encode_2d(raw, qtype))
        print(f"  {gname:32s} {args.type}", file=sys.stderr)
    w.close()


if __name__ == "__main__":
    main()
