/* Gemma configuration forms (docs/models.md §1, §5.5-5.7, §9 items 5-6): the transformers 5.x and
 * the upstream/legacy serialisations of the same model resolve to the same layer geometry and
 * RoPE tables; proportional RoPE; KV-sharing donors; rejected configs; and a multimodal wrapper
 * checkpoint (text_config + model.language_model. prefix + vision tensors) loading its text part
 * with logits identical to the text-only checkpoint. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "base/error.h"
#include "io/safetensors.h"
#include "io/safetensors_write.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static json_t *load_fixture_config(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/config.json", CI_FIXTURE_DIR, name);
  json_error_t err;
  json_t *cfg = json_load_file(path, 0, &err);
  assert_non_null(cfg);
  return cfg;
}

static void resolve(json_t *cfg, ci_model_spec *spec) {
  const int status = ci_model_spec_from_json(cfg, spec);
  if (status != CI_OK) fprintf(stderr, "%s\n", ci_last_error());
  assert_int_equal(status, CI_OK);
}

/* Geometry and RoPE tables of two specs are identical. */
static void assert_same_spec(const ci_model_spec *a, const ci_model_spec *b) {
  assert_int_equal(a->n_layers, b->n_layers);
  assert_int_equal(a->n_cache_layers, b->n_cache_layers);
  for (int i = 0; i < a->n_layers; i++) {
    const ci_layer_spec *x = &a->layers[i], *y = &b->layers[i];
    assert_int_equal(x->kind, y->kind);
    assert_int_equal(x->window, y->window);
    assert_int_equal(x->head_dim, y->head_dim);
    assert_int_equal(x->n_kv_heads, y->n_kv_heads);
    assert_int_equal(x->rope_index, y->rope_index);
    assert_int_equal(x->cache_layer, y->cache_layer);
    assert_int_equal(x->k_eq_v, y->k_eq_v);
    assert_int_equal(x->intermediate, y->intermediate);
    assert_true(x->attn_scale == y->attn_scale);
  }
  assert_int_equal(a->n_ropes, b->n_ropes);
  for (int r = 0; r < a->n_ropes; r++) {
    const ci_rope *x = &a->ropes[r].rope, *y = &b->ropes[r].rope;
    assert_int_equal(x->head_dim, y->head_dim);
    assert_int_equal(x->rot_dim, y->rot_dim);
    assert_memory_equal(x->inv_freq, y->inv_freq, (size_t)x->rot_dim / 2 * sizeof(float));
  }
}

/* gemma4 fixture (per_layer_config form) vs the upstream flat global_* keys. */
static void test_gemma4_upstream_form(void **state) {
  (void)state;
  json_t *v5 = load_fixture_config("gemma4");
  json_t *upstream = json_deep_copy(v5);
  json_object_del(upstream, "per_layer_config");
  json_object_set_new(upstream, "global_head_dim", json_integer(32));
  json_object_set_new(upstream, "num_global_key_value_heads", json_integer(1));
  ci_model_spec a, b;
  resolve(v5, &a);
  resolve(upstream, &b);
  assert_same_spec(&a, &b);
  /* Full layers: D 32 and one KV head, K=V; sliding: D 16, two KV heads. */
  assert_int_equal(a.layers[2].head_dim, 32);
  assert_int_equal(a.layers[2].n_kv_heads, 1);
  assert_true(a.layers[2].k_eq_v);
  assert_int_equal(a.layers[0].head_dim, 16);
  assert_int_equal(a.layers[0].n_kv_heads, 2);
  assert_false(a.layers[0].k_eq_v);
  assert_true(a.layers[0].attn_scale == 1.0f);
  /* Proportional RoPE, D 32, p 0.25: 4 rotated pairs with exponent over D, the rest identity. */
  const ci_rope *full = &a.ropes[a.layers[2].rope_index].rope;
  assert_int_equal(full->rot_dim, 32);
  for (int j = 0; j < 16; j++) {
    float want = j < 4 ? 1.0f / powf(1e6f, (float)(2 * j) / 32.0f) : 0.0f;
    assert_true(full->inv_freq[j] == want);
  }
  /* A per_layer_config that lists every layer gives the same result. */
  json_t *every = json_deep_copy(v5);
  json_t *plc = json_object_get(every, "per_layer_config");
  for (int i = 0; i < 6; i++) {
    char key[8];
    snprintf(key, sizeof key, "%d", i);
    if (!json_object_get(plc, key))
      json_object_set_new(plc, key,
                          json_pack("{s:i, s:i}", "head_dim", 16, "num_key_value_heads", 2));
  }
  ci_model_spec c;
  resolve(every, &c);
  assert_same_spec(&a, &c);
  ci_model_spec_free(&a);
  ci_model_spec_free(&b);
  ci_model_spec_free(&c);
  json_decref(v5);
  json_decref(upstream);
  json_decref(every);
}

