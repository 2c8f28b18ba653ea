/* Tests for the safetensors writer: files re-read by a small independent parser (jansson on the
 * raw header), checking padding, offsets, sizes, order, data bytes and failure cleanup. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/error.h"
#include "io/safetensors_write.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char dir[64];
  char path[128];
} fixture;

static int setup(void **state) {
  fixture *fx = calloc(1, sizeof(*fx));
  if (!fx) return -1;
  strcpy(fx->dir, "/tmp/ci_stw_XXXXXX");
  if (!mkdtemp(fx->dir)) return -1;
  snprintf(fx->path, sizeof(fx->path), "%s/model.safetensors", fx->dir);
  *state = fx;
  return 0;
}

static int teardown(void **state) {
  fixture *fx = *state;
  char tmp[160];
  snprintf(tmp, sizeof(tmp), "%s.tmp", fx->path);
  remove(fx->path);
  remove(tmp);
  rmdir(fx->dir);
  free(fx);
  return 0;
}

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* Fill callback: byte k of the tensor is (k * 7 + seed) & 0xff; records the calls it saw. */
typedef struct {
  int seed;
  size_t row_bytes;
  size_t next_offset;
  int calls;
  int fail_at_call; /* 0 = never */
} fill_ctx;

static int pattern_fill(void *user, void *buf, size_t offset, size_t len) {
  fill_ctx *c = user;
  c->calls++;
  assert_int_equal(offset, c->next_offset);
  assert_int_equal(offset % c->row_bytes, 0);
  assert_int_equal(len % c->row_bytes, 0);
  if (c->fail_at_call && c->calls == c->fail_at_call) return ci_fail("synthetic failure");
  for (size_t k = 0; k < len; k++) ((uint8_t *)buf)[k] = (uint8_t)((offset + k) * 7 + c->seed);
  c->next_offset = offset + len;
  return 0;
}

typedef struct {
  const char *name, *dtype;
  int ndim;
  int64_t shape[3];
  size_t nbytes;
} expect;

static void test_write_and_reread(void **state) {
  fixture *fx = *state;
  float a[6] = {1, 2, 3, 4, 5, 6};
  uint16_t b[3] = {0x3f80, 0x4000, 0xc040};
  int32_t scalar = -7;
  ci_st_writer *w = ci_st_writer_new();
  assert_non_null(w);
  ci_st_writer_set_buffer_size(w, 5000); /* forces several chunks, row-aligned */
  fill_ctx fc = {.seed = 3, .row_bytes = 3 * 4 * 4};
  const int64_t sa[2] = {2, 3}, sb[1] = {3}, sbig[3] = {1000, 3, 4}, sz[2] = {0, 5};
  assert_int_equal(ci_st_writer_add(w, "z.first", CI_F32, 2, sa, a), CI_OK);
  assert_int_equal(ci_st_writer_add(w, "a.second", CI_BF16, 1, sb, b), CI_OK);
  assert_int_equal(ci_st_writer_add_fill(w, "big", CI_U32, 3, sbig, pattern_fill, &fc), CI_OK);
  assert_int_equal(ci_st_writer_add(w, "scalar", CI_I32, 0, NULL, &scalar), CI_OK);
  assert_int_equal(ci_st_writer_add(w, "empty", CI_F16, 2, sz, NULL), CI_OK);
  assert_int_equal(ci_st_writer_set_metadata(w, "note", "hello"), CI_OK);
  assert_int_equal(ci_st_writer_count(w), 5);
  assert_int_equal(ci_st_writer_data_bytes(w), 24 + 6 + 48000 + 4);
  assert_int_equal(ci_st_writer_write(w, fx->path), CI_OK);
  ci_st_writer_free(w);
  assert_int_equal(fc.next_offset, 48000);
  assert_true(fc.calls > 1);

  size_t flen = 0;
  uint8_t *file = read_file(fx->path, &flen);
  assert_non_null(file);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)file[i] << (8 * i);
  assert_int_equal(hlen % 8, 0);
  assert_true(8 + hlen <= flen);
  /* header: JSON, then only spaces */
  size_t jlen = (size_t)hlen;
  while (jlen > 0 && file[8 + jlen - 1] == ' ') jlen--;
  assert_int_equal(file[8 + jlen - 1], '}');
  assert_true(hlen - jlen < 8);
  json_error_t err;
  json_t *root = json_loadb((const char *)file + 8, (size_t)hlen, 0, &err);
  assert_non_null(root);
  json_t *meta = json_object_get(root, "__metadata__");
  assert_string_equal(json_string_value(json_object_get(meta, "format")), "pt");
  assert_string_equal(json_string_value(json_object_get(meta, "note")), "hello");

  const expect ex[] = {
      {"z.first", "F32", 2, {2, 3}, 24},      {"a.second", "BF16", 1, {3}, 6},
      {"big", "U32", 3, {1000, 3, 4}, 48000}, {"scalar", "I32", 0, {0}, 4},
      {"empty", "F16", 2, {0, 5}, 0},
  };
  const uint8_t *data = file + 8 + hlen;
  uint64_t pos = 0;
  size_t k = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) continue;
    assert_true(k < 5);
    assert_string_equal(key, ex[k].name); /* insertion order */
    assert_string_equal(json_string_value(json_object_get(val, "dtype")), ex[k].dtype);
    json_t *shape = json_object_get(val, "shape");
    assert_int_equal(json_array_size(shape), (size_t)ex[k].ndim);
    for (int d = 0; d < ex[k].ndim; d++) {
      assert_int_equal(json_integer_value(json_array_get(shape, (size_t)d)), ex[k].shape[d]);
    }
    json_t *off = json_object_get(val, "data_offsets");
    const uint64_t b0 = (uint64_t)json_integer_value(json_array_get(off, 0));
    const uint64_t e0 = (uint64_t)json_integer_value(json_array_get(off, 1));
    assert_int_equal(b0, pos);
    assert_int_equal(e0 - b0, ex[k].nbytes);
    pos = e0;
    k++;
  }
  assert_int_equal(k, 5);
  assert_int_equal(8 + hlen + pos, flen);
  assert_memory_equal(data, a, 24);
  assert_memory_equal(data + 24, b, 6);
  for (size_t i = 0; i < 48000; i++) assert_int_equal(data[30 + i], (uint8_t)(i * 7 + 3));
  assert_memory_equal(data + 30 + 48000, &scalar, 4);
  json_decref(root);
  free(file);
}

