#!/usr/bin/env python3
"""Writes a bf16 copy of an MLX affine-quantized model folder (q4/q8 weights: uint32 codes plus
scales and biases per group), for backends that run float weights only (the CUDA backend's GPU
server test runs the bundled starter model this way).

Usage: dequantize.py SRC_DIR OUT_DIR

Each quantized matrix becomes W[r, c] = scales[r, c // g] * q[r, c] + biases[r, c // g] computed
in f32 and rounded to bf16 (round to nearest even); every other tensor is copied as is; config.json
loses its "quantization" entries; tokenizer and template files are copied. Needs numpy only.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "U32": np.uint32, "I32": np.int32,
          "U8": np.uint8, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = data[a:b]
        if info["dtype"] == "BF16":
            u16 = np.frombuffer(raw, dtype=np.uint16)
            arr = (u16.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        tensors[name] = (info["dtype"], arr.reshape(info["shape"]))
    return tensors


def to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        if dtype == "BF16":
            raw = to_bf16_bits(arr).tobytes()
        else:
            raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def dequantize(codes, scales, biases, bits, group):
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)
    q = ((codes[..., None] >> shifts) & ((1 << bits) - 1)).reshape(codes.shape[0], -1)
    q = q.astype(np.float32)
    s = np.repeat(scales.astype(np.float32), group, axis=1)
    b = np.repeat(biases.astype(np.float32), group, axis=1)
    return s * q + b


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    config = json.load(open(os.path.join(src, "config.json")))
    quant = config.pop("quantization", None) or {}
    config.pop("quantization_config", None)
    default_bits, default_group = quant.get("bits", 0), quant.get("group_size", 64)
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            tensors = read_safetensors(os.path.join(src, name))
            result = {}
            for tname, (dtype, arr) in tensors.items():
                if tname.endswith(".scales") or tname.endswith(".biases"):
                    continue
                module = tname[: -len(".weight")] if tname.endswith(".weight") else None
                if module and module + ".scales" in tensors:
                    override = quant.get(module) if isinstance(quant.get(module), dict) else {}
                    bits = override.get("bits", default_bits)
                    group = override.get("group_size", default_group)
                    w = dequantize(arr, tensors[module + ".scales"][1],
                                   tensors[module + ".biases"][1], bits, group)
                    result[tname] = ("BF16", w)
                else:
                    result[tname] = (dtype, arr)
            write_safetensors(os.path.join(out, name), result)
        elif name == "model.safetensors.index.json":
            index = json.load(open(os.path.join(src, name)))
            index["weight_map"] = {k: v for k, v in index["weight_map"].items()
                                   if not (k.endswith(".scales") or k.endswith(".biases"))}
            json.dump(index, open(os.path.join(out, name), "w"), indent=2)
        elif name != "config.json" and os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), os.path.join(out, name))
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
