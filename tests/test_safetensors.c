/* Tests of the safetensors loader: valid single and sharded folders read back exactly, and every
 * malformed header or inconsistent index is rejected with a message naming file and tensor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/error.h"
#include "io/safetensors.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ==== Fixture helpers ==== */

typedef struct {
  uint8_t *bytes;
  size_t len;
} image;

/* Builds a safetensors file image: u64 LE header length, the header padded with spaces to a
 * multiple of 8 (as real writers do, so data stays aligned), then data. */
static image make_image(const char *header, const void *data, size_t data_len) {
  size_t header_len = strlen(header);
  size_t padded = (header_len + 7) / 8 * 8;
  image im = {malloc(8 + padded + data_len + 1), 8 + padded + data_len};
  assert_non_null(im.bytes);
  for (int i = 0; i < 8; i++) im.bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  memcpy(im.bytes + 8, header, header_len);
  memset(im.bytes + 8 + header_len, ' ', padded - header_len);
  if (data_len) memcpy(im.bytes + 8 + padded, data, data_len);
  return im;
}

/* An image whose length prefix says header_len but whose body is just body[0..body_len). */
static image make_raw(uint64_t header_len, const char *body, size_t body_len) {
  image im = {malloc(8 + body_len + 1), 8 + body_len};
  assert_non_null(im.bytes);
  for (int i = 0; i < 8; i++) im.bytes[i] = (uint8_t)(header_len >> (8 * i));
  memcpy(im.bytes + 8, body, body_len);
  return im;
}

