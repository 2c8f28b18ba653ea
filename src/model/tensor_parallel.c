/* Tensor parallelism inside one process (see tensor_parallel.h): which weights split how, the
 * cutting of a bound matrix into a rank's share, and the group of ranks with one host thread
 * each that runs every step on all of them. */
#include "model/tensor_parallel.h"

#include "base/error.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== Which weights split how ==== */

typedef enum {
  SPLIT_NONE, /* whole on every rank */
  SPLIT_ROWS, /* output rows: whole heads, intermediate units, vocabulary rows */
  SPLIT_COLS, /* input columns: the matrices whose products are summed over the ranks */
} split_kind;

/* The K/V projections and biases: split by KV heads, each rank taking a copy of its head where
 * ranks share one. */
static int is_kv(const ci_manifest_entry *e) {
  return e->layer >= 0 &&
         (e->field == offsetof(ci_layer_weights, wk) ||
          e->field == offsetof(ci_layer_weights, wv) ||
          e->field == offsetof(ci_layer_weights, bk) || e->field == offsetof(ci_layer_weights, bv));
}

/* Rows [*first, *first + *count) of this rank's share of a row-split entry of `rows` rows. */
static void row_share(const ci_model *m, const ci_manifest_entry *e, int64_t rows, int64_t *first,
                      int64_t *count) {
  const int rank = m->shard.rank, world = m->shard.world;
  if (is_kv(e)) {
    const int heads = m->spec.layers[e->layer].n_kv_heads;
    const int64_t dim = rows / heads;
    *first = (int64_t)(rank * heads / world) * dim;
    *count = (int64_t)ci_tp_kv_heads_here(heads, world) * dim;
    return;
  }
  *first = rows * rank / world;
  *count = rows * (rank + 1) / world - *first;
}

int ci_tp_kv_heads_here(int n_kv_heads, int world) {
  return n_kv_heads >= world ? n_kv_heads / world : 1;
}

int ci_tp_kv_heads_stored(int n_kv_heads, int world) {
  return n_kv_heads >= world ? n_kv_heads : world;
}

static split_kind split_of(const ci_manifest_entry *e) {
  if (e->layer < 0) return e->global_role == CI_GLOBAL_HEAD ? SPLIT_ROWS : SPLIT_NONE;
  static const size_t by_rows[] = {
      offsetof(ci_layer_weights, wq),     offsetof(ci_layer_weights, wk),
      offsetof(ci_layer_weights, wv),     offsetof(ci_layer_weights, w_gate),
      offsetof(ci_layer_weights, w_up),   offsetof(ci_layer_weights, bq),
      offsetof(ci_layer_weights, bk),     offsetof(ci_layer_weights, bv),
      offsetof(ci_layer_weights, b_gate), offsetof(ci_layer_weights, b_up)};
  for (size_t i = 0; i < sizeof by_rows / sizeof by_rows[0]; i++)
    if (e->field == by_rows[i]) return SPLIT_ROWS;
  if (e->field == offsetof(ci_layer_weights, wo) || e->field == offsetof(ci_layer_weights, w_down))
    return SPLIT_COLS;
  return SPLIT_NONE; /* norms, and the o/down biases (added once after the sum) */
}

int ci_tp_check_spec(const ci_model_spec *s, int world) {
  if (world < 1 || world > CI_MAX_RANKS)
    return ci_fail("tensor parallel: %d ranks (1 to %d)", world, CI_MAX_RANKS);
  if (world == 1) return CI_OK;
  const char *type = s->model_type;
  if (s->n_deltanet_layers > 0)
    return ci_fail("tensor parallel: %s models (gated DeltaNet layers) cannot be split over ranks "
                   "yet",
                   type);
  if (s->n_experts > 0)
    return ci_fail("tensor parallel: %s models with experts (MoE) cannot be split over ranks yet",
                   type);
  if (s->ple_dim > 0)
    return ci_fail("tensor parallel: %s models with per-layer inputs cannot be split over ranks "
                   "yet",
                   type);
  if (s->attn_output_gate)
    return ci_fail("tensor parallel: %s models with gated attention output cannot be split over "
                   "ranks yet",
                   type);
  if (s->n_heads % world != 0)
    return ci_fail("tensor parallel: %d query heads do not split evenly over %d ranks", s->n_heads,
                   world);
  if (s->vocab < world)
    return ci_fail("tensor parallel: a vocabulary of %d cannot be split over %d ranks", s->vocab,
                   world);
  for (int i = 0; i < s->n_layers; i++) {
    const ci_layer_spec *l = &s->layers[i];
    if (l->n_kv_heads % world != 0 && world % l->n_kv_heads != 0)
      return ci_fail("tensor parallel: layer %d's %d KV heads can neither be split evenly over "
                     "%d ranks nor shared evenly by them",
                     i, l->n_kv_heads, world);
    if (l->intermediate % world != 0)
      return ci_fail("tensor parallel: layer %d's %d MLP units do not split evenly over %d ranks",
                     i, l->intermediate, world);
  }
  return CI_OK;
}