static void test_errors_and_cleanup(void **state) {
  fixture *fx = *state;
  ci_st_writer *w = ci_st_writer_new();
  assert_non_null(w);
  const int64_t s[2] = {4, 8};
  float x[32] = {0};
  assert_int_equal(ci_st_writer_add(w, "t", CI_F32, 2, s, x), CI_OK);
  assert_int_equal(ci_st_writer_add(w, "t", CI_F32, 2, s, x), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "duplicate"));
  assert_int_equal(ci_st_writer_add(w, "q", CI_Q4, 2, s, x), CI_ERR);
  assert_int_equal(ci_st_writer_add(w, "", CI_F32, 2, s, x), CI_ERR);
  assert_int_equal(ci_st_writer_add(w, "__metadata__", CI_F32, 2, s, x), CI_ERR);
  assert_int_equal(ci_st_writer_add(w, "bad\xff", CI_F32, 2, s, x), CI_ERR);
  const int64_t neg[1] = {-1};
  assert_int_equal(ci_st_writer_add(w, "n", CI_F32, 1, neg, x), CI_ERR);
  assert_int_equal(ci_st_writer_count(w), 1);
  /* a failing fill callback aborts the write and leaves no file behind */
  fill_ctx fc = {.seed = 0, .row_bytes = 64, .fail_at_call = 2};
  const int64_t sbig[2] = {1000, 16};
  assert_int_equal(ci_st_writer_add_fill(w, "f", CI_F32, 2, sbig, pattern_fill, &fc), CI_OK);
  ci_st_writer_set_buffer_size(w, 4096);
  assert_int_equal(ci_st_writer_write(w, fx->path), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "synthetic failure"));
  assert_int_equal(access(fx->path, F_OK), -1);
  char tmp[160];
  snprintf(tmp, sizeof(tmp), "%s.tmp", fx->path);
  assert_int_equal(access(tmp, F_OK), -1);
  ci_st_writer_free(w);
  /* unwritable destination */
  w = ci_st_writer_new();
  assert_int_equal(ci_st_writer_write(w, "/nonexistent-dir/x.safetensors"), CI_ERR);
  ci_st_writer_free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_write_and_reread, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors_and_cleanup, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
