/* Qwen3.5 hybrid models (gated DeltaNet + gated attention) on the CPU, without reference
 * fixtures: both config serialisations (flat qwen3_5_text, nested qwen3_5) and the layer-type
 * rules resolve to the same spec; the gated DeltaNet op's chunked form (prefill) and recurrent
 * form (decode) agree with a direct double-precision recurrence, at every split of the rows and
 * with a nonzero starting state, and a sequence's results do not depend on the others of a call;
 * on a random-weight model (tests/qwen35/config.json through cinfer_model_write_random, bf16 and
 * q4) a prefill of T tokens then T' decode steps gives the logits of one prefill of T + T', every
 * chunking gives the same logits, batched rows are bit-identical to solo runs, the MLX layout
 * (conv1d [C, Kc, 1], norms with the +1 folded in) gives the raw layout's logits, and what a
 * recurrent state cannot follow (a prefix attach without a state, a cache without states) is
 * refused with a message; a speculative round rolls the state back to its last kept row, and
 * speculative decoding gives the tokens of plain decoding; the engine's prefix cache resumes a
 * hybrid model from its state snapshots with the tokens of a run without the cache; `cinfer fit`
 * reports the bytes admission reserves for a hybrid request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/deltanet.h"
#include "base/error.h"
#include "cinfer.h"
#include "engine/engine.h"
#include "sample/sampler.h"
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

#define CONFIG_DIR CI_FIXTURE_DIR "/../qwen35"

/* ==== Config ==== */

static json_t *flat_config(void) {
  json_error_t err;
  json_t *c = json_load_file(CONFIG_DIR "/config.json", 0, &err);
  if (!c) fail_msg("%s: %s", CONFIG_DIR "/config.json", err.text);
  return c;
}

static void load_spec(json_t *config, ci_model_spec *spec) {
  if (ci_model_spec_from_json(config, spec)) fail_msg("spec: %s", ci_last_error());
}

/* The spec fields a serialisation must agree on. */
static void assert_same_spec(const ci_model_spec *a, const ci_model_spec *b) {
  assert_int_equal(a->n_layers, b->n_layers);
  assert_int_equal(a->n_cache_layers, b->n_cache_layers);
  assert_int_equal(a->n_deltanet_layers, b->n_deltanet_layers);
  for (int i = 0; i < a->n_layers; i++) {
    assert_int_equal(a->layers[i].mixer, b->layers[i].mixer);
    assert_int_equal(a->layers[i].kv_index, b->layers[i].kv_index);
  }
  assert_memory_equal(&a->deltanet, &b->deltanet, sizeof a->deltanet);
  assert_int_equal(a->ropes[0].rope.rot_dim, b->ropes[0].rope.rot_dim);
  assert_int_equal(a->ropes[0].rope.head_dim, b->ropes[0].rope.head_dim);
  assert_memory_equal(a->ropes[0].inv_freq, b->ropes[0].inv_freq,
                      (size_t)a->ropes[0].rope.rot_dim / 2 * sizeof(float));
  assert_int_equal(a->tied, b->tied);
  assert_int_equal(a->attn_output_gate, b->attn_output_gate);
  assert_true(a->norm_weight_offset == b->norm_weight_offset);
}

