/* Batched steps: the logits of every sequence in a batch are bit-identical to its solo
 * ci_model_forward logits, for sequences of different lengths and different KV codecs (bf16,
 * turbo 4-bit from the start, turbo 3-bit converting mid-way), on dense, quantized-weight,
 * sliding-window, KV-sharing and MoE fixtures: decode rows batched together
 * (ci_model_forward_decode_batch), and mixed steps (ci_model_step) where a prefill chunk of one
 * sequence — long enough for the panel kernels, and converting its KV at the chunk boundary —
 * runs beside the decode rows of three others. Every check runs in both precisions (exact and
 * fast). Steps that return greedy picks (ci_model_step_picks) give each row's host pick of the
 * same logits, with or without the rows themselves. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/row_pick.h"
#include "base/error.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_SEQ = 3, STEPS = 6 };

/* Sequence i's KV plan: bf16; turbo 4/4 from 0; turbo 3/3 from position 22 (the fixtures'
 * head_dim 16 admits no affine group). */
static void apply_plan(ci_kv_seq *seq, int i) {
  if (i == 0) return;
  ci_kv_format target;
  assert_int_equal(ci_kv_format_parse("turbo", i == 1 ? 4 : 3, 0, 0, &target), CI_OK);
  if (ci_kv_seq_set_plan(seq, &target, i == 1 ? 0 : 22)) fail_msg("%s", ci_last_error());
}

enum { MIXED_PROMPT = 160, MIXED_FIRST_CHUNK = 130 };

/* Each of n picks is the host pick of its logits row. */
static void check_picks(const char *name, const ci_row_pick *picks, const float *rows, int n,
                        int vocab) {
  for (int i = 0; i < n; i++) {
    const ci_row_pick want = ci_row_pick_of(rows + (size_t)i * vocab, vocab);
    if (picks[i].token != want.token || memcmp(&picks[i].logprob, &want.logprob, sizeof(float)))
      fail_msg("%s: row %d picks %d (%g), its logits pick %d (%g)", name, i, picks[i].token,
               (double)picks[i].logprob, want.token, (double)want.logprob);
  }
}

/* Two mixed steps: the decode rows of the three sequences beside the prefill of a fourth whose
 * prompt goes in chunks of 130 (no logits; its turbo plan converts exactly at 130) and 30 (logits
 * of its last row). Every sequence's logits must equal its solo run with the same chunking. */