/* gemma3 fixture (rope_parameters keyed by type) vs the transformers 4.x keys. */
static void test_gemma3_legacy_rope(void **state) {
  (void)state;
  json_t *v5 = load_fixture_config("gemma3");
  json_t *v4 = json_deep_copy(v5);
  json_object_del(v4, "rope_parameters");
  json_object_set_new(v4, "rope_theta", json_real(1e6));
  json_object_set_new(v4, "rope_local_base_freq", json_real(1e4));
  json_object_set_new(v4, "rope_scaling",
                      json_pack("{s:s, s:f}", "rope_type", "linear", "factor", 8.0));
  ci_model_spec a, b;
  resolve(v5, &a);
  resolve(v4, &b);
  assert_same_spec(&a, &b);
  assert_int_equal(a.layers[2].kind, CI_ATTN_FULL);
  assert_int_equal(a.layers[3].kind, CI_ATTN_SLIDING);
  assert_int_equal(a.layers[3].window, 8);
  assert_true(a.layers[0].attn_scale == 0.25f); /* query_pre_attn_scalar 16 */
  /* Full layers are linearly scaled by 8, sliding layers use the local base unscaled. */
  const ci_rope *full = &a.ropes[a.layers[2].rope_index].rope;
  const ci_rope *sliding = &a.ropes[a.layers[0].rope_index].rope;
  assert_true(full->inv_freq[1] == (1.0f / powf(1e6f, 2.0f / 16.0f)) / 8.0f);
  assert_true(sliding->inv_freq[1] == 1.0f / powf(1e4f, 2.0f / 16.0f));
  ci_model_spec_free(&a);
  ci_model_spec_free(&b);
  json_decref(v5);
  json_decref(v4);
}

/* Sharers read the last earlier layer of their type (gemma4-ple: 4 -> 2, 5 -> 3). */
static void test_gemma4_donors(void **state) {
  (void)state;
  json_t *cfg = load_fixture_config("gemma4-ple");
  ci_model_spec s;
  resolve(cfg, &s);
  assert_int_equal(s.n_cache_layers, 4);
  assert_int_equal(s.layers[4].cache_layer, 2);
  assert_int_equal(s.layers[5].cache_layer, 3);
  assert_int_equal(s.layers[5].intermediate, 2 * s.intermediate); /* double-wide sharers */
  assert_int_equal(s.layers[3].intermediate, s.intermediate);
  assert_int_equal(s.ple_dim, 16);
  ci_model_spec_free(&s);
  json_decref(cfg);
}