static void write_file(const char *dir, const char *name, const void *bytes, size_t len) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (len) assert_int_equal(fwrite(bytes, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static void write_text(const char *dir, const char *name, const char *text) {
  write_file(dir, name, text, strlen(text));
}

static void write_image(const char *dir, const char *name, image im) {
  write_file(dir, name, im.bytes, im.len);
  free(im.bytes);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* Each test gets a fresh temporary folder in *state. */
static int make_dir(void **state) {
  char *dir = strdup("/tmp/cinfer_st_XXXXXX");
  if (!dir || !mkdtemp(dir)) return -1;
  *state = dir;
  return 0;
}

static int remove_dir(void **state) {
  nftw(*state, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  free(*state);
  return 0;
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle)) fail_msg("expected \"%s\" in error \"%s\"", needle, haystack);
}

/* ==== Valid files ==== */

/* Data section for the valid single-file fixture:
 * a: F32 [2,3] = 0..5 (24 bytes), b: BF16 [4] = 1,2,3,4 (8 bytes), c: I64 scalar = -7,
 * empty: F16 [0, 5] (0 bytes), mask: BOOL [3]. */
static image valid_image(void) {
  uint8_t data[24 + 8 + 8 + 3];
  for (int i = 0; i < 6; i++) {
    float v = (float)i;
    memcpy(data + 4 * i, &v, 4);
  }
  for (int i = 0; i < 4; i++) {
    uint16_t h = ci_f32_to_bf16((float)(i + 1));
    memcpy(data + 24 + 2 * i, &h, 2);
  }
  int64_t c = -7;
  memcpy(data + 32, &c, 8);
  data[40] = 1, data[41] = 0, data[42] = 1;
  const char *header = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
                       "\"empty\":{\"dtype\":\"F16\",\"shape\":[0,5],\"data_offsets\":[40,40]},"
                       "\"mask\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[40,43]}}";
  return make_image(header, data, sizeof data);
}

static void check_valid_entries(const ci_st_tensor *a, const ci_st_tensor *b, const ci_st_tensor *c,
                                const ci_st_tensor *empty) {
  assert_non_null(a);
  assert_int_equal(a->dtype, CI_F32);
  assert_int_equal(a->ndim, 2);
  assert_int_equal(a->shape[0], 2);
  assert_int_equal(a->shape[1], 3);
  assert_int_equal(a->nbytes, 24);
  for (int i = 0; i < 6; i++) {
    float v;
    memcpy(&v, (const uint8_t *)a->data + 4 * i, 4);
    assert_true(v == (float)i);
  }
  assert_non_null(b);
  assert_int_equal(b->dtype, CI_BF16);
  for (int i = 0; i < 4; i++) assert_true(ci_float_at(CI_BF16, b->data, (size_t)i) == i + 1);
  assert_non_null(c);
  assert_int_equal(c->ndim, 0);
  assert_int_equal(ci_st_tensor_numel(c), 1);
  int64_t cv;
  memcpy(&cv, c->data, 8);
  assert_int_equal(cv, -7);
  assert_non_null(empty);
  assert_int_equal(empty->nbytes, 0);
  assert_int_equal(ci_st_tensor_numel(empty), 0);
}

static void test_parse_in_memory(void **state) {
  (void)state;
  image im = valid_image();
  ci_st_tensor *t;
  int n;
  assert_int_equal(ci_st_parse(im.bytes, im.len, "mem", 3, &t, &n), CI_OK);
  assert_int_equal(n, 5);
  /* Sorted by name. */
  const char *order[] = {"a", "b", "c", "empty", "mask"};
  for (int i = 0; i < n; i++) {
    assert_string_equal(t[i].name, order[i]);
    assert_int_equal(t[i].shard, 3);
    assert_int_equal(t[i].used, 0);
    assert_true((const uint8_t *)t[i].data >= im.bytes);
    assert_true((const uint8_t *)t[i].data + t[i].nbytes <= im.bytes + im.len);
  }
  check_valid_entries(&t[0], &t[1], &t[2], &t[3]);
  assert_int_equal(t[0].offset, (size_t)((const uint8_t *)t[0].data - im.bytes));
  free(t);
  free(im.bytes);
}

static void test_single_file(void **state) {
  const char *dir = *state;
  write_image(dir, "model.safetensors", valid_image());
  ci_weights *w = ci_weights_open(dir);
  assert_non_null(w);
  assert_int_equal(ci_weights_count(w), 5);
  assert_int_equal(ci_weights_shard_count(w), 1);
  assert_non_null(strstr(ci_weights_shard_path(w, 0), "model.safetensors"));
  assert_null(ci_weights_shard_path(w, 1));
  assert_int_equal(ci_weights_total_bytes(w), 24 + 8 + 8 + 3);
  check_valid_entries(ci_weights_find(w, "a"), ci_weights_find(w, "b"), ci_weights_find(w, "c"),
                      ci_weights_find(w, "empty"));
  assert_null(ci_weights_find(w, "__metadata__"));
  assert_null(ci_weights_find(w, "zz"));
  assert_null(ci_weights_find(w, ""));

  /* take marks used; at() walks in name order. */
  ci_st_tensor *a = ci_weights_take(w, "a");
  assert_non_null(a);
  assert_null(ci_weights_take(w, "nope"));
  int used = 0;
  for (int i = 0; i < ci_weights_count(w); i++) used += ci_weights_at(w, i)->used;
  assert_int_equal(used, 1);
  assert_int_equal(ci_weights_at(w, 0)->used, 1);
  assert_string_equal(ci_weights_at(w, 4)->name, "mask");
  assert_null(ci_weights_at(w, 5));
  assert_null(ci_weights_at(w, -1));
  ci_weights_reset_used(w);
  assert_int_equal(ci_weights_at(w, 0)->used, 0);

  ci_tensor view;
  assert_int_equal(ci_st_tensor_view(a, &view), CI_OK);
  assert_int_equal(view.ndim, 2);
  assert_int_equal(view.shape[1], 3);
  assert_ptr_equal(view.data, a->data);
  assert_int_equal(ci_tensor_numel(&view), 6);
  ci_weights_free(w);
  ci_weights_free(NULL);
}

static void test_lenient_cases(void **state) {
  (void)state;
  ci_st_tensor *t;
  int n;
  /* An empty header; a header that fills the file exactly. */
  image im = make_image("{}", NULL, 0);
  assert_int_equal(ci_st_parse(im.bytes, im.len, "f", 0, &t, &n), CI_OK);
  assert_int_equal(n, 0);
  assert_non_null(t);
  free(t);
  free(im.bytes);
  /* Zero-size tensors sharing an offset, a gap, extra keys, lenient metadata values. */
  uint8_t data[16] = {0};
  im = make_image("{\"__metadata__\":{\"n\":1},"
                  "\"x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                  "\"y\":{\"dtype\":\"I8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                  "\"z\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[8,12],\"extra\":1},"
                  "\"w\":{\"dtype\":\"F64\",\"shape\":[0],\"data_offsets\":[16,16]}}",
                  data, sizeof data);
  assert_int_equal(ci_st_parse(im.bytes, im.len, "f", 0, &t, &n), CI_OK);
  assert_int_equal(n, 4);
  free(t);
  free(im.bytes);
  /* Every safetensors dtype is accepted. */
  const char *dtypes[] = {"BOOL", "U8",  "I8",  "U16",  "I16", "U32", "I32",
                          "U64",  "I64", "F16", "BF16", "F32", "F64"};
  const int sizes[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8};
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
    char header[128];
    snprintf(header, sizeof header,
             "{\"t\":{\"dtype\":\"%s\",\"shape\":[2],\"data_offsets\":[0,%d]}}", dtypes[i],
             2 * sizes[i]);
    im = make_image(header, data, sizeof data);
    assert_int_equal(ci_st_parse(im.bytes, im.len, "f", 0, &t, &n), CI_OK);
    assert_string_equal(ci_dtype_get(t[0].dtype)->name, dtypes[i]);
    free(t);
    free(im.bytes);
  }
}

/* ==== Rejections of one file ==== */

typedef struct {
  const char *what;
  const char *header; /* NULL: use raw */
  size_t data_len;
  uint64_t raw_header_len; /* with header NULL: the length prefix ... */
  const char *raw_body;    /* ... and the bytes after it (raw_body_len of them) */
  size_t raw_body_len;
  const char *expect; /* substring of the message */
  const char *tensor; /* tensor the message must name, or NULL */
} reject_case;

#define ENTRY(dtype, shape, offsets)                                                               \
  "{\"dtype\":" dtype ",\"shape\":" shape ",\"data_offsets\":" offsets "}"

static const reject_case reject_cases[] = {
    {"short file", NULL, 0, 0, NULL, 0, "truncated", NULL},
    {"header past end", NULL, 0, 1000, "{\"a\":1}", 7, "truncated", NULL},
    {"absurd header", NULL, 0, (uint64_t)1 << 40, "{}", 2, "absurd", NULL},
    {"max u64 header", NULL, 0, UINT64_MAX, "{}", 2, "absurd", NULL},
    {"not json", "{not json", 0, 0, NULL, 0, "not valid JSON", NULL},
    {"not object", "[1, 2]", 0, 0, NULL, 0, "not a JSON object", NULL},
    {"garbage bytes", "\x01\x02\xff", 0, 0, NULL, 0, "not valid JSON", NULL},
    {"nul in name", "{\"a\\u0000b\":" ENTRY("\"U8\"", "[0]", "[0,0]") "}", 0, 0, NULL, 0,
     "not valid JSON", NULL},
    {"entry not object", "{\"a\":5}", 0, 0, NULL, 0, "entry is not an object", "a"},
    {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 8, 0, NULL, 0, "dtype",
     "a"},
    {"dtype not string", "{\"a\":" ENTRY("5", "[1]", "[0,4]") "}", 8, 0, NULL, 0, "dtype", "a"},
    {"unknown dtype", "{\"a\":" ENTRY("\"F8_E4M3\"", "[1]", "[0,1]") "}", 8, 0, NULL, 0,
     "unknown dtype 'F8_E4M3'", "a"},
    {"affine dtype name", "{\"a\":" ENTRY("\"Q4\"", "[2]", "[0,1]") "}", 8, 0, NULL, 0,
     "unknown dtype", "a"},
    {"missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 8, 0, NULL, 0,
     "\"shape\"", "a"},
    {"shape not array", "{\"a\":" ENTRY("\"F32\"", "4", "[0,4]") "}", 8, 0, NULL, 0, "\"shape\"",
     "a"},
    {"fractional dim", "{\"a\":" ENTRY("\"F32\"", "[1.5]", "[0,4]") "}", 8, 0, NULL, 0,
     "non-negative integers", "a"},
    {"string dim", "{\"a\":" ENTRY("\"F32\"", "[\"1\"]", "[0,4]") "}", 8, 0, NULL, 0,
     "non-negative integers", "a"},
    {"negative dim", "{\"a\":" ENTRY("\"F32\"", "[-1]", "[0,4]") "}", 8, 0, NULL, 0,
     "non-negative integers", "a"},
    {"too many dims", "{\"a\":" ENTRY("\"U8\"", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 8, 0, NULL, 0,
     "dimensions", "a"},
    {"shape overflow",
     "{\"a\":" ENTRY("\"F32\"", "[4294967296,4294967296,4294967296]", "[0,4]") "}", 8, 0, NULL, 0,
     "overflows", "a"},
    {"byte overflow", "{\"a\":" ENTRY("\"F64\"", "[4611686018427387904]", "[0,4]") "}", 8, 0, NULL,
     0, "overflows", "a"},
    {"missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 8, 0, NULL, 0, "data_offsets",
     "a"},
    {"offsets reversed", "{\"a\":" ENTRY("\"F32\"", "[1]", "[4,0]") "}", 8, 0, NULL, 0,
     "begin <= end", "a"},
    {"offsets three", "{\"a\":" ENTRY("\"F32\"", "[1]", "[0,4,8]") "}", 8, 0, NULL, 0,
     "data_offsets", "a"},
    {"offsets negative", "{\"a\":" ENTRY("\"F32\"", "[1]", "[-4,0]") "}", 8, 0, NULL, 0,
     "data_offsets", "a"},
    {"offsets not ints", "{\"a\":" ENTRY("\"F32\"", "[1]", "[0.0,4.0]") "}", 8, 0, NULL, 0,
     "data_offsets", "a"},
    {"past end", "{\"a\":" ENTRY("\"F32\"", "[100]", "[0,400]") "}", 16, 0, NULL, 0,
     "past the end of the data section", "a"},
    {"huge end", "{\"a\":" ENTRY("\"U8\"", "[1]", "[9223372036854775806,9223372036854775807]") "}",
     16, 0, NULL, 0, "past the end of the data section", "a"},
    {"size mismatch", "{\"a\":" ENTRY("\"F32\"", "[2]", "[0,4]") "}", 16, 0, NULL, 0,
     "shape disagrees with byte size", "a"},
    {"scalar mismatch", "{\"a\":" ENTRY("\"F32\"", "[]", "[0,0]") "}", 16, 0, NULL, 0,
     "shape disagrees with byte size", "a"},
    {"overlap",
     "{\"a\":" ENTRY("\"F32\"", "[2]", "[0,8]") ",\"b\":" ENTRY("\"F32\"", "[2]", "[4,12]") "}", 16,
     0, NULL, 0, "overlap", "b"},
    {"same range",
     "{\"a\":" ENTRY("\"U8\"", "[4]", "[0,4]") ",\"b\":" ENTRY("\"U8\"", "[4]", "[0,4]") "}", 16, 0,
     NULL, 0, "overlap", "a"},
    {"nested range",
     "{\"a\":" ENTRY("\"U8\"", "[16]", "[0,16]") ",\"b\":" ENTRY(
         "\"U8\"", "[2]", "[10,12]") ",\"c\":" ENTRY("\"U8\"", "[2]", "[1,3]") "}",
     16, 0, NULL, 0, "overlap", "a"},
    {"duplicate name",
     "{\"a\":" ENTRY("\"U8\"", "[1]", "[0,1]") ",\"a\":" ENTRY("\"U8\"", "[1]", "[1,2]") "}", 16, 0,
     NULL, 0, "duplicate", NULL},
    {"empty name", "{\"\":" ENTRY("\"U8\"", "[1]", "[0,1]") "}", 16, 0, NULL, 0, "empty name",
     NULL},
    {"metadata not object", "{\"__metadata__\":[1]}", 0, 0, NULL, 0, "__metadata__", NULL},
};

/* Runs one rejection case in memory and through a file; both must fail with expect. */
static void run_reject_case(const char *dir, const reject_case *rc) {
  uint8_t data[64] = {0};
  image im = rc->header
                 ? make_image(rc->header, data, rc->data_len)
                 : make_raw(rc->raw_header_len, rc->raw_body ? rc->raw_body : "", rc->raw_body_len);
  if (!rc->header && !rc->raw_body) im.len = 5; /* shorter than the length prefix */
  ci_st_tensor *t = (ci_st_tensor *)1;
  int n = -1;
  ci_clear_error();
  if (ci_st_parse(im.bytes, im.len, "mem.safetensors", 0, &t, &n) != CI_ERR) {
    fail_msg("case '%s' was accepted", rc->what);
  }
  assert_null(t);
  assert_int_equal(n, 0);
  assert_contains(ci_last_error(), rc->expect);
  assert_contains(ci_last_error(), "mem.safetensors: ");
  if (rc->tensor) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", rc->tensor);
    assert_contains(ci_last_error(), quoted);
  }
  assert_null(strchr(ci_last_error(), '\n'));

  write_image(dir, "model.safetensors", im);
  ci_clear_error();
  ci_weights *w = ci_weights_open(dir);
  if (w) fail_msg("case '%s' was accepted from a file", rc->what);
  assert_contains(ci_last_error(), rc->expect);
  assert_contains(ci_last_error(), "/model.safetensors: ");
}

static void test_rejections(void **state) {
  for (size_t i = 0; i < sizeof reject_cases / sizeof reject_cases[0]; i++) {
    run_reject_case(*state, &reject_cases[i]);
  }
}

static void test_zero_size_file(void **state) {
  const char *dir = *state;
  write_file(dir, "model.safetensors", NULL, 0);
  assert_null(ci_weights_open(dir));
  assert_contains(ci_last_error(), "truncated");
  ci_st_tensor *t;
  int n;
  assert_int_equal(ci_st_parse(NULL, 0, NULL, 0, &t, &n), CI_ERR);
  assert_contains(ci_last_error(), "truncated");
}

static void test_missing_weights(void **state) {
  const char *dir = *state;
  assert_null(ci_weights_open(dir));
  assert_contains(ci_last_error(), "no model.safetensors or model.safetensors.index.json in");
  assert_contains(ci_last_error(), dir);

  assert_null(ci_weights_open("/nonexistent/cinfer/model"));
  assert_contains(ci_last_error(), "/nonexistent/cinfer/model");
  assert_null(ci_weights_open(NULL));
  assert_null(ci_weights_open(""));

  char sub[512];
  snprintf(sub, sizeof sub, "%s/model.safetensors", dir);
  assert_int_equal(mkdir(sub, 0700), 0);
  assert_null(ci_weights_open(dir));
  assert_contains(ci_last_error(), "not a regular file");
}

/* ==== Shards and index ==== */

/* Writes two shards: s1 holds a (F32 [2]) and b (U8 [3]); s2 holds c (F32 [1]). */
static void write_two_shards(const char *dir) {
  float values[3] = {1.5f, -2.0f, 8.0f};
  uint8_t d1[16] = {0};
  memcpy(d1, values, 8);
  d1[8] = 7, d1[9] = 8, d1[10] = 9;
  write_image(dir, "model-00001-of-00002.safetensors",
              make_image("{\"a\":" ENTRY("\"F32\"", "[2]", "[0,8]") ",\"b\":" ENTRY("\"U8\"", "[3]",
                                                                                    "[8,11]") "}",
                         d1, 11));
  write_image(dir, "model-00002-of-00002.safetensors",
              make_image("{\"c\":" ENTRY("\"F32\"", "[1]", "[0,4]") "}", values + 2, 4));
}

static const char *good_index = "{\"metadata\":{\"total_size\":15},\"weight_map\":{"
                                "\"a\":\"model-00001-of-00002.safetensors\","
                                "\"c\":\"model-00002-of-00002.safetensors\","
                                "\"b\":\"model-00001-of-00002.safetensors\"}}";

static void test_sharded(void **state) {
  const char *dir = *state;
  write_two_shards(dir);
  write_text(dir, "model.safetensors.index.json", good_index);
  ci_weights *w = ci_weights_open(dir);
  if (!w) fail_msg("%s", ci_last_error());
  assert_int_equal(ci_weights_count(w), 3);
  assert_int_equal(ci_weights_shard_count(w), 2);
  assert_int_equal(ci_weights_total_bytes(w), 15);
  const ci_st_tensor *a = ci_weights_find(w, "a"), *b = ci_weights_find(w, "b");
  const ci_st_tensor *c = ci_weights_find(w, "c");
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_int_equal(a->shard, 0);
  assert_int_equal(b->shard, 0);
  assert_int_equal(c->shard, 1);
  assert_non_null(strstr(ci_weights_shard_path(w, c->shard), "model-00002-of-00002"));
  assert_true(ci_float_at(CI_F32, a->data, 1) == -2.0f);
  assert_true(ci_float_at(CI_F32, c->data, 0) == 8.0f);
  assert_int_equal(((const uint8_t *)b->data)[2], 9);
  assert_string_equal(ci_weights_at(w, 2)->name, "c");
  ci_weights_free(w);

  /* A single model.safetensors takes precedence over an index. */
  write_image(dir, "model.safetensors",
              make_image("{\"only\":" ENTRY("\"U8\"", "[1]", "[0,1]") "}", "x", 1));
  w = ci_weights_open(dir);
  assert_non_null(w);
  assert_int_equal(ci_weights_count(w), 1);
  ci_weights_free(w);
}

typedef struct {
  const char *what;
  const char *index;
  const char *expect;
} index_case;

static const index_case index_cases[] = {
    {"not json", "{\"weight_map\":", "not valid JSON"},
    {"no weight_map", "{\"metadata\":{}}", "\"weight_map\""},
    {"weight_map not object", "{\"weight_map\":[]}", "\"weight_map\""},
    {"empty weight_map", "{\"weight_map\":{}}", "lists no tensors"},
    {"file not string", "{\"weight_map\":{\"a\":1}}", "'a' is not a file name"},
    {"missing file",
     "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
     "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00003.safetensors\"}}",
     "model-00003.safetensors, which does not exist"},
    {"escaping path", "{\"weight_map\":{\"a\":\"../model.safetensors\"}}", "not a relative path"},
    {"absolute path", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "not a relative path"},
    {"wrong shard",
     "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\","
     "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}",
     "tensor 'a' is listed in model-00002-of-00002.safetensors but lives in "
     "model-00001-of-00002.safetensors"},
    {"listed but absent",
     "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
     "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\","
     "\"d\":\"model-00002-of-00002.safetensors\"}}",
     "tensor 'd' is listed in model-00002-of-00002.safetensors, which does not contain it"},
    {"not listed",
     "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
     "\"c\":\"model-00002-of-00002.safetensors\"}}",
     "tensor 'b' of"},
    {"duplicate key",
     "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
     "\"a\":\"model-00001-of-00002.safetensors\"}}",
     "duplicate"},
};

static void test_index_rejections(void **state) {
  const char *dir = *state;
  write_two_shards(dir);
  for (size_t i = 0; i < sizeof index_cases / sizeof index_cases[0]; i++) {
    write_text(dir, "model.safetensors.index.json", index_cases[i].index);
    ci_clear_error();
    ci_weights *w = ci_weights_open(dir);
    if (w) fail_msg("index case '%s' was accepted", index_cases[i].what);
    assert_contains(ci_last_error(), index_cases[i].expect);
  }
}

static void test_tensor_in_two_shards(void **state) {
  const char *dir = *state;
  write_two_shards(dir);
  write_image(dir, "extra.safetensors",
              make_image("{\"b\":" ENTRY("\"U8\"", "[3]", "[0,3]") "}", "xyz", 3));
  write_text(dir, "model.safetensors.index.json",
             "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
             "\"b\":\"extra.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
  assert_null(ci_weights_open(dir));
  assert_contains(ci_last_error(), "tensor 'b' is in two shards");
  assert_contains(ci_last_error(), "extra.safetensors");
}

static void test_bad_shard_named(void **state) {
  const char *dir = *state;
  write_two_shards(dir);
  write_image(dir, "model-00002-of-00002.safetensors",
              make_image("{\"c\":" ENTRY("\"F32\"", "[2]", "[0,4]") "}", "abcd", 4));
  write_text(dir, "model.safetensors.index.json", good_index);
  assert_null(ci_weights_open(dir));
  assert_contains(ci_last_error(), "model-00002-of-00002.safetensors: tensor 'c': shape disagrees");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_in_memory),
      cmocka_unit_test(test_lenient_cases),
      cmocka_unit_test_setup_teardown(test_single_file, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_rejections, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_zero_size_file, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_missing_weights, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_sharded, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_index_rejections, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_tensor_in_two_shards, make_dir, remove_dir),
      cmocka_unit_test_setup_teardown(test_bad_shard_named, make_dir, remove_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