static void test_config(void **state) {
  (void)state;
  json_t *flat = flat_config();
  ci_model_spec a, b;
  load_spec(flat, &a);
  assert_string_equal(a.model_type, "qwen3_5_text");
  assert_int_equal(a.n_deltanet_layers, 2);
  assert_int_equal(a.n_cache_layers, 2);
  assert_int_equal(a.cache_layers[0], 1);
  assert_int_equal(a.cache_layers[1], 3);
  assert_int_equal(a.layers[0].mixer, CI_MIXER_DELTANET);
  assert_int_equal(a.layers[0].kv_index, -1);
  assert_int_equal(a.layers[3].kv_index, 1);
  assert_int_equal(a.ropes[0].rope.rot_dim, 8); /* 32 x 0.25 */
  assert_true(a.ropes[0].inv_freq[1] == 1.0f / powf(1e7f, 2.0f / 8.0f));
  assert_true(a.norm_weight_offset == 1.0f);
  assert_int_equal(a.qk_norm, 1);
  /* conv tail [3, 2*2*16 + 4*16] + state [4, 16, 16], two layers, f32 */
  assert_int_equal(ci_spec_state_bytes(&a), 2 * (3 * 128 + 4 * 16 * 16) * 4);

  /* nested: the multimodal wrapper with the text keys under text_config; its top-level
   * tie_word_embeddings and eos_token_id decide */
  json_t *text = json_deep_copy(flat);
  json_object_set_new(text, "tie_word_embeddings", json_false());
  json_t *nested = json_pack("{s:s, s:o, s:b, s:i}", "model_type", "qwen3_5", "text_config", text,
                             "tie_word_embeddings", 1, "eos_token_id", 7);
  load_spec(nested, &b);
  assert_string_equal(b.model_type, "qwen3_5_text");
  assert_same_spec(&a, &b);
  assert_int_equal(b.eos_ids[0], 7);
  ci_model_spec_free(&b);
  /* ... also when text_config names no model_type */
  json_object_del(text, "model_type");
  load_spec(nested, &b);
  assert_string_equal(b.model_type, "qwen3_5");
  assert_same_spec(&a, &b);
  ci_model_spec_free(&b);
  json_decref(nested);

  /* full_attention_interval instead of layer_types; the old partial_rotary_factor key */
  json_t *interval = json_deep_copy(flat);
  json_object_del(interval, "layer_types");
  json_object_set_new(interval, "full_attention_interval", json_integer(2));
  json_t *rope = json_object_get(interval, "rope_parameters");
  json_object_del(rope, "partial_rotary_factor");
  json_object_set_new(interval, "partial_rotary_factor", json_real(0.25));
  load_spec(interval, &b);
  assert_same_spec(&a, &b);
  ci_model_spec_free(&b);
  /* no interval: every fourth layer is full */
  json_object_del(interval, "full_attention_interval");
  load_spec(interval, &b);
  assert_int_equal(b.n_cache_layers, 1);
  assert_int_equal(b.cache_layers[0], 3);
  ci_model_spec_free(&b);
  json_decref(interval);

  /* legacy layer names */
  json_t *legacy = json_deep_copy(flat);
  json_object_set_new(legacy, "layer_types",
                      json_pack("[s, s, s, s]", "mamba", "attention", "conv", "full_attention"));
  load_spec(legacy, &b);
  assert_same_spec(&a, &b);
  ci_model_spec_free(&b);
  json_decref(legacy);

  /* rejected, with the problem named */
  static const struct {
    const char *key, *json, *message;
  } bad[] = {
      {"attn_output_gate", "false", "attn_output_gate"},
      {"layer_types", "[\"linear_attention\", \"full_attention\"]", "layer_types"},
      {"layer_types", "[\"linear_attention\", \"x\", \"x\", \"full_attention\"]", "\"x\""},
      {"layer_types",
       "[\"linear_attention\", \"linear_attention\", \"linear_attention\", \"linear_attention\"]",
       "full_attention"},
      {"linear_num_value_heads", "3", "linear_num_value_heads"},
      {"linear_conv_kernel_dim", "0", "linear_conv_kernel_dim"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    json_t *c = json_deep_copy(flat);
    json_object_set_new(c, bad[i].key, json_loads(bad[i].json, JSON_DECODE_ANY, NULL));
    ci_model_spec s;
    assert_int_equal(ci_model_spec_from_json(c, &s), CI_ERR);
    if (!strstr(ci_last_error(), bad[i].message))
      fail_msg("%s: error \"%s\" does not name %s", bad[i].key, ci_last_error(), bad[i].message);
    json_decref(c);
  }
  ci_model_spec_free(&a);
  json_decref(flat);
}

/* ==== The op ==== */

enum { HK = 2, HV = 4, DK = 8, DV = 12, KC = 4 };
enum { KD = HK * DK, VD = HV * DV, CH = 2 * KD + VD, STATE = (KC - 1) * CH + HV * DK * DV };

typedef struct {
  int n;
  float *qkv, *z, *b, *a; /* inputs of n rows */
  float conv[CH * KC], a_log[HV], dt_bias[HV], norm[DV];
} op_inputs;

static float uniform(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static void make_inputs(op_inputs *in, int n, uint64_t seed) {
  in->n = n;
  in->qkv = malloc((size_t)n * CH * sizeof(float));
  in->z = malloc((size_t)n * VD * sizeof(float));
  in->b = malloc((size_t)n * HV * sizeof(float));
  in->a = malloc((size_t)n * HV * sizeof(float));
  for (int i = 0; i < n * CH; i++) in->qkv[i] = uniform(&seed);
  for (int i = 0; i < n * VD; i++) in->z[i] = 2.0f * uniform(&seed);
  for (int i = 0; i < n * HV; i++) in->b[i] = 2.0f * uniform(&seed);
  for (int i = 0; i < n * HV; i++) in->a[i] = 2.0f * uniform(&seed);
  for (int i = 0; i < CH * KC; i++) in->conv[i] = 0.7f * uniform(&seed);
  for (int h = 0; h < HV; h++) {
    in->a_log[h] = logf(0.05f + 0.5f * (uniform(&seed) + 1.0f));
    in->dt_bias[h] = 1.0f + 0.3f * uniform(&seed);
  }
  for (int j = 0; j < DV; j++) in->norm[j] = 1.0f + 0.3f * uniform(&seed);
}

static void free_inputs(op_inputs *in) {
  free(in->qkv);
  free(in->z);
  free(in->b);
  free(in->a);
}

/* One op call over rows [first, first + n) of `in`, for one sequence with state `st`. */
static void run_op(ci_backend *be, const op_inputs *in, int first, int n, float *st, float *out) {
  float *qkv = malloc((size_t)n * CH * sizeof(float));
  memcpy(qkv, in->qkv + (size_t)first * CH, (size_t)n * CH * sizeof(float));
  const int32_t first_row = 0, n_rows = n;
  float *states[1] = {st};
  const ci_deltanet_args args = {.qkv = qkv,
                                 .z = in->z + (size_t)first * VD,
                                 .b = in->b + (size_t)first * HV,
                                 .a = in->a + (size_t)first * HV,
                                 .out = out + (size_t)first * VD,
                                 .conv_w = in->conv,
                                 .a_log = in->a_log,
                                 .dt_bias = in->dt_bias,
                                 .norm_w = in->norm,
                                 .norm_eps = 1e-6f,
                                 .n_k_heads = HK,
                                 .n_v_heads = HV,
                                 .k_head_dim = DK,
                                 .v_head_dim = DV,
                                 .conv_kernel = KC,
                                 .n_seqs = 1,
                                 .first_row = &first_row,
                                 .n_rows = &n_rows,
                                 .states = states};
  if (be->ops->gated_deltanet(be, &args)) fail_msg("op: %s", ci_last_error());
  free(qkv);
}

/* The definition, step by step in double precision: conv over (tail, rows), SiLU, L2 norms,
 * S <- g S; S <- S + k (beta (v - k S)); y = q S; gated RMSNorm. Starts from and updates st. */
static void reference(const op_inputs *in, double *st, double *out) {
  double *tail = st, *S = st + (KC - 1) * CH;
  double *X = malloc((size_t)(in->n + KC - 1) * CH * sizeof(double));
  memcpy(X, tail, (size_t)(KC - 1) * CH * sizeof(double));
  for (int i = 0; i < in->n * CH; i++) X[(KC - 1) * CH + i] = in->qkv[i];
  for (int t = 0; t < in->n; t++) {
    double u[CH];
    for (int c = 0; c < CH; c++) {
      double acc = 0;
      for (int k = 0; k < KC; k++) acc += in->conv[c * KC + k] * X[(size_t)(t + k) * CH + c];
      u[c] = acc / (1.0 + exp(-acc));
    }
    for (int h = 0; h < 2 * HK; h++) {
      double ss = 0;
      for (int i = 0; i < DK; i++) ss += u[h * DK + i] * u[h * DK + i];
      const double inv = 1.0 / sqrt(ss + 1e-6) * (h < HK ? 1.0 / sqrt((double)DK) : 1.0);
      for (int i = 0; i < DK; i++) u[h * DK + i] *= inv;
    }
    for (int hv = 0; hv < HV; hv++) {
      const int hk = hv / (HV / HK);
      const double *q = u + hk * DK, *k = u + KD + hk * DK, *v = u + 2 * KD + hv * DV;
      const double beta = 1.0 / (1.0 + exp(-in->b[t * HV + hv]));
      const double x = in->a[t * HV + hv] + in->dt_bias[hv];
      const double g = exp(-exp(in->a_log[hv]) * (x > 20 ? x : log1p(exp(x))));
      double *s = S + hv * DK * DV, m[DV], y[DV];
      for (int i = 0; i < DK * DV; i++) s[i] *= g;
      for (int j = 0; j < DV; j++) {
        m[j] = 0;
        for (int d = 0; d < DK; d++) m[j] += s[d * DV + j] * k[d];
      }
      for (int d = 0; d < DK; d++)
        for (int j = 0; j < DV; j++) s[d * DV + j] += k[d] * beta * (v[j] - m[j]);
      double ms = 0;
      for (int j = 0; j < DV; j++) {
        y[j] = 0;
        for (int d = 0; d < DK; d++) y[j] += s[d * DV + j] * q[d];
        ms += y[j] * y[j] / DV;
      }
      for (int j = 0; j < DV; j++) {
        const double zz = in->z[t * VD + hv * DV + j];
        out[(size_t)t * VD + hv * DV + j] =
            y[j] / sqrt(ms + 1e-6) * in->norm[j] * zz / (1.0 + exp(-zz));
      }
    }
  }
  memcpy(tail, X + (size_t)in->n * CH, (size_t)(KC - 1) * CH * sizeof(double));
  free(X);
}

static double max_diff(const float *x, const double *ref, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs(x[i] - ref[i]);
    if (!(d <= m)) m = d;
  }
  return m;
}

static void test_deltanet_op(void **state) {
  (void)state;
  ci_backend *be = ci_cpu_backend_create(2);
  assert_non_null(be);
  enum { N = 150 };
  op_inputs in;
  make_inputs(&in, N, 42);
  /* a nonzero starting state: the reference runs 5 rows of other inputs first */
  op_inputs warm;
  make_inputs(&warm, 5, 7);
  memcpy(warm.conv, in.conv, sizeof in.conv);
  memcpy(warm.a_log, in.a_log, sizeof in.a_log);
  memcpy(warm.dt_bias, in.dt_bias, sizeof in.dt_bias);
  memcpy(warm.norm, in.norm, sizeof in.norm);
  double *ref_state = calloc(STATE, sizeof(double));
  double *ref_out = malloc((size_t)N * VD * sizeof(double));
  double *warm_out = malloc(5 * VD * sizeof(double));
  reference(&warm, ref_state, warm_out);
  float *start = calloc(STATE, sizeof(float));
  float *warm_f = malloc(5 * VD * sizeof(float));
  run_op(be, &warm, 0, 5, start, warm_f); /* the op's own state after the same 5 rows */
  assert_true(max_diff(warm_f, warm_out, 5 * VD) < 1e-5);
  reference(&in, ref_state, ref_out);

  /* splits of the 150 rows: whole (chunks 64 + 64 + 22), single rows (recurrent), mixed */
  static const int splits[][8] = {{N}, {1}, {64, 1, 1, 84}, {3, 70, 77}, {37, 1, 112}};
  float *st = malloc(STATE * sizeof(float)), *out = malloc((size_t)N * VD * sizeof(float));
  for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
    memcpy(st, start, STATE * sizeof(float));
    for (int first = 0, p = 0; first < N; p = splits[s][p + 1] ? p + 1 : 0) {
      const int len = splits[s][p] < N - first ? splits[s][p] : N - first; /* pattern repeats */
      run_op(be, &in, first, len, st, out);
      first += len;
    }
    const double d_out = max_diff(out, ref_out, (size_t)N * VD);
    const double d_state = max_diff(st, ref_state, STATE);
    printf("  split %zu: max |d out| %.2e, max |d state| %.2e\n", s, d_out, d_state);
    assert_true(d_out < 2e-4 && d_state < 2e-4);
  }

  /* two sequences in one call: each bit-identical to its call alone */
  float *solo = calloc((size_t)N * VD, sizeof(float)),
        *both = calloc((size_t)N * VD, sizeof(float));
  float *st_a = malloc(STATE * sizeof(float)), *st_b = calloc(STATE, sizeof(float));
  memcpy(st_a, start, STATE * sizeof(float));
  run_op(be, &in, 0, 70, st_a, solo);
  float *st_c = calloc(STATE, sizeof(float));
  run_op(be, &in, 70, 1, st_c, solo);
  float *qkv = malloc(71 * CH * sizeof(float));
  memcpy(qkv, in.qkv, 71 * CH * sizeof(float));
  memcpy(st_b, start, STATE * sizeof(float));
  float *st_d = calloc(STATE, sizeof(float));
  const int32_t first_rows[2] = {0, 70}, n_rows[2] = {70, 1};
  float *states[2] = {st_b, st_d};
  const ci_deltanet_args args = {.qkv = qkv,
                                 .z = in.z,
                                 .b = in.b,
                                 .a = in.a,
                                 .out = both,
                                 .conv_w = in.conv,
                                 .a_log = in.a_log,
                                 .dt_bias = in.dt_bias,
                                 .norm_w = in.norm,
                                 .norm_eps = 1e-6f,
                                 .n_k_heads = HK,
                                 .n_v_heads = HV,
                                 .k_head_dim = DK,
                                 .v_head_dim = DV,
                                 .conv_kernel = KC,
                                 .n_seqs = 2,
                                 .first_row = first_rows,
                                 .n_rows = n_rows,
                                 .states = states};
  assert_int_equal(be->ops->gated_deltanet(be, &args), CI_OK);
  assert_memory_equal(solo, both, 71 * VD * sizeof(float));
  assert_memory_equal(st_a, st_b, STATE * sizeof(float));
  assert_memory_equal(st_c, st_d, STATE * sizeof(float));
  /* a bad geometry is refused */
  ci_deltanet_args bad = args;
  bad.n_v_heads = 3;
  assert_int_equal(be->ops->gated_deltanet(be, &bad), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "geometry"));

  free(qkv);
  free(st_a);
  free(st_b);
  free(st_c);
  free(st_d);
  free(solo);
  free(both);
  free(st);
  free(out);
  free(start);
  free(warm_f);
  free(warm_out);
  free(ref_out);
  free(ref_state);
  free_inputs(&warm);
  free_inputs(&in);
  be->ops->destroy(be);
}