/* ==== Cutting a rank's share ==== */

static int own(ci_tp_shard *shard, void *host) {
  if (!host) return ci_fail("out of memory");
  if (shard->n_owned == shard->owned_capacity) {
    const int capacity = shard->owned_capacity ? 2 * shard->owned_capacity : 64;
    void **grown = realloc(shard->owned, (size_t)capacity * sizeof *grown);
    if (!grown) {
      free(host);
      return ci_fail("out of memory");
    }
    shard->owned = grown;
    shard->owned_capacity = capacity;
  }
  shard->owned[shard->n_owned++] = host;
  return CI_OK;
}

void ci_tp_shard_release(ci_tp_shard *shard) {
  for (int i = 0; i < shard->n_owned; i++) free(shard->owned[i]);
  free(shard->owned);
  shard->owned = NULL;
  shard->n_owned = shard->owned_capacity = 0;
}

/* Rows [first, first + count) of a [rows, cols] matrix: a view (rows are contiguous). */
static void cut_rows(ci_tensor *t, int64_t first, int64_t count) {
  const int64_t cols = t->shape[1];
  t->data = (const char *)t->data + ci_dtype_bytes(t->dtype, (size_t)(first * cols));
  if (ci_dtype_is_affine(t->dtype)) {
    const size_t skip = ci_dtype_bytes(t->scale_dtype, (size_t)(first * (cols / t->group_size)));
    t->scales = (const char *)t->scales + skip;
    t->biases = (const char *)t->biases + skip;
  }
  t->shape[0] = count;
}

/* Copies `rows` rows of `bytes` at byte `offset` of each source row of `stride` bytes. */
static void *copy_columns(const void *src, int64_t rows, size_t stride, size_t offset,
                          size_t bytes) {
  char *dst = malloc((size_t)rows * bytes);
  if (!dst) return NULL;
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + (size_t)r * bytes, (const char *)src + (size_t)r * stride + offset, bytes);
  return dst;
}

/* Columns [first, first + count) of a [rows, cols] matrix: owned copies of its codes (and, for
 * affine formats, its scales and biases, whose groups must not straddle the cut). */
static int cut_cols(ci_tp_shard *shard, ci_tensor *t, int64_t first, int64_t count) {
  const int64_t rows = t->shape[0], cols = t->shape[1];
  if (ci_dtype_is_affine(t->dtype) && (first % t->group_size || count % t->group_size))
    return ci_fail("tensor parallel: rank %d's input columns [%lld, %lld) do not start and end on "
                   "the quantization groups of %d (try fewer ranks)",
                   shard->rank, (long long)first, (long long)(first + count), t->group_size);
  void *data = copy_columns(t->data, rows, ci_dtype_bytes(t->dtype, (size_t)cols),
                            ci_dtype_bytes(t->dtype, (size_t)first),
                            ci_dtype_bytes(t->dtype, (size_t)count));
  if (own(shard, data)) return CI_ERR;
  t->data = data;
  if (ci_dtype_is_affine(t->dtype)) {
    const size_t group = ci_dtype_bytes(t->scale_dtype, 1);
    const int64_t groups = cols / t->group_size;
    const void *parts[2] = {t->scales, t->biases};
    void *copies[2];
    for (int i = 0; i < 2; i++) {
      copies[i] = copy_columns(parts[i], rows, (size_t)groups * group,
                               (size_t)(first / t->group_size) * group,
                               (size_t)(count / t->group_size) * group);
      if (own(shard, copies[i])) return CI_ERR;
    }
    t->scales = copies[0];
    t->biases = copies[1];
  }
  t->shape[1] = count;
  return CI_OK;
}

