/* libFuzzer target: arbitrary bytes as text for two small fixed tokenizers (byte-level BPE with a
 * Split regex, NFKC and added tokens with strip flags; SentencePiece-style BPE with Metaspace and
 * byte fallback). Valid UTF-8 must encode, decode back exactly (byte-level) and stream to the same
 * text with stop strings; invalid UTF-8 must be refused with a message. */
#include "base/error.h"
#include "text/detok_stream.h"
#include "text/tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t put_cp(char *o, unsigned c) {
  if (c < 0x80) return o[0] = (char)c, 1;
  o[0] = (char)(0xC0 | c >> 6);
  o[1] = (char)(0x80 | (c & 63));
  return 2;
}

/* The GPT-2 byte alphabet as JSON vocab entries ("c": id,). */
static size_t bytelevel_vocab(char *o) {
  size_t k = 0;
  for (unsigned b = 0; b < 256; b++) {
    unsigned c = b <= 32 ? 256 + b : (b >= 127 && b <= 160) ? 289 + b - 127 : b == 173 ? 323 : b;
    o[k++] = '"';
    if (c == '"' || c == '\\') o[k++] = '\\';
    k += put_cp(o + k, c);
    k += (size_t)sprintf(o + k, "\":%u,", b);
  }
  return k;
}

static ci_tokenizer *make_bytelevel(void) {
  static char json[16384];
  size_t k = (size_t)sprintf(
      json, "{\"added_tokens\":[{\"id\":300,\"content\":\"<s>\",\"special\":true},"
            "{\"id\":301,\"content\":\"<mask>\",\"special\":true,\"lstrip\":true,\"rstrip\":true},"
            "{\"id\":302,\"content\":\"word\",\"special\":false,\"single_word\":true}],"
            "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},"
            "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"\\\\s{3,}\"},\"content\":\"  \"}]},"
            "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
            "\"pattern\":{\"Regex\":\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
            "\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|"
            "\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
            "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
            "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
            "{\"id\":\"<s>\"}},{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":"
            "{\"id\":\"<s>\",\"ids\":[300],\"tokens\":[\"<s>\"]}}},"
            "\"decoder\":{\"type\":\"ByteLevel\"},"
            "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{");
  k += bytelevel_vocab(json + k);
  k += (size_t)sprintf(json + k, "\"he\":256,\"ll\":257,\"hell\":258,\"\xC4\xA0t\":259},"
                                 "\"merges\":[\"h e\",\"l l\",\"he ll\",\"\xC4\xA0 t\"]}}");
  return ci_tokenizer_load_json(json, k);
}

static ci_tokenizer *make_metaspace(void) {
  static char json[32768];
  size_t k = (size_t)sprintf(
      json, "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true}],"
            "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
            "\"content\":\"\xE2\x96\x81\"},"
            "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},"
            "\"behavior\":\"MergedWithPrevious\",\"invert\":false},"
            "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
            "{\"String\":\"\xE2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},"
            "{\"type\":\"Fuse\"}]},"
            "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"fuse_unk\":true,"
            "\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,");
  for (unsigned b = 0; b < 256; b++) k += (size_t)sprintf(json + k, "\"<0x%02X>\":%u,", b, b + 1);
  k += (size_t)sprintf(json + k, "\"a\":257,\"b\":258,\"\xE2\x96\x81\":259,\"\xE2\x96\x81"
                                 "a\":260,\"ab\":261},\"merges\":[\"\xE2\x96\x81 a\",\"a b\"]}}");
  return ci_tokenizer_load_json(json, k);
}

static void check(const ci_tokenizer *tok, const char *text, size_t size, int exact) {
  int32_t *ids;
  size_t n;
  if (ci_tokenizer_encode(tok, text, size, 0, &ids, &n) != CI_OK) {
    if (ci_last_error()[0] == '\0') abort();
    return;
  }
  char *out;
  size_t len;
  if (ci_tokenizer_decode(tok, ids, n, 0, &out, &len) != CI_OK) abort();
  if (exact && (len != size || memcmp(out, text, size))) abort();
  /* Streaming must give the same text; with a stop string, a prefix of it. */
  const char *stops[] = {"ab", "\xE4\xB8\xAD"};
  for (int with_stop = 0; with_stop < 2; with_stop++) {
    ci_detok_stream *s = ci_detok_stream_create(tok, stops, with_stop ? 2 : 0, 0);
    if (!s) abort();
    size_t used = 0;
    int rc = 0;
    for (size_t i = 0; i <= n && rc == 0; i++) {
      const char *piece;
      size_t plen;
      rc = i < n ? ci_detok_stream_push(s, ids[i], &piece, &plen)
                 : ci_detok_stream_finish(s, &piece, &plen);
      if (rc < 0 || used + plen > len || memcmp(out + used, piece, plen)) abort();
      used += plen;
    }
    if (!with_stop && used != len) abort();
    ci_detok_stream_free(s);
  }
  free(out);
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static ci_tokenizer *bytelevel, *metaspace;
  if (!bytelevel && !(bytelevel = make_bytelevel())) {
    fprintf(stderr, "fuzz_tokenizer_text: %s\n", ci_last_error());
    abort();
  }
  if (!metaspace && !(metaspace = make_metaspace())) {
    fprintf(stderr, "fuzz_tokenizer_text: %s\n", ci_last_error());
    abort();
  }
  ci_clear_error();
  check(bytelevel, (const char *)data, size, 0);
  check(metaspace, (const char *)data, size, 0);
  return 0;
}