/* ==== The model ==== */

typedef struct {
  char dir[64];
  ci_backend *be;
  ci_model *model;
} random_model;

static void rm_dir(const char *dir) {
  char path[256];
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/kv_config.json", dir);
  unlink(path);
  rmdir(dir);
}

static void open_random(random_model *r, const char *dtype) {
  snprintf(r->dir, sizeof r->dir, "/tmp/ci_qwen35_XXXXXX");
  assert_non_null(mkdtemp(r->dir));
  const cinfer_random_model_options options = {dtype, 64, 3};
  if (cinfer_model_write_random(CONFIG_DIR "/config.json", r->dir, &options) != CINFER_OK)
    fail_msg("write random: %s", cinfer_last_error());
  r->be = ci_cpu_backend_create(2);
  assert_non_null(r->be);
  r->model = ci_model_load(r->dir, r->be);
  if (!r->model) fail_msg("load: %s", ci_last_error());
}

static void close_random(random_model *r) {
  ci_model_free(r->model);
  r->be->ops->destroy(r->be);
  rm_dir(r->dir);
}

enum { T0 = 70, T1 = 25, TOTAL = T0 + T1 };

static void prompt_ids(int32_t *ids, int n, int vocab) {
  for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 37 + 11) % vocab);
}

/* Logits of every position of ids fed in chunks of `chunk` through a fresh sequence. */
static void logits_by_chunk(ci_model *m, const int32_t *ids, int n, int chunk, float *out) {
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_F32, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq);
  for (int s = 0; s < n; s += chunk) {
    const int len = n - s < chunk ? n - s : chunk;
    if (ci_model_forward(m, seq, ids + s, len, out + (size_t)s * m->spec.vocab, len))
      fail_msg("forward: %s", ci_last_error());
  }
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
}