int ci_tp_shard_matrix(ci_model *m, const ci_manifest_entry *e, ci_tensor *t) {
  const int rank = m->shard.rank, world = m->shard.world;
  if (world == 1) return CI_OK;
  switch (split_of(e)) {
  case SPLIT_NONE:
    return CI_OK;
  case SPLIT_ROWS: {
    int64_t first, count;
    row_share(m, e, t->shape[0], &first, &count);
    if (e->layer < 0) m->shard.vocab_first = first;
    cut_rows(t, first, count);
    return CI_OK;
  }
  case SPLIT_COLS: {
    const int64_t share = t->shape[1] / world;
    return cut_cols(&m->shard, t, share * rank, share);
  }
  }
  return ci_fail("tensor parallel: unknown split");
}

void ci_tp_bias_range(const ci_model *m, const ci_manifest_entry *e, int64_t *first,
                      int64_t *count) {
  *first = 0;
  *count = e->rows;
  if (m->shard.world == 1 || split_of(e) != SPLIT_ROWS) return;
  row_share(m, e, e->rows, first, count);
}

int ci_tp_tied_head(ci_model *m) {
  const int rank = m->shard.rank, world = m->shard.world;
  ci_tensor head = m->shard.embed_host;
  const int64_t first = head.shape[0] * rank / world, last = head.shape[0] * (rank + 1) / world;
  cut_rows(&head, first, last - first);
  m->shard.vocab_first = first;
  if (m->be->ops->prepare_weight(m->be, &head)) return ci_fail_context("the tied output head");
  m->head = head;
  return CI_OK;
}

/* ==== The group ==== */

typedef struct {
  struct ci_tp_group *group;
  int rank;
} rank_thread;

struct ci_tp_group {
  int world;
  ci_model *ranks[CI_MAX_RANKS];          /* [0] the driving model (not owned here) */
  ci_backend *backends[CI_MAX_RANKS];     /* [1..] owned */
  ci_workspace *workspaces[CI_MAX_RANKS]; /* [1..] owned: the other ranks' step scratch */
  ci_rank_collective *comm;               /* owned */
  rank_thread args[CI_MAX_RANKS];
  pthread_t threads[CI_MAX_RANKS];
  int n_started; /* threads 1 .. n_started running */
  pthread_mutex_t mu;
  pthread_cond_t job_ready, job_done;
  uint64_t job; /* steps posted */
  int done;     /* ranks (beside rank 0) done with the current step */
  int stop;
  /* the current step */
  const ci_step_seq *seqs;
  int n_seqs;
  ci_step_role role;
  int status[CI_MAX_RANKS];
  char errors[CI_MAX_RANKS][256];
};

static void *rank_main(void *arg) {
  const rank_thread *self = arg;
  struct ci_tp_group *g = self->group;
  const int r = self->rank;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&g->mu);
    while (g->job == seen && !g->stop) pthread_cond_wait(&g->job_ready, &g->mu);
    if (g->stop) {
      pthread_mutex_unlock(&g->mu);
      return NULL;
    }
    seen = g->job;
    pthread_mutex_unlock(&g->mu);
    const int status = ci_model_step_run(g->ranks[r], g->workspaces[r], g->seqs, g->n_seqs, NULL,
                                         NULL, NULL, &g->role);
    if (status != CI_OK) {
      snprintf(g->errors[r], sizeof g->errors[r], "%s", ci_last_error());
      ci_rank_collective_abort(g->comm);
    }
    pthread_mutex_lock(&g->mu);
    g->status[r] = status;
    g->done++;
    pthread_cond_signal(&g->job_done);
    pthread_mutex_unlock(&g->mu);
  }
}