/* Configs the reference cannot run, or that cinfer does not support, are rejected by name. */
static void test_gemma_rejections(void **state) {
  (void)state;
  static const struct {
    const char *fixture;
    const char *key;
    const char *json_value;
    const char *expected;
  } cases[] = {
      {"gemma4", "use_bidirectional_attention", "\"all\"", "use_bidirectional_attention"},
      {"gemma3", "use_bidirectional_attention", "true", "use_bidirectional_attention"},
      {"gemma4", "intermediate_size", "[64, 64]", "intermediate_size"},
      {"gemma4", "per_layer_config", "{\"2\": {\"num_attention_heads\": 8}}",
       "num_attention_heads"},
      {"gemma4", "per_layer_config", "{\"x\": {}}", "not a layer index"},
      {"gemma4", "num_kv_shared_layers", "5", "no earlier"},
      {"gemma3", "layer_types", "[\"sliding_attention\"]", "layer_types"},
      {"gemma4", "rope_parameters",
       "{\"full_attention\": {\"rope_type\": \"dynamic\", \"rope_theta\": 1e6}}", "dynamic"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *cfg = load_fixture_config(cases[i].fixture);
    json_error_t err;
    json_t *value = json_loads(cases[i].json_value, JSON_DECODE_ANY, &err);
    assert_non_null(value);
    json_object_set_new(cfg, cases[i].key, value);
    ci_model_spec s;
    assert_int_equal(ci_model_spec_from_json(cfg, &s), CI_ERR);
    if (!strstr(ci_last_error(), cases[i].expected))
      fprintf(stderr, "case %zu: expected '%s' in '%s'\n", i, cases[i].expected, ci_last_error());
    assert_non_null(strstr(ci_last_error(), cases[i].expected));
    json_decref(cfg);
  }
}

/* Logits of the last position of a fixture's prompt. */
static float *last_logits(const char *dir, ci_backend *be, int *vocab) {
  ci_model *model = ci_model_load(dir, be);
  if (!model) fprintf(stderr, "load %s: %s\n", dir, ci_last_error());
  assert_non_null(model);
  static const int32_t ids[] = {5, 17, 42, 99, 7, 250, 3, 11, 64, 128, 9, 31};
  const int n = sizeof ids / sizeof ids[0];
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_F32, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  *vocab = model->spec.vocab;
  float *logits = malloc((size_t)*vocab * sizeof(float));
  assert_int_equal(ci_model_forward(model, seq, ids, n, logits, 1), CI_OK);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  return logits;
}

/* The gemma3 fixture rewritten as a `gemma3` multimodal checkpoint. */
static void test_gemma3_multimodal_wrapper(void **state) {
  (void)state;
  char src[1024], dst[] = "/tmp/cinfer-gemma3-mm-XXXXXX";
  snprintf(src, sizeof src, "%s/gemma3", CI_FIXTURE_DIR);
  assert_non_null(mkdtemp(dst));
  json_t *text = load_fixture_config("gemma3");
  json_object_set_new(text, "model_type", json_string("gemma3_text"));
  json_t *wrapper =
      json_pack("{s:s, s:o, s:{s:s, s:i}}", "model_type", "gemma3", "text_config", text,
                "vision_config", "model_type", "siglip_vision_model", "hidden_size", 8);
  char path[1200];
  snprintf(path, sizeof path, "%s/config.json", dst);
  assert_int_equal(json_dump_file(wrapper, path, 0), 0);
  json_decref(wrapper);
  ci_weights *weights = ci_weights_open(src);
  assert_non_null(weights);
  ci_st_writer *w = ci_st_writer_new();
  char names[256][160];
  assert_true(ci_weights_count(weights) < 256);
  for (int i = 0; i < ci_weights_count(weights); i++) {
    const ci_st_tensor *t = ci_weights_at(weights, i);
    assert_int_equal(strncmp(t->name, "model.", 6), 0);
    snprintf(names[i], sizeof names[i], "model.language_model.%s", t->name + 6);
    assert_int_equal(ci_st_writer_add(w, names[i], t->dtype, t->ndim, t->shape, t->data), CI_OK);
  }
  static const float vision[4] = {1, 2, 3, 4};
  const int64_t vshape[2] = {2, 2};
  assert_int_equal(
      ci_st_writer_add(w, "model.vision_tower.patch.weight", CI_F32, 2, vshape, vision), CI_OK);
  assert_int_equal(
      ci_st_writer_add(w, "model.multi_modal_projector.proj.weight", CI_F32, 2, vshape, vision),
      CI_OK);
  snprintf(path, sizeof path, "%s/model.safetensors", dst);
  assert_int_equal(ci_st_writer_write(w, path), CI_OK);
  ci_st_writer_free(w);
  ci_weights_free(weights);

  ci_backend *be = ci_cpu_backend_create(2);
  int vocab_a, vocab_b;
  float *a = last_logits(src, be, &vocab_a);
  float *b = last_logits(dst, be, &vocab_b);
  assert_int_equal(vocab_a, vocab_b);
  assert_memory_equal(a, b, (size_t)vocab_a * sizeof(float));
  free(a);
  free(b);
  be->ops->destroy(be);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dst);
  unlink(path);
  rmdir(dst);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemma4_upstream_form),
      cmocka_unit_test(test_gemma3_legacy_rope),
      cmocka_unit_test(test_gemma4_donors),
      cmocka_unit_test(test_gemma_rejections),
      cmocka_unit_test(test_gemma3_multimodal_wrapper),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