static float max_abs_diff(const float *x, const float *y, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; i++) {
    const float d = fabsf(x[i] - y[i]);
    if (!(d <= m)) m = d;
  }
  return m;
}

/* T then T' single steps equals T + T' at once; every chunking agrees. */
static void check_chunkings(ci_model *m, const char *name) {
  const int V = m->spec.vocab;
  int32_t ids[TOTAL];
  prompt_ids(ids, TOTAL, V);
  float *whole = malloc((size_t)TOTAL * V * sizeof(float));
  float *other = malloc((size_t)TOTAL * V * sizeof(float));
  logits_by_chunk(m, ids, TOTAL, TOTAL, whole);
  float scale = 0;
  for (int i = 0; i < TOTAL * V; i++) scale = fmaxf(scale, fabsf(whole[i]));
  assert_true(scale > 0.05f);
  /* prefill T0, then T1 decode steps */
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_F32, 16, 0);
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(m, seq, ids, T0, other, T0), CI_OK);
  for (int t = T0; t < TOTAL; t++)
    assert_int_equal(ci_model_forward(m, seq, ids + t, 1, other + (size_t)t * V, 1), CI_OK);
  float d = max_abs_diff(whole, other, (size_t)TOTAL * V);
  printf("  %s: prefill %d + %d steps vs prefill %d: max |dlogit| %.2e (max |logit| %.2f)\n", name,
         T0, T1, TOTAL, d, scale);
  assert_true(d < 1e-4f * (1.0f + scale));
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  static const int chunks[] = {1, 3, 64, 65, 17};
  for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
    logits_by_chunk(m, ids, TOTAL, chunks[c], other);
    d = max_abs_diff(whole, other, (size_t)TOTAL * V);
    printf("  %s: chunk %d: max |dlogit| %.2e\n", name, chunks[c], d);
    assert_true(d < 1e-4f * (1.0f + scale));
  }
  free(whole);
  free(other);
}

/* Decode rows batched and a prefill chunk beside them: bit-identical to solo runs. */
static void check_batch_invariance(ci_model *m) {
  enum { NS = 3 };
  const int V = m->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  ci_kv_seq *solo[NS + 1], *batch[NS + 1];
  int32_t ids[TOTAL];
  prompt_ids(ids, TOTAL, V);
  float *a = malloc((size_t)(NS + 1) * V * sizeof(float));
  float *b = malloc((size_t)(NS + 1) * V * sizeof(float));
  int32_t next[NS];
  for (int i = 0; i < NS; i++) {
    solo[i] = ci_kv_seq_create(cache);
    batch[i] = ci_kv_seq_create(cache);
    const int len = 5 + 30 * i;
    assert_int_equal(ci_model_forward(m, solo[i], ids + i, len, a, 1), CI_OK);
    assert_int_equal(ci_model_forward(m, batch[i], ids + i, len, b, 1), CI_OK);
    assert_memory_equal(a, b, (size_t)V * sizeof(float));
    next[i] = (int32_t)(i + 3);
  }
  for (int step = 0; step < 4; step++) {
    for (int i = 0; i < NS; i++)
      assert_int_equal(ci_model_forward(m, solo[i], &next[i], 1, a + (size_t)i * V, 1), CI_OK);
    assert_int_equal(ci_model_forward_decode_batch(m, batch, next, NS, b), CI_OK);
    assert_memory_equal(a, b, (size_t)NS * V * sizeof(float));
    for (int i = 0; i < NS; i++) next[i] = (int32_t)((next[i] * 17 + step) % V);
  }
  /* a prefill chunk of 40 rows beside the three decode rows */
  solo[NS] = ci_kv_seq_create(cache);
  batch[NS] = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(m, solo[NS], ids, 40, a + (size_t)NS * V, 1), CI_OK);
  for (int i = 0; i < NS; i++)
    assert_int_equal(ci_model_forward(m, solo[i], &next[i], 1, a + (size_t)i * V, 1), CI_OK);
  ci_step_seq steps[NS + 1];
  steps[0] = (ci_step_seq){.seq = batch[NS], .ids = ids, .n_rows = 40, .n_logit_rows = 1};
  for (int i = 0; i < NS; i++)
    steps[i + 1] = (ci_step_seq){.seq = batch[i], .ids = &next[i], .n_rows = 1, .n_logit_rows = 1};
  ci_workspace *ws = ci_workspace_create(m->be);
  assert_int_equal(ci_model_step(m, ws, steps, NS + 1, b), CI_OK);
  assert_memory_equal(a + (size_t)NS * V, b, (size_t)V * sizeof(float));
  assert_memory_equal(a, b + V, (size_t)NS * V * sizeof(float));
  ci_workspace_free(ws);
  for (int i = 0; i <= NS; i++) {
    ci_kv_seq_free(solo[i]);
    ci_kv_seq_free(batch[i]);
  }
  /* the live states count as KV memory: none left */
  assert_int_equal(ci_kv_cache_bytes_used(cache), 0);
  ci_kv_cache_free(cache);
  free(a);
  free(b);
}

/* What a recurrent state cannot follow is refused, naming the reason. */
static void check_refusals(ci_model *m) {
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  assert_int_equal(ci_kv_cache_state_bytes(cache), ci_spec_state_bytes(&m->spec));
  ci_kv_seq *seq = ci_kv_seq_create(cache);
  assert_non_null(seq->state);
  assert_int_equal(ci_kv_cache_bytes_used(cache), ci_spec_state_bytes(&m->spec));
  int32_t ids[40];
  prompt_ids(ids, 40, m->spec.vocab);
  assert_int_equal(ci_model_forward(m, seq, ids, 32, NULL, 0), CI_OK);
  ci_kv_seq *other = ci_kv_seq_create(cache);
  ci_kv_block_ref refs[2];
  for (int g = 0; g < cache->n_groups && g < 2; g++) refs[g] = ci_kv_seq_block(seq, g, 0);
  assert_int_equal(cache->n_groups, 1);
  assert_int_equal(ci_kv_seq_attach(other, 1, refs, 0, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "recurrent state"));
  ci_kv_seq_free(other);
  ci_kv_seq_free(seq);
  ci_kv_cache_free(cache);
  /* a cache made without states */
  const ci_kv_layer_desc desc[2] = {{0, 2, 32, 0}, {0, 2, 32, 0}};
  ci_kv_cache *plain = ci_kv_cache_create(m->be, 2, desc, CI_KV_BF16, 16, 0);
  ci_kv_seq *stateless = ci_kv_seq_create(plain);
  assert_int_equal(ci_model_forward(m, stateless, ids, 4, NULL, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "recurrent state"));
  ci_kv_seq_free(stateless);
  ci_kv_cache_free(plain);
}

/* With a budget, each sequence's recurrent state and its speculative checkpoints are runs of
 * whole slabs of the KV arena: the arena's bytes taken grow by whole slabs per sequence, a state
 * that finds no run free is refused naming the shortage, and everything goes back at free. */