void ci_tp_group_free(struct ci_tp_group *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  g->stop = 1;
  pthread_cond_broadcast(&g->job_ready);
  pthread_mutex_unlock(&g->mu);
  for (int r = 1; r <= g->n_started; r++) pthread_join(g->threads[r], NULL);
  for (int r = 1; r < g->world; r++) {
    ci_workspace_free(g->workspaces[r]);
    ci_model_free(g->ranks[r]);
    if (g->backends[r]) g->backends[r]->ops->destroy(g->backends[r]);
  }
  ci_rank_collective_free(g->comm);
  pthread_cond_destroy(&g->job_done);
  pthread_cond_destroy(&g->job_ready);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

ci_model *ci_model_load_tp(const char *model_dir, ci_backend *const *backends, int world,
                           ci_weights_memory memory) {
  if (world == 1) return ci_model_load_in(model_dir, backends[0], memory);
  struct ci_tp_group *g = NULL;
  if (world < 1 || world > CI_MAX_RANKS) {
    ci_fail("tensor parallel: %d ranks (1 to %d)", world, CI_MAX_RANKS);
    goto fail_backends;
  }
  for (int r = 0; r < world; r++)
    if (!backends[r]->ops->all_reduce || !backends[r]->ops->gather_cols ||
        backends[r]->ops != backends[0]->ops) {
      ci_fail("tensor parallel: rank %d's %s backend cannot hold a rank (no collectives, or "
              "another kind than rank 0's)",
              r, backends[r]->ops->name);
      goto fail_backends;
    }
  g = calloc(1, sizeof *g);
  if (!g) {
    ci_fail("out of memory");
    goto fail_backends;
  }
  g->world = world;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->job_ready, NULL);
  pthread_cond_init(&g->job_done, NULL);
  for (int r = 1; r < world; r++) g->backends[r] = backends[r];
  g->comm = ci_rank_collective_create(world);
  if (!g->comm) goto fail;
  /* every rank maps the files: the page cache holds them once */
  (void)memory;
  for (int r = 0; r < world; r++) {
    g->ranks[r] = ci_model_load_shard(model_dir, backends[r], CI_WEIGHTS_MMAP, r, world, g->comm);
    if (!g->ranks[r]) goto fail;
    if (r > 0 && !(g->workspaces[r] = ci_workspace_create(backends[r]))) goto fail;
  }
  for (int r = 1; r < world; r++) {
    g->args[r] = (rank_thread){.group = g, .rank = r};
    if (pthread_create(&g->threads[r], NULL, rank_main, &g->args[r])) {
      ci_fail("tensor parallel: cannot start the thread of rank %d", r);
      goto fail;
    }
    g->n_started = r;
  }
  ci_model *m = g->ranks[0];
  m->tp = g;
  return m;
fail : {
  ci_model *first = g->ranks[0];
  g->ranks[0] = NULL;
  ci_tp_group_free(g); /* ranks 1.., their backends */
  ci_model_free(first);
  return NULL;
}
fail_backends:
  for (int r = 1; r < world; r++) backends[r]->ops->destroy(backends[r]);
  return NULL;
}

int ci_tp_kv_cache_split(const ci_model *m, ci_kv_cache *cache) {
  ci_backend *backends[CI_MAX_RANKS];
  for (int r = 0; r < m->tp->world; r++) backends[r] = m->tp->ranks[r]->be;
  return ci_kv_cache_set_ranks(cache, backends, m->tp->world);
}

ci_backend *ci_tp_rank_backend(const ci_model *m, int rank) {
  return rank == 0 || !m->tp ? m->be : m->tp->ranks[rank]->be;
}

int ci_model_tensor_parallel(const ci_model *m) {
  return m->shard.world > 1 ? m->shard.world : 1; /* a model built without the loader: whole */
}

int ci_tp_step(ci_model *m, ci_workspace *ws, const ci_step_seq *seqs, int n_seqs, float *logits,
               ci_row_pick *picks, float *hidden) {
  struct ci_tp_group *g = m->tp;
  if (ci_model_step_admit(m, seqs, n_seqs)) return CI_ERR;
  const ci_step_role role = {
      .own_kv = 0, .want = logits || picks || hidden, .head = logits || picks};
  ci_rank_collective_reset(g->comm);
  pthread_mutex_lock(&g->mu);
  g->seqs = seqs;
  g->n_seqs = n_seqs;
  g->role = role;
  g->done = 0;
  g->job++;
  pthread_cond_broadcast(&g->job_ready);
  pthread_mutex_unlock(&g->mu);
  int status = ci_model_step_run(m, ws, seqs, n_seqs, logits, picks, hidden, &role);
  if (status != CI_OK) ci_rank_collective_abort(g->comm);
  pthread_mutex_lock(&g->mu);
  while (g->done < g->world - 1) pthread_cond_wait(&g->job_done, &g->mu);
  pthread_mutex_unlock(&g->mu);
  for (int r = 1; r < g->world; r++)
    if (g->status[r] != CI_OK) {
      /* the first rank that failed on its own, not by another's abort */
      if (strstr(g->errors[r], "another rank failed") == NULL || status == CI_OK) {
        ci_fail("%s", g->errors[r]);
        status = CI_ERR;
        break;
      }
    }
  if (status != CI_OK) return CI_ERR;
  for (int i = 0; i < n_seqs; i++)
    if (ci_kv_seq_commit(seqs[i].seq, seqs[i].n_rows)) return CI_ERR;
  return CI_OK;
}
