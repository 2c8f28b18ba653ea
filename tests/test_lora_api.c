/* LoRA adapters through the public C API: a session with an adapter generates what the engine
 * generates for the same request, also with requests of another adapter and of none running in
 * the same batch; the prefix cache keys on the adapter (a request with adapter Y after one with X
 * on the same prompt reuses nothing, one with X again reuses its blocks); an adapter freed by its
 * caller lives on in the requests that use it; an adapter of another model and a broken one are
 * rejected with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend/cpu/cpu_backend.h"
#include "cinfer.h"
#include "lora_files.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLAMA CI_FIXTURE_DIR "/llama"
enum { PROMPT = 40, GEN = 8, ALL = (1u << CI_LORA_N_TARGETS) - 1 };

typedef struct {
  char root[64];
  char x[128], y[128], other[128];
} dirs;

/* Writes adapters X and Y for the llama fixture and one for mistral (wider heads) into a temporary
 * folder. */
static void write_adapters(dirs *d) {
  strcpy(d->root, "/tmp/cinfer-lora-api-XXXXXX");
  assert_non_null(mkdtemp(d->root));
  snprintf(d->x, sizeof d->x, "%s/x", d->root);
  snprintf(d->y, sizeof d->y, "%s/y", d->root);
  snprintf(d->other, sizeof d->other, "%s/other", d->root);
  assert_int_equal(mkdir(d->x, 0755), 0);
  assert_int_equal(mkdir(d->y, 0755), 0);
  assert_int_equal(mkdir(d->other, 0755), 0);
  ci_backend *be = ci_cpu_backend_create(1);
  ci_model *m = ci_model_load(LLAMA, be);
  ci_model *q = ci_model_load(CI_FIXTURE_DIR "/mistral", be);
  assert_non_null(m);
  assert_non_null(q);
  const test_lora_spec sx = {.rank = 4, .alpha = 8.0f, .peft = 1, .targets = ALL, .seed = 11};
  const test_lora_spec sy = {.rank = 8, .alpha = 8.0f, .peft = 0, .targets = ALL, .seed = 12};
  assert_int_equal(test_lora_write(d->x, m, &sx), 0);
  assert_int_equal(test_lora_write(d->y, m, &sy), 0);
  assert_int_equal(test_lora_write(d->other, q, &sx), 0);
  ci_model_free(q);
  ci_model_free(m);
  be->ops->destroy(be);
}

static void remove_adapters(dirs *d) {
  const char *sub[] = {d->x, d->y, d->other};
  const char *files[] = {"adapter_config.json", "adapter_model.safetensors",
                         "adapters.safetensors"};
  for (int i = 0; i < 3; i++) {
    char p[256];
    for (int f = 0; f < 3; f++) {
      snprintf(p, sizeof p, "%s/%s", sub[i], files[f]);
      unlink(p);
    }
    rmdir(sub[i]);
  }
  rmdir(d->root);
}

static void greedy_params(cinfer_params *p, cinfer_model *model, const cinfer_adapter *a) {
  cinfer_params_init(p, model);
  p->temperature = 0.0f;
  p->max_tokens = GEN;
  p->max_tokens_explicit = 1;
  p->ignore_eos = 1;
  p->adapter = a;
}

/* Greedy tokens of a session with adapter a (NULL: none). */
static void session_tokens(cinfer_model *model, const cinfer_adapter *a, const int32_t *prompt,
                           int32_t *out) {
  cinfer_params p;
  greedy_params(&p, model, a);
  cinfer_session *s;
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_OK);
  assert_int_equal(cinfer_session_feed(s, prompt, PROMPT, NULL, 0), CINFER_OK);
  for (int i = 0; i < GEN; i++) assert_int_equal(cinfer_session_step(s, &out[i]), CINFER_OK);
  cinfer_session_free(s);
}

/* Reads a request to its end: its tokens into out, the DONE event's cached tokens returned. */
static int drain(cinfer_request *r, int32_t *out) {
  cinfer_event ev;
  int n = 0;
  for (;;) {
    assert_int_equal(cinfer_request_next(r, &ev, 60.0), CINFER_OK);
    if (ev.kind == CINFER_EVENT_ERROR) fail_msg("request failed: %s", ev.message);
    if (ev.kind == CINFER_EVENT_DONE) break;
    assert_true(n < GEN);
    out[n++] = ev.token;
  }
  assert_int_equal(n, GEN);
  cinfer_request_free(r);
  return ev.cached_tokens;
}