static void check_arena_states(ci_model *m) {
  ci_kv_cache *probe = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  assert_non_null(probe);
  const int64_t slab = ci_kv_cache_slab_bytes(probe), state = ci_spec_state_bytes(&m->spec);
  const int64_t state_slabs = (state + slab - 1) / slab,
                round_slabs = (5 * state + slab - 1) / slab;
  /* without a budget: a backend allocation of the exact size, counted all the same */
  ci_kv_seq *own = ci_kv_seq_create(probe);
  assert_non_null(own);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(probe), 0);
  assert_int_equal(ci_kv_cache_bytes_used(probe), state);
  assert_int_equal(ci_kv_seq_reserve_checkpoints(own, 4), CI_OK);
  assert_int_equal(ci_kv_cache_bytes_used(probe), 6 * state);
  ci_kv_seq_free(own);
  assert_int_equal(ci_kv_cache_bytes_used(probe), 0);
  ci_kv_cache_free(probe);

  /* room for two states and one sequence's checkpoints for rounds of 4 rows */
  const int64_t slabs = 2 * state_slabs + round_slabs;
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, slabs * slab);
  assert_non_null(cache);
  assert_int_equal(ci_kv_cache_arena_bytes(cache), slabs * slab);
  assert_int_equal(ci_kv_cache_state_cost(cache, 0), state_slabs * slab);
  assert_int_equal(ci_kv_cache_state_cost(cache, 4), (state_slabs + round_slabs) * slab);
  const uint8_t *base = ci_kv_cache_arena_base(cache);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), 0);
  ci_kv_seq *a = ci_kv_seq_create(cache);
  assert_non_null(a);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), state_slabs * slab);
  assert_int_equal(ci_kv_cache_bytes_used(cache), state_slabs * slab);
  assert_true((const uint8_t *)a->state >= base &&
              (const uint8_t *)a->state + state <= base + slabs * slab);
  for (int64_t i = 0; i < state / (int64_t)sizeof(float); i++) assert_true(a->state[i] == 0.0f);
  ci_kv_seq *b = ci_kv_seq_create(cache);
  assert_non_null(b);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), 2 * state_slabs * slab);
  assert_int_equal(ci_kv_seq_reserve_checkpoints(a, 4), CI_OK);
  assert_int_equal(a->n_checkpoints, 5);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), slabs * slab);
  assert_int_equal(ci_kv_cache_bytes_used(cache), slabs * slab);
  assert_true((const uint8_t *)a->checkpoints >= base &&
              (const uint8_t *)a->checkpoints + 5 * state <= base + slabs * slab);
  /* reserved once: a round of up to 4 rows takes nothing more */
  assert_int_equal(ci_kv_seq_reserve_checkpoints(a, 3), CI_OK);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), slabs * slab);
  /* the budget is used up: another state, or B's checkpoints, are refused naming the reason */
  assert_null(ci_kv_seq_create(cache));
  assert_non_null(strstr(ci_last_error(), "recurrent state"));
  assert_non_null(strstr(ci_last_error(), "consecutive free slabs"));
  assert_int_equal(ci_kv_seq_reserve_checkpoints(b, 4), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "checkpoints"));
  assert_int_equal(b->n_checkpoints, 0);
  assert_int_equal(ci_kv_seq_round_open(b, 2), CI_ERR);
  assert_int_equal(b->round_open, 0);
  /* a round on A (state from the arena) still decodes: prefill, verify 3 rows, keep 1 */
  int32_t ids[20];
  prompt_ids(ids, 20, m->spec.vocab);
  ci_kv_seq_free(b); /* its slabs hold A's blocks */
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), (state_slabs + round_slabs) * slab);
  assert_int_equal(ci_model_forward(m, a, ids, 16, NULL, 0), CI_OK);
  const int64_t allocations = cache->arena.allocations + m->be->ops->allocation_count(m->be);
  ci_kv_seq_set_rollback_reserve(a, 3);
  assert_int_equal(ci_kv_seq_round_open(a, 3), CI_OK);
  assert_int_equal(ci_model_forward(m, a, ids + 16, 3, NULL, 0), CI_OK);
  assert_int_equal(ci_kv_seq_round_close(a, 17), CI_OK);
  /* the round allocated nothing: its checkpoints were reserved, its block came from the arena */
  assert_int_equal(cache->arena.allocations + m->be->ops->allocation_count(m->be), allocations);
  ci_kv_seq_free(a);
  assert_int_equal(ci_kv_cache_arena_bytes_taken(cache), 0);
  assert_int_equal(ci_kv_cache_bytes_used(cache), 0);
  assert_int_equal(cache->arena.n_free, cache->arena.n_slabs);
  ci_kv_cache_free(cache);
}

/* Runs a job to the end on `e`; returns the tokens (and their logprobs) and the DONE event. */
static int run_job(ci_engine *e, const ci_engine_job *job, int32_t *tokens, float *logprobs,
                   ci_engine_event *done) {
  ci_engine_request *r = NULL;
  if (ci_engine_submit(e, job, &r) != CI_ENGINE_SUBMITTED) fail_msg("submit: %s", ci_last_error());
  int n = 0;
  ci_engine_event ev;
  for (;;) {
    assert_int_equal(ci_engine_request_next(r, &ev, 60.0), 1);
    if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
    tokens[n] = ev.token;
    logprobs[n++] = ev.logprob;
  }
  if (ev.kind != CI_ENGINE_EVENT_DONE) fail_msg("request: %s", ev.message);
  *done = ev;
  ci_engine_request_release(r);
  return n;
}

/* A speculative round on a hybrid model: 5 rows verified at once, 2 kept; the state (and the
 * logits after it) are those of a sequence that decoded the 2 rows one by one; a step longer
 * than the room of the round's checkpoints is refused. */