static void check_mixed_steps(const char *name, ci_model *model, ci_kv_cache *cache,
                              ci_kv_seq **solo, ci_kv_seq **batch, int32_t *next) {
  const int vocab = model->spec.vocab;
  int32_t prompt[MIXED_PROMPT];
  for (int t = 0; t < MIXED_PROMPT; t++) prompt[t] = (int32_t)((t * 37 + 11) % vocab);
  ci_kv_format turbo;
  assert_int_equal(ci_kv_format_parse("turbo", 4, 0, 0, &turbo), CI_OK);
  ci_kv_seq *solo_new = ci_kv_seq_create(cache), *mixed_new = ci_kv_seq_create(cache);
  assert_int_equal(ci_kv_seq_set_plan(solo_new, &turbo, MIXED_FIRST_CHUNK), CI_OK);
  assert_int_equal(ci_kv_seq_set_plan(mixed_new, &turbo, MIXED_FIRST_CHUNK), CI_OK);
  float *solo_logits = malloc((size_t)(N_SEQ + 1) * vocab * sizeof *solo_logits);
  float *mixed_logits = malloc((size_t)(N_SEQ + 1) * vocab * sizeof *mixed_logits);
  ci_workspace *ws = ci_workspace_create(model->be);
  assert_non_null(ws);
  const int chunks[2] = {MIXED_FIRST_CHUNK, MIXED_PROMPT - MIXED_FIRST_CHUNK};
  for (int step = 0, done = 0; step < 2; done += chunks[step], step++) {
    const int last = step == 1;
    for (int i = 0; i < N_SEQ; i++)
      assert_int_equal(ci_model_forward(model, solo[i], &next[i], 1, solo_logits + i * vocab, 1),
                       CI_OK);
    assert_int_equal(ci_model_forward(model, solo_new, prompt + done, chunks[step],
                                      last ? solo_logits + N_SEQ * vocab : NULL, last),
                     CI_OK);
    /* the new sequence's chunk first: rows of a panel segment, then the decode rows */
    ci_step_seq step_seqs[N_SEQ + 1];
    step_seqs[0] = (ci_step_seq){
        .seq = mixed_new, .ids = prompt + done, .n_rows = chunks[step], .n_logit_rows = last};
    for (int i = 0; i < N_SEQ; i++)
      step_seqs[i + 1] =
          (ci_step_seq){.seq = batch[i], .ids = &next[i], .n_rows = 1, .n_logit_rows = 1};
    ci_row_pick picks[N_SEQ + 1];
    if (ci_model_step_picks(model, ws, step_seqs, N_SEQ + 1, mixed_logits, picks))
      fail_msg("%s: mixed step %d: %s", name, step, ci_last_error());
    check_picks(name, picks, mixed_logits, N_SEQ + last, vocab);
    const float *mixed_decode = mixed_logits + (last ? vocab : 0);
    for (int i = 0; i < N_SEQ; i++) {
      if (memcmp(solo_logits + (size_t)i * vocab, mixed_decode + (size_t)i * vocab,
                 (size_t)vocab * sizeof(float)))
        fail_msg("%s: mixed step %d, decoding sequence %d differs from solo", name, step, i);
      next[i] = (int32_t)((next[i] * 17 + step + 3) % vocab);
    }
    if (last &&
        memcmp(solo_logits + (size_t)N_SEQ * vocab, mixed_logits, (size_t)vocab * sizeof(float)))
      fail_msg("%s: the prefilled sequence's logits differ from its solo run", name);
    assert_int_equal(mixed_new->converted, solo_new->converted);
  }
  assert_int_equal(mixed_new->converted, 1);
  assert_int_equal(mixed_new->n, MIXED_PROMPT);
  /* a chunk crossing a pending conversion is refused */
  ci_kv_seq *pending = ci_kv_seq_create(cache);
  assert_int_equal(ci_kv_seq_set_plan(pending, &turbo, 10), CI_OK);
  const ci_step_seq crossing = {.seq = pending, .ids = prompt, .n_rows = 11};
  assert_int_equal(ci_model_step(model, ws, &crossing, 1, NULL), CI_ERR);
  ci_kv_seq_free(pending);
  ci_workspace_free(ws);
  ci_kv_seq_free(solo_new);
  ci_kv_seq_free(mixed_new);
  free(solo_logits);
  free(mixed_logits);
}

