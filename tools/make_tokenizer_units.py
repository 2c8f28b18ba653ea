#!/usr/bin/env python3
"""Writes the small unit tokenizer.json files under tests/golden/tokenizer/units/ that exercise the
tokenizer components the real Llama 3 / Qwen3 / Gemma 3 files do not use (WordPiece, Unigram,
WordLevel, the normalizers, the other pre-tokenizers and split behaviours, Bert/Roberta/Template
post-processors, the other decoders, added-token flags), and the text corpus they are run on.
Their expected outputs come from the reference: node tools/gen_tokenizer_golden.js.

Many units use a "probe" model: a WordPiece vocabulary of single characters (and their ##
continuations), so the ids show exactly where the pre-tokenizer split and what the normalizer
produced."""
import json
import os
import unicodedata

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests/golden/tokenizer/units")

CORPUS = [
    ("greeting", "Hello, World! How are you?"),
    ("edges", "  leading and trailing  "),
    ("accents", "Héllo naïve CAFÉ e\u0301 ﬁ ① ｆｕｌｌ Å"),
    ("casing", "İstanbul ΣΊΣΥΦΟΣ straße ǅ"),
    ("punct_digits", "don't stop-believing... 123 4567 3.14 ½ ²"),
    ("subwords", "unaffable unwanted running hello world"),
    ("whitespace", "tab\tnew\nline\r\nend\u00a0nbsp\u3000ideo"),
    ("cjk", "中文字符 and 日本"),
    ("added_mid", "<mask> is here, [MASK] too and<sep>  x"),
    ("added_strip", "a <mask> b<mask>c   <sep>   d"),
    ("single_word", "word wordy <w> <w>x x<w> <w>"),
    ("empty", ""),
    ("space", " "),
    ("metaspace_chars", "▁already▁metaspace and  two"),
    ("controls", "x\u0000y\u0007z\ufffd\u200bw\ufeff"),
    ("emoji", "emoji 😀 and ॐ"),
    ("marks", "Mc\u0903 Me\u20dd Mn\u0301 A\u030a"),
    ("long_spaces", "a" + " " * 40 + "b"),
    ("unknown_run", "abc ☃☃ xyz ☃"),
]

SPECIAL = [("[PAD]", 0), ("[UNK]", 1), ("[CLS]", 2), ("[SEP]", 3), ("[MASK]", 4)]


def added(content, id_, special=True, lstrip=False, rstrip=False, single_word=False, normalized=None):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": (not special) if normalized is None else normalized,
            "special": special}


def probe_vocab():
    chars = set()
    for _, text in CORPUS:
        for form in ("NFC", "NFD", "NFKC", "NFKD"):
            t = unicodedata.normalize(form, text)
            chars.update(t)
            chars.update(t.lower())
    chars.update("abcdefghijklmnopqrstuvwxyz0123456789 ▁_-.,!?'")
    chars.update("i\u0307")
    chars.discard("\u0000")  # jansson cannot hold a NUL inside an object key
    vocab = {tok: i for tok, i in SPECIAL}
    for c in sorted(chars):
        for tok in (c, "##" + c):
            vocab.setdefault(tok, len(vocab))
    return vocab