static void check_rollback(ci_model *m) {
  const int V = m->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(m, CI_KV_BF16, 16, 0);
  ci_kv_seq *solo = ci_kv_seq_create(cache), *spec = ci_kv_seq_create(cache);
  int32_t ids[50];
  prompt_ids(ids, 50, V);
  float *a = malloc(5 * (size_t)V * sizeof(float)), *b = malloc(5 * (size_t)V * sizeof(float));
  assert_int_equal(ci_model_forward(m, solo, ids, 40, NULL, 0), CI_OK);
  assert_int_equal(ci_model_forward(m, spec, ids, 40, NULL, 0), CI_OK);
  for (int t = 40; t < 45; t++)
    assert_int_equal(ci_model_forward(m, solo, ids + t, 1, a + (size_t)(t - 40) * V, 1), CI_OK);
  ci_kv_seq_set_rollback_reserve(spec, 5);
  assert_int_equal(ci_kv_seq_round_open(spec, 5), CI_OK);
  assert_int_equal(ci_model_forward(m, spec, ids + 40, 5, b, 5), CI_OK);
  /* every verified row equals the single-row decode of the same token */
  const float d = max_abs_diff(a, b, 5 * (size_t)V);
  printf("  round of 5 rows vs 5 single steps: max |dlogit| %.2e\n", d);
  assert_true(d < 1e-5f);
  assert_int_equal(ci_kv_seq_round_close(spec, 42), CI_OK);
  /* continue both from 42 with the same tokens */
  ci_kv_seq *ref = ci_kv_seq_create(cache);
  assert_int_equal(ci_model_forward(m, ref, ids, 40, NULL, 0), CI_OK);
  for (int t = 40; t < 42; t++) assert_int_equal(ci_model_forward(m, ref, ids + t, 1, a, 1), CI_OK);
  const int64_t floats = ci_spec_state_bytes(&m->spec) / (int64_t)sizeof(float);
  float worst = max_abs_diff(ref->state, spec->state, (size_t)floats);
  printf("  state after rollback to 2 kept rows: max |d| %.2e\n", worst);
  assert_true(worst < 1e-5f);
  const int32_t next[3] = {7, 9, 11};
  for (int t = 0; t < 3; t++) {
    assert_int_equal(ci_model_forward(m, ref, next + t, 1, a, 1), CI_OK);
    assert_int_equal(ci_model_forward(m, spec, next + t, 1, b, 1), CI_OK);
    assert_true(max_abs_diff(a, b, (size_t)V) < 1e-5f);
  }
  /* a round's step may not outgrow the room of its checkpoints (6 states, from the round of 5) */
  assert_int_equal(ci_kv_seq_round_open(spec, 2), CI_OK);
  assert_int_equal(ci_model_forward(m, spec, ids, 6, NULL, 0), CI_ERR);
  assert_non_null(strstr(ci_last_error(), "checkpoints"));
  assert_int_equal(ci_kv_seq_round_close(spec, spec->n), CI_OK);
  ci_kv_seq_free(ref);
  ci_kv_seq_free(solo);
  ci_kv_seq_free(spec);
  ci_kv_cache_free(cache);
  free(a);
  free(b);
}

/* A greedy engine job of the n-token prompt for max_tokens tokens. */
static ci_engine_job greedy_job(const int32_t *prompt, int n, int max_tokens) {
  ci_engine_job job;
  memset(&job, 0, sizeof job);
  job.prompt = prompt;
  job.n_prompt = n;
  job.max_tokens = max_tokens;
  ci_sampler_params_default(&job.sampling);
  job.sampling.temperature = 0;
  return job;
}

/* Speculative decoding by prompt lookup in the engine gives the tokens of plain decoding, with
 * drafts accepted. */
static void check_speculation(ci_model *m) {
  enum { P = 60, GEN = 24 };
  int32_t prompt[P], ref[GEN], got[GEN];
  float ref_lp[GEN], got_lp[GEN];
  for (int t = 0; t < P; t++) prompt[t] = (int32_t)(3 + t % 6); /* repetitive: drafts exist */
  ci_engine_job job = greedy_job(prompt, P, GEN);
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 256;
  o.prefix_cache_bytes = 0;
  ci_engine_event done;
  ci_engine *plain = ci_engine_create(m, &o);
  assert_non_null(plain);
  assert_int_equal(run_job(plain, &job, ref, ref_lp, &done), GEN);
  ci_engine_free(plain);
  o.lookup_ngram = 2;
  o.draft_max = 4;
  ci_engine *e = ci_engine_create(m, &o);
  if (!e) fail_msg("speculative engine: %s", ci_last_error());
  assert_int_equal(run_job(e, &job, got, got_lp, &done), GEN);
  printf("  speculation: %d drafted, %d accepted\n", done.draft_tokens, done.accepted_tokens);
  assert_true(done.draft_tokens > 0);
  assert_memory_equal(got, ref, sizeof got);
  for (int t = 0; t < GEN; t++) assert_true(fabsf(got_lp[t] - ref_lp[t]) < 1e-4f);
  /* a second request allocates nothing: its state and checkpoints are arena slabs taken at
   * admission, and no speculative step allocates */
  const int64_t allocations = m->be->ops->allocation_count(m->be);
  assert_int_equal(run_job(e, &job, got, got_lp, &done), GEN);
  assert_true(done.draft_tokens > 0);
  assert_memory_equal(got, ref, sizeof got);
  const int64_t more = m->be->ops->allocation_count(m->be) - allocations;
  if (more != 0) fail_msg("%lld backend allocations in a speculative request", (long long)more);
  /* admission counts the state and the checkpoints of rounds of draft_max + 1 rows beside the
   * blocks (one group of full-attention layers here) */
  ci_kv_cache *probe = ci_model_kv_cache_create(m, CI_KV_BF16, o.block_tokens, 0);
  assert_non_null(probe);
  assert_int_equal(probe->n_groups, 1);
  const ci_kv_format bf16 = ci_kv_format_plain(CI_KV_BF16);
  const int64_t blocks = (100 + o.block_tokens - 1) / o.block_tokens;
  const int64_t block = ci_kv_cache_block_cost(probe, 0, &bf16);
  assert_true(ci_kv_cache_state_cost(probe, 5) > ci_kv_cache_state_cost(probe, 0));
  assert_int_equal(ci_engine_reservation_bytes(e, 100),
                   blocks * block + ci_kv_cache_state_cost(probe, o.draft_max + 1));
  ci_engine_free(e);
  o.lookup_ngram = 0;
  e = ci_engine_create(m, &o);
  assert_non_null(e);
  assert_int_equal(ci_engine_reservation_bytes(e, 100),
                   blocks * block + ci_kv_cache_state_cost(probe, 0));
  ci_engine_free(e);
  ci_kv_cache_free(probe);
}

/* A budget of one speculating request's reservation (blocks, state, checkpoints): a second
 * request waits in the queue until the first gives its slabs back, and both finish with the
 * tokens of a solo run. */