static void test_sessions_engine_and_prefix_cache(void **state) {
  (void)state;
  dirs d;
  write_adapters(&d);
  cinfer_model *model;
  assert_int_equal(cinfer_model_load(LLAMA, NULL, &model), CINFER_OK);
  cinfer_adapter *x, *y;
  assert_int_equal(cinfer_adapter_load(model, d.x, &x), CINFER_OK);
  assert_int_equal(cinfer_adapter_load(model, d.y, &y), CINFER_OK);
  cinfer_adapter_info info;
  assert_int_equal(cinfer_adapter_get_info(y, &info), CINFER_OK);
  assert_string_equal(info.format, "mlx-lm");
  assert_int_equal(info.max_rank, 8);
  assert_int_equal(info.n_modules, 14);
  /* a broken folder and another model's adapter */
  cinfer_adapter *bad = NULL;
  assert_int_equal(cinfer_adapter_load(model, d.root, &bad), CINFER_INVALID_ARGUMENT);
  assert_null(bad);
  assert_non_null(strstr(cinfer_last_error(), "adapter_config.json"));
  assert_int_equal(cinfer_adapter_load(model, d.other, &bad), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "but the model's layer is"));

  int32_t prompt[PROMPT];
  for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 13 + 5) % 256);
  int32_t want_none[GEN], want_x[GEN], want_y[GEN], got[GEN];
  session_tokens(model, NULL, prompt, want_none);
  session_tokens(model, x, prompt, want_x);
  session_tokens(model, y, prompt, want_y);
  assert_memory_not_equal(want_none, want_x, sizeof want_x);
  assert_memory_not_equal(want_x, want_y, sizeof want_x);

  cinfer_engine_options eo;
  cinfer_engine_options_init(&eo);
  eo.context_size = 256;
  cinfer_engine *engine;
  assert_int_equal(cinfer_engine_create(model, &eo, &engine), CINFER_OK);
  cinfer_params p;
  /* X first, alone: nothing cached yet */
  cinfer_request *r[3];
  greedy_params(&p, model, x);
  assert_int_equal(cinfer_engine_submit(engine, prompt, PROMPT, &p, &r[0]), CINFER_OK);
  assert_int_equal(drain(r[0], got), 0);
  assert_memory_equal(got, want_x, sizeof got);
  /* Y on the same prompt must not reuse X's blocks; none neither; X again does */
  greedy_params(&p, model, y);
  assert_int_equal(cinfer_engine_submit(engine, prompt, PROMPT, &p, &r[0]), CINFER_OK);
  assert_int_equal(drain(r[0], got), 0);
  assert_memory_equal(got, want_y, sizeof got);
  greedy_params(&p, model, NULL);
  assert_int_equal(cinfer_engine_submit(engine, prompt, PROMPT, &p, &r[0]), CINFER_OK);
  assert_int_equal(drain(r[0], got), 0);
  assert_memory_equal(got, want_none, sizeof got);
  greedy_params(&p, model, x);
  assert_int_equal(cinfer_engine_submit(engine, prompt, PROMPT, &p, &r[0]), CINFER_OK);
  assert_true(drain(r[0], got) >= 32);
  assert_memory_equal(got, want_x, sizeof got);
  /* three at once (X, none, Y) on a fresh prompt; the caller frees X and Y right after
   * submitting: the requests keep them alive */
  for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((i * 7 + 100) % 256);
  session_tokens(model, NULL, prompt, want_none);
  session_tokens(model, x, prompt, want_x);
  session_tokens(model, y, prompt, want_y);
  const cinfer_adapter *which[3] = {x, NULL, y};
  for (int i = 0; i < 3; i++) {
    greedy_params(&p, model, which[i]);
    assert_int_equal(cinfer_engine_submit(engine, prompt, PROMPT, &p, &r[i]), CINFER_OK);
  }
  cinfer_adapter_free(x);
  cinfer_adapter_free(y);
  int32_t *wants[3] = {want_x, want_none, want_y};
  for (int i = 0; i < 3; i++) {
    drain(r[i], got);
    assert_memory_equal(got, wants[i], sizeof got);
  }
  cinfer_engine_free(engine);
  /* an adapter of another model handle is refused by sessions and the engine */
  cinfer_model *model2;
  assert_int_equal(cinfer_model_load(LLAMA, NULL, &model2), CINFER_OK);
  cinfer_adapter *x2;
  assert_int_equal(cinfer_adapter_load(model2, d.x, &x2), CINFER_OK);
  greedy_params(&p, model, x2);
  cinfer_session *s = NULL;
  assert_int_equal(cinfer_session_create(model, &p, &s), CINFER_INVALID_ARGUMENT);
  assert_non_null(strstr(cinfer_last_error(), "another model"));
  cinfer_adapter_free(x2);
  cinfer_model_free(model2);
  cinfer_model_free(model);
  remove_adapters(&d);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_sessions_engine_and_prefix_cache)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