def probe(name, normalizer=None, pre_tokenizer=None, decoder=None, post=None, extra_added=()):
    vocab = probe_vocab()
    toks = [added(t, i) for t, i in SPECIAL] + list(extra_added)
    write(name, {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": toks,
        "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post,
        "decoder": decoder or {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    })


def write(name, tok):
    with open(os.path.join(OUT, name + ".tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern},
            "behavior": behavior, "invert": invert}


def bytelevel_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(ROOT, "tests/golden/tokenizer/unit_corpus.json"), "w", encoding="utf-8") as f:
        json.dump([{"name": n, "text": t} for n, t in CORPUS], f, ensure_ascii=False, indent=1)
        f.write("\n")

    # ---- BERT: BertNormalizer, BertPreTokenizer, WordPiece, BertProcessing, WordPiece decoder.
    words = ["hello", "world", "how", "are", "you", "un", "##aff", "##able", "##want", "##ed",
             "run", "##ning", "don", "'", "t", "stop", "-", "believing", ".", ",", "!", "?", "1",
             "##2", "##3", "4", "##5", "##6", "##7", "3", "14", "is", "here", "too", "and", "a",
             "b", "c", "x", "中", "文", "字", "符", "日", "本", "cafe", "naive", "hel", "##lo",
             "istanbul", "tab", "new", "line", "end", "##s", "e", "w", "##i", "##n", "##d", "##y"]
    vocab = {t: i for t, i in SPECIAL}
    for w in words:
        vocab.setdefault(w, len(vocab))
    write("bert_wordpiece", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(t, i) for t, i in SPECIAL],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 12, "vocab": vocab},
    })

    # ---- RoBERTa-style byte-level BPE with added-token flags (lstrip, rstrip, single_word).
    chars = bytelevel_chars()
    merges = ["h e", "l l", "ll o", "he llo", "Ġ h", "Ġh e", "Ġhe llo", "Ġ w", "o r", "Ġw or",
              "l d", "Ġwor ld", "Ġ a", "r e", "Ġa re", "Ġ y", "o u", "Ġy ou", "H e", "He llo",
              "W or", "Wor ld", "Ġ Ġ", "ĠĠ ĠĠ", "i n", "Ġ r", "u n", "Ġr un", "Ġrun n", "Ġrunn in"]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    for m in merges:
        a, b = m.split(" ")
        vocab.setdefault(a + b, len(vocab))
    vocab.setdefault("Ġrunnin", len(vocab))
    n = len(vocab)
    write("roberta_bpe", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<s>", 0), added("<pad>", 1), added("</s>", 2), added("<unk>", 3),
                         added("<mask>", n, lstrip=True),
                         added("<sep>", n + 1, special=False, rstrip=True, normalized=False),
                         added("<w>", n + 2, special=False, single_word=True, normalized=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0],
                           "trim_offsets": True, "add_prefix_space": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "vocab": vocab, "merges": merges},
    })

    # ---- BPE with a continuing-subword prefix and an end-of-word suffix, unk fusing.
    letters = "abcdefghijklmnopqrstuvwxyz0123456789'.,!?-"
    vocab = {"[UNK]": 0}
    for c in letters:
        for t in (c, "##" + c, c + "</w>", "##" + c + "</w>"):
            vocab.setdefault(t, len(vocab))
    merges = [["h", "##e"], ["he", "##l"], ["hel", "##l"], ["hell", "##o</w>"], ["w", "##o"],
              ["wo", "##r"], ["wor", "##l"], ["worl", "##d</w>"], ["##n", "##g</w>"],
              ["##i", "##ng</w>"], ["u", "##n"], ["##a", "##b"]]
    for a, b in merges:
        vocab.setdefault(a + b[2:], len(vocab))
    write("bpe_suffix", {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [added("[UNK]", 0)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": {"type": "BPEDecoder", "suffix": "</w>"},
        "model": {"type": "BPE", "dropout": None, "unk_token": "[UNK]",
                  "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
                  "fuse_unk": True, "byte_fallback": False, "vocab": vocab, "merges": merges},
    })

    # ---- SentencePiece-style BPE: byte fallback, ignore_merges, Metaspace(first), Strip decoder.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for c in "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-":
        vocab.setdefault(c, len(vocab))
    merges = ["▁ h", "e l", "el l", "▁h ell", "▁ w", "o r", "▁w or", "▁ a", "n d", "▁a nd"]
    for m in merges:
        a, b = m.split(" ")
        vocab.setdefault(a + b, len(vocab))
    vocab["▁hello"] = len(vocab)  # reachable only through ignore_merges
    write("bpe_bytefallback", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2),
                         added("<mask>", len(vocab))],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": True, "vocab": vocab, "merges": merges},
    })

    # ---- Unigram with Metaspace (always) and NFKC + Replace + Lowercase.
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("▁", -2.0), ("▁hello", -3.0),
              ("▁world", -3.5), ("▁how", -4.0), ("▁are", -4.0), ("▁you", -4.0), ("▁un", -5.0),
              ("aff", -6.0), ("able", -5.5), ("▁unaffable", -14.0), ("want", -6.0), ("ed", -4.5),
              ("▁run", -5.0), ("ning", -5.5), ("n", -7.0), ("ing", -5.0), ("▁and", -4.0),
              ("hel", -6.0), ("lo", -6.0), ("he", -5.0), ("ll", -5.0), ("o", -4.0)]
    for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-":
        if c not in dict(pieces):
            pieces.append((c, -9.0))
    write("unigram_metaspace", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFKC"},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
            {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                          "split": True},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                    "split": True},
        "model": {"type": "Unigram", "unk_id": 0, "vocab": [list(p) for p in pieces],
                  "byte_fallback": False},
    })

    # ---- Unigram with byte fallback, Llama-2 style normalizer (Prepend + Replace), no pre-tokenizer.
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0)]
    pieces += [("<0x%02X>" % b, 0.0) for b in range(256)]
    pieces += [("▁", -2.0), ("▁hello", -3.0), ("▁world", -3.0), ("▁a", -3.0), ("nd", -4.0),
               ("▁and", -3.5), ("l", -5.0), ("o", -5.0)]
    for c in "abcdefghijklmnopqrstuvwxyzH,!?'.-":
        if c not in dict(pieces):
            pieces.append((c, -8.0))
    write("unigram_bytefallback", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<unk>", 0), added("<s>", 1), added("</s>", 2)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "Unigram", "unk_id": 0, "vocab": [list(p) for p in pieces],
                  "byte_fallback": True},
    })

    # ---- WordLevel with a CTC decoder and a Sequence post-processor.
    vocab = {"<pad>": 0, "<unk>": 1, "|": 2}
    for w in "hello , world ! how are you ? and here too x a b c".split():
        vocab.setdefault(w, len(vocab))
    write("wordlevel_ctc", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added("<pad>", 0), added("<unk>", 1)],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Isolated"}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            {"type": "TemplateProcessing",
             "single": [{"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "<pad>", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<pad>": {"id": "<pad>", "ids": [0, 0], "tokens": ["<pad>", "<pad>"]}}}]},
        "decoder": {"type": "CTC", "pad_token": "<pad>", "word_delimiter_token": "|", "cleanup": True},
        "model": {"type": "WordLevel", "unk_token": "<unk>", "vocab": vocab},
    })

    # ---- Probes: one component each on the character WordPiece model.
    probe("norm_nfd_strip_lower", normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]},
        pre_tokenizer={"type": "WhitespaceSplit"})
    probe("norm_nfkd", normalizer={"type": "NFKD"}, pre_tokenizer={"type": "WhitespaceSplit"})
    probe("norm_nfkc_strip", normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Strip", "strip_left": True, "strip_right": True}]},
        pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True})
    probe("norm_nfc_nmt", normalizer={"type": "Sequence", "normalizers": [
        {"type": "Nmt"}, {"type": "NFC"}, {"type": "Strip", "strip_left": False, "strip_right": True}]},
        pre_tokenizer={"type": "WhitespaceSplit"})
    probe("norm_lowercase_prepend", normalizer={"type": "Sequence", "normalizers": [
        {"type": "Lowercase"}, {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": "▁"}]},
        pre_tokenizer={"type": "Split", "pattern": {"String": "▁"}, "behavior": "MergedWithNext",
                       "invert": False},
        extra_added=[added("<mask>", 2000, normalized=True)])
    probe("norm_strip_accents_only", normalizer={"type": "StripAccents"},
          pre_tokenizer={"type": "WhitespaceSplit"})
    probe("norm_bert_keep_case", normalizer={"type": "BertNormalizer", "clean_text": True,
                                             "handle_chinese_chars": True, "strip_accents": True,
                                             "lowercase": False},
          pre_tokenizer={"type": "BertPreTokenizer"})
    probe("pre_whitespace", pre_tokenizer={"type": "Whitespace"})
    probe("pre_digits_punct", pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Punctuation", "behavior": "Contiguous"},
        {"type": "Digits", "individual_digits": True}]})
    probe("pre_digits_grouped", pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Punctuation", "behavior": "MergedWithNext"}]})
    probe("split_isolated", pre_tokenizer=split("\\s+|[,.!?']", "Isolated"))
    probe("split_removed_invert", pre_tokenizer=split("\\w+", "Removed", invert=True))
    probe("split_merged_previous", pre_tokenizer=split(" ", "MergedWithPrevious", regex=False))
    probe("split_merged_next", pre_tokenizer=split("[- ]", "MergedWithNext"))
    probe("split_contiguous", pre_tokenizer=split("\\p{N}|\\s", "Contiguous"))
    probe("pre_metaspace_never", pre_tokenizer={"type": "Metaspace", "replacement": "▁",
                                                "prepend_scheme": "never", "split": False},
          decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": False})
    probe("pre_char_delimiter", pre_tokenizer={"type": "CharDelimiterSplit", "delimiter": "e"},
          decoder={"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"Regex": "#+"}, "content": "~"},
              {"type": "Strip", "content": "~", "start": 2, "stop": 1}, {"type": "Fuse"}]})
    probe("pre_bytelevel_noregex", pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True,
                                                  "trim_offsets": True, "use_regex": False},
          normalizer={"type": "NFC"})


if __name__ == "__main__":
    main()