static void check_tight_budget(ci_model *m) {
  enum { P = 40, GEN = 10 };
  int32_t prompt[P], ref[GEN], got[GEN];
  float lp[GEN];
  for (int t = 0; t < P; t++) prompt[t] = (int32_t)(3 + t % 5);
  ci_engine_job job = greedy_job(prompt, P, GEN);
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 128;
  o.prefix_cache_bytes = 0;
  o.lookup_ngram = 2;
  o.draft_max = 3;
  ci_engine *probe = ci_engine_create(m, &o);
  assert_non_null(probe);
  o.kv_budget_bytes = ci_engine_reservation_bytes(probe, P + GEN);
  ci_engine_free(probe);
  ci_engine *e = ci_engine_create(m, &o);
  assert_non_null(e);
  ci_engine_event done;
  assert_int_equal(run_job(e, &job, ref, lp, &done), GEN);
  /* one token more than the budget holds is refused at submission */
  ci_engine_job longer = job;
  longer.max_tokens = GEN + 2 * o.block_tokens;
  ci_engine_request *r[2];
  assert_int_equal(ci_engine_submit(e, &longer, &r[0]), CI_ENGINE_OVER_BUDGET);
  for (int i = 0; i < 2; i++)
    assert_int_equal(ci_engine_submit(e, &job, &r[i]), CI_ENGINE_SUBMITTED);
  for (int i = 0; i < 2; i++) {
    int n = 0;
    ci_engine_event ev;
    for (;;) {
      assert_int_equal(ci_engine_request_next(r[i], &ev, 60.0), 1);
      if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
      if (n < GEN) got[n] = ev.token;
      n++;
    }
    if (ev.kind != CI_ENGINE_EVENT_DONE) fail_msg("request %d: %s", i, ev.message);
    assert_int_equal(n, GEN);
    assert_memory_equal(got, ref, sizeof got);
    ci_engine_request_release(r[i]);
  }
  ci_engine_free(e);
}

/* The engine's prefix cache on a hybrid model: a repeated prompt resumes from the snapshot at
 * its last prefill-chunk boundary (96 of 100 tokens: the same chunks as without the cache, so
 * the same logprobs bit for bit), and the next turn of a conversation from the snapshot the
 * first request left while decoding (112); both give the tokens of an engine without cache. The
 * snapshots are arena slabs: the next turn makes no backend allocation. */
static void check_prefix_cache(ci_model *m) {
  enum { P = 100, GEN = 14, MORE = 20, NEXT = P + GEN + MORE };
  int32_t prompt[NEXT], ref[2][GEN], got[GEN];
  float ref_lp[2][GEN], got_lp[GEN];
  prompt_ids(prompt, P, m->spec.vocab);
  ci_engine_job job = greedy_job(prompt, P, GEN);
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.prefill_chunk = 32;
  o.batch_tokens = 64;
  o.ctx_size = 512;
  o.prefix_cache_bytes = 0;
  ci_engine_event done;
  ci_engine *plain = ci_engine_create(m, &o);
  assert_non_null(plain);
  assert_int_equal(run_job(plain, &job, ref[0], ref_lp[0], &done), GEN);
  ci_engine_job next = job;
  next.prompt = prompt;
  next.n_prompt = NEXT;
  memcpy(prompt + P, ref[0], sizeof ref[0]);
  for (int t = 0; t < MORE; t++) prompt[P + GEN + t] = (int32_t)(t + 5);
  assert_int_equal(run_job(plain, &next, ref[1], ref_lp[1], &done), GEN);
  assert_int_equal(done.cached_tokens, 0);
  ci_engine_free(plain);

  o.prefix_cache_bytes = 64 << 20;
  ci_engine *e = ci_engine_create(m, &o);
  assert_non_null(e);
  assert_int_equal(run_job(e, &job, got, got_lp, &done), GEN);
  assert_int_equal(done.cached_tokens, 0);
  assert_memory_equal(got, ref[0], sizeof got);
  assert_int_equal(run_job(e, &job, got, got_lp, &done), GEN);
  assert_int_equal(done.cached_tokens, 96);
  assert_memory_equal(got, ref[0], sizeof got);
  assert_memory_equal(got_lp, ref_lp[0], sizeof got_lp);
  /* the next turn takes new snapshots (at its chunk ends and while decoding) and allocates
   * nothing: they are arena slabs like the sequences' states */
  const int64_t allocations = m->be->ops->allocation_count(m->be);
  assert_int_equal(run_job(e, &next, got, got_lp, &done), GEN);
  assert_int_equal(m->be->ops->allocation_count(m->be), allocations);
  assert_int_equal(done.cached_tokens, 112);
  assert_memory_equal(got, ref[1], sizeof got);
  for (int t = 0; t < GEN; t++) assert_true(fabsf(got_lp[t] - ref_lp[1][t]) < 1e-4f);
  ci_engine_stats stats;
  ci_engine_get_stats(e, &stats);
  assert_int_equal(stats.prefix_hits, 2);
  ci_engine_free(e);
}

/* n > 1 choices on a hybrid model: the first choice prefills, the others fork its sequence
 * (blocks shared, the recurrent state copied) and each choice gives what a solo request with its
 * seed gives. */
static void check_choices(ci_model *m) {
  enum { P = 40, GEN = 12, N = 3 };
  int32_t prompt[P], solo[N][GEN];
  float lp[GEN];
  prompt_ids(prompt, P, m->spec.vocab);
  ci_engine_job job;
  memset(&job, 0, sizeof job);
  job.prompt = prompt;
  job.n_prompt = P;
  job.max_tokens = GEN;
  ci_sampler_params_default(&job.sampling);
  job.sampling.temperature = 1.0f;
  job.sampling.has_seed = 1;
  job.sampling.seed = 1234;
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 256;
  o.prefix_cache_bytes = 0;
  ci_engine *e = ci_engine_create(m, &o);
  assert_non_null(e);
  ci_engine_event done;
  for (int i = 0; i < N; i++) {
    ci_engine_job one = job;
    one.sampling.seed = ci_engine_choice_seed(job.sampling.seed, i);
    assert_int_equal(run_job(e, &one, solo[i], lp, &done), GEN);
  }
  ci_engine_request *r[N];
  if (ci_engine_submit_n(e, &job, N, r) != CI_ENGINE_SUBMITTED)
    fail_msg("submit_n: %s", ci_last_error());
  for (int i = 0; i < N; i++) {
    int32_t got[GEN];
    int n = 0;
    ci_engine_event ev;
    for (;;) {
      assert_int_equal(ci_engine_request_next(r[i], &ev, 60.0), 1);
      if (ev.kind != CI_ENGINE_EVENT_TOKEN) break;
      if (n < GEN) got[n] = ev.token;
      n++;
    }
    if (ev.kind != CI_ENGINE_EVENT_DONE) fail_msg("choice %d: %s", i, ev.message);
    assert_int_equal(n, GEN);
    assert_memory_equal(got, solo[i], sizeof got);
    ci_engine_request_release(r[i]);
  }
  printf("  %d choices of one prefill equal their solo requests\n", N);
  ci_engine_free(e);
}

/* `cinfer fit` counts what admission reserves for a hybrid request: cinfer_fit's KV figure for
 * one sequence equals the engine's reservation, with and without speculation (the state, and
 * the checkpoints of rounds of draft_max + 1 rows, in whole arena slabs), and its state figure is
 * that part; batch sequences hold batch times as much. */