static void check_fixture_in(const char *name, ci_precision precision) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/%s", CI_FIXTURE_DIR, name);
  ci_backend *be = ci_cpu_backend_create_with(2, precision);
  assert_non_null(be);
  ci_model *model = ci_model_load(dir, be);
  if (!model) fprintf(stderr, "%s: %s\n", dir, ci_last_error());
  assert_non_null(model);
  const int vocab = model->spec.vocab;
  ci_kv_cache *cache = ci_model_kv_cache_create(model, CI_KV_BF16, 16, 0);
  assert_non_null(cache);
  ci_kv_seq *solo[N_SEQ], *batch[N_SEQ];
  int32_t next[N_SEQ];
  float *logits = malloc((size_t)vocab * sizeof *logits);
  float *solo_logits = malloc((size_t)N_SEQ * vocab * sizeof *solo_logits);
  float *batch_logits = malloc((size_t)N_SEQ * vocab * sizeof *batch_logits);
  for (int i = 0; i < N_SEQ; i++) {
    solo[i] = ci_kv_seq_create(cache);
    batch[i] = ci_kv_seq_create(cache);
    apply_plan(solo[i], i);
    apply_plan(batch[i], i);
    int32_t prompt[40];
    const int n = 9 + 5 * i; /* 9, 14, 19: the turbo 3-bit one converts while decoding */
    for (int t = 0; t < n; t++) prompt[t] = (int32_t)((t * 29 + i * 13 + 1) % vocab);
    assert_int_equal(ci_model_forward(model, solo[i], prompt, n, logits, 1), CI_OK);
    assert_int_equal(ci_model_forward(model, batch[i], prompt, n, NULL, 0), CI_OK);
    next[i] = (int32_t)((i * 7 + 3) % vocab);
  }
  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < N_SEQ; i++)
      assert_int_equal(ci_model_forward(model, solo[i], &next[i], 1, solo_logits + i * vocab, 1),
                       CI_OK);
    if (step % 2) { /* the greedy picks alone: each is the pick of the solo row */
      ci_row_pick picks[N_SEQ];
      assert_int_equal(ci_model_forward_decode_batch_picks(model, batch, next, N_SEQ, NULL, picks),
                       CI_OK);
      check_picks(name, picks, solo_logits, N_SEQ, vocab);
      memcpy(batch_logits, solo_logits, (size_t)N_SEQ * vocab * sizeof(float));
    } else {
      assert_int_equal(ci_model_forward_decode_batch(model, batch, next, N_SEQ, batch_logits),
                       CI_OK);
    }
    for (int i = 0; i < N_SEQ; i++) {
      if (memcmp(solo_logits + (size_t)i * vocab, batch_logits + (size_t)i * vocab,
                 (size_t)vocab * sizeof(float)))
        fail_msg("%s: step %d, sequence %d: batched logits differ from solo", name, step, i);
      assert_int_equal(solo[i]->n, batch[i]->n);
      assert_int_equal(solo[i]->converted, batch[i]->converted);
      next[i] = (int32_t)((next[i] * 31 + step + 5) % vocab);
    }
  }
  assert_int_equal(batch[2]->converted, 1);
  check_mixed_steps(name, model, cache, solo, batch, next);
  /* a sequence listed twice is refused */
  ci_kv_seq *twice[2] = {batch[0], batch[0]};
  assert_int_equal(ci_model_forward_decode_batch(model, twice, next, 2, batch_logits), CI_ERR);
  for (int i = 0; i < N_SEQ; i++) {
    ci_kv_seq_free(solo[i]);
    ci_kv_seq_free(batch[i]);
  }
  free(logits);
  free(solo_logits);
  free(batch_logits);
  ci_kv_cache_free(cache);
  ci_model_free(model);
  be->ops->destroy(be);
}

/* Both precisions: batch invariance holds in each. */
static void check_fixture(const char *name) {
  check_fixture_in(name, CI_PRECISION_EXACT);
  check_fixture_in(name, CI_PRECISION_FAST);
}

static void test_llama(void **state) {
  (void)state;
  check_fixture("llama");
}

static void test_qwen2_q4(void **state) {
  (void)state;
  check_fixture("qwen2-q4g64");
}

static void test_llama_q8(void **state) {
  (void)state;
  check_fixture("llama-q8g32");
}

static void test_gemma3(void **state) {
  (void)state;
  check_fixture("gemma3");
}

static void test_gemma4_ple(void **state) {
  (void)state;
  check_fixture("gemma4-ple");
}

static void test_gemma4_moe(void **state) {
  (void)state;
  check_fixture("gemma4-moe");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llama),      cmocka_unit_test(test_qwen2_q4),
      cmocka_unit_test(test_llama_q8),   cmocka_unit_test(test_gemma3),
      cmocka_unit_test(test_gemma4_ple), cmocka_unit_test(test_gemma4_moe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