static void check_fit(const random_model *r) {
  enum { N = 100, DRAFT = 4 };
  ci_engine_options o;
  ci_engine_options_default(&o);
  o.ctx_size = 256;
  o.prefix_cache_bytes = 0;
  ci_kv_cache *probe = ci_model_kv_cache_create(r->model, CI_KV_BF16, o.block_tokens, 0);
  assert_non_null(probe);
  for (int speculates = 0; speculates <= 1; speculates++) {
    o.lookup_ngram = speculates ? 2 : 0;
    o.draft_max = DRAFT;
    ci_engine *e = ci_engine_create(r->model, &o);
    assert_non_null(e);
    cinfer_fit_options fo;
    cinfer_fit_options_init(&fo);
    fo.context = N;
    fo.memory_bytes = 1LL << 30;
    fo.draft_max = speculates ? DRAFT : 0;
    cinfer_fit_result fit;
    if (cinfer_fit(r->dir, &fo, &fit) != CINFER_OK) fail_msg("fit: %s", cinfer_last_error());
    const int64_t reserved = ci_engine_reservation_bytes(e, N);
    printf("  fit %s speculation: kv %lld (state %lld), admission reserves %lld\n",
           speculates ? "with" : "without", (long long)fit.kv_bytes, (long long)fit.state_bytes,
           (long long)reserved);
    assert_int_equal(fit.kv_bytes, reserved);
    assert_int_equal(fit.state_bytes, ci_kv_cache_state_cost(probe, speculates ? DRAFT + 1 : 0));
    assert_true(fit.state_bytes > 0 && fit.state_bytes % ci_kv_cache_slab_bytes(probe) == 0);
    fo.batch = 3;
    assert_int_equal(cinfer_fit(r->dir, &fo, &fit), CINFER_OK);
    assert_int_equal(fit.kv_bytes, 3 * reserved);
    ci_engine_free(e);
  }
  ci_kv_cache_free(probe);
}

static void test_random_bf16(void **state) {
  (void)state;
  random_model r;
  open_random(&r, "bf16");
  check_chunkings(r.model, "bf16");
  check_batch_invariance(r.model);
  check_refusals(r.model);
  check_rollback(r.model);
  check_prefix_cache(r.model);
  check_speculation(r.model);
  check_arena_states(r.model);
  check_tight_budget(r.model);
  check_choices(r.model);
  check_fit(&r);
  close_random(&r);
}

static void test_random_q4(void **state) {
  (void)state;
  random_model r;
  open_random(&r, "q4");
  assert_int_equal(r.model->layers[0].dn_in_qkv.dtype, CI_Q4);
  check_chunkings(r.model, "q4");
  close_random(&r);
}

/* kv_config.json lists Qwen3.5's cache layers by their layer index: layer 3 is cache layer 1;
 * a DeltaNet layer is refused. */
static void test_kv_config(void **state) {
  (void)state;
  random_model r;
  open_random(&r, "bf16");
  char path[256];
  snprintf(path, sizeof path, "%s/kv_config.json", r.dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs("[{\"layer_idx\": 3, \"bits\": 8, \"group_size\": 32}]\n", f);
  fclose(f);
  ci_model *m = ci_model_load(r.dir, r.be);
  if (!m) fail_msg("load with kv_config.json: %s", ci_last_error());
  assert_non_null(m->kv_config);
  assert_int_equal(m->kv_config[0].codec, CI_KV_BF16);
  assert_int_equal(m->kv_config[1].codec, CI_KV_AFFINE);
  assert_int_equal(m->kv_config[1].k_bits, 8);
  ci_model_free(m);
  f = fopen(path, "w");
  fputs("[{\"layer_idx\": 2, \"bits\": 8}]\n", f);
  fclose(f);
  assert_null(ci_model_load(r.dir, r.be));
  assert_non_null(strstr(ci_last_error(), "layer_idx 2 is not a layer with a KV cache"));
  close_random(&r);
}

/* ==== MLX layout ==== */

/* Rewrites the raw random model's weights in the MLX layout: conv1d [C, Kc, 1] and every
 * zero-centred norm stored as 1 + w (f32, exact), linear_attn.norm as is. */
static void write_mlx_layout(const char *src, const char *dst) {
  ci_weights *w = ci_weights_open(src);
  assert_non_null(w);
  ci_st_writer *out = ci_st_writer_new();
  float **owned = calloc((size_t)ci_weights_count(w), sizeof *owned);
  for (int i = 0; i < ci_weights_count(w); i++) {
    const ci_st_tensor *t = ci_weights_at(w, i);
    const char *name = t->name;
    const size_t len = strlen(name);
    const int conv = strstr(name, "conv1d.weight") != NULL;
    const int norm =
        len > 11 && !strcmp(name + len - 11, "norm.weight") && !strstr(name, "linear_attn.norm");
    if (!conv && !norm) {
      assert_int_equal(ci_st_writer_add(out, name, t->dtype, t->ndim, t->shape, t->data), CI_OK);
      continue;
    }
    const int64_t n = ci_st_tensor_numel(t);
    float *v = owned[i] = malloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++)
      v[k] = ci_float_at(t->dtype, t->data, (size_t)k) + (norm ? 1 : 0);
    int64_t shape[3] = {t->shape[0], t->shape[1], t->shape[2]};
    if (conv) {
      shape[1] = t->shape[2];
      shape[2] = 1;
    }
    assert_int_equal(ci_st_writer_add(out, name, CI_F32, t->ndim, shape, v), CI_OK);
  }
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dst);
  assert_int_equal(ci_st_writer_write(out, path), CI_OK);
  for (int i = 0; i < ci_weights_count(w); i++) free(owned[i]);
  free(owned);
  ci_st_writer_free(out);
  ci_weights_free(w);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cp %s/config.json %s/config.json", src, dst);
  assert_int_equal(system(cmd), 0);
}

static void test_mlx_layout(void **state) {
  (void)state;
  random_model r;
  open_random(&r, "bf16");
  char dir[] = "/tmp/ci_qwen35_mlx_XXXXXX";
  assert_non_null(mkdtemp(dir));
  write_mlx_layout(r.dir, dir);
  ci_model *mlx = ci_model_load(dir, r.be);
  if (!mlx) fail_msg("load mlx layout: %s", ci_last_error());
  assert_true(mlx->spec.norm_weight_offset == 0.0f);
  const int V = r.model->spec.vocab;
  int32_t ids[40];
  prompt_ids(ids, 40, V);
  float *a = malloc(40 * (size_t)V * sizeof(float)), *b = malloc(40 * (size_t)V * sizeof(float));
  logits_by_chunk(r.model, ids, 40, 40, a);
  logits_by_chunk(mlx, ids, 40, 40, b);
  const float d = max_abs_diff(a, b, 40 * (size_t)V);
  printf("  mlx layout vs raw: max |dlogit| %.2e\n", d);
  assert_true(d < 1e-5f);
  free(a);
  free(b);
  ci_model_free(mlx);
  rm_dir(dir);
  close_random(&r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),      cmocka_unit_test(test_deltanet_op),
      cmocka_unit_test(test_random_bf16), cmocka_unit_test(test_random_q4),
      cmocka_unit_test(test_mlx_layout),  cmocka_unit_test(test_kv_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
