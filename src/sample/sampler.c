/* The sampler: processors, log-softmax and the docs/generation.md §4.3 chain over a candidate list
 * (see sampler.h).
 *
 * Candidates are kept as 64-bit rank keys — an order-preserving encoding of lp in the high
 * half (descending) and the token id in the low half — so "higher lp first, ties to the lower
 * id" is plain integer order. Filters shrink the list without a full sort: top-k and the min-p
 * keep-guard use a partial selection, and top-p histograms the mass by lp and sorts only the
 * bucket its cut falls in. Without filters no list is built at all. */
#include "sample/sampler.h"

#include "base/error.h"
#include "sample/greedy.h"
#include "sample/logprobs.h"
#include "sample/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum {
  SELECT_HEAP_MAX = 1024, /* partial selection by heap up to this k, quickselect above */
  TOP_P_PREFIX = 256,     /* top-p first tries a nucleus among this many best */
  TOP_P_BUCKETS = 4096,   /* top-p histogram: buckets of TOP_P_RANGE / TOP_P_BUCKETS nats */
  TOP_P_RANGE = 64,
  GUMBEL_BOUNDS = 256 /* Gumbel bounds by the top byte of the Philox word */
};

struct ci_sampler {
  ci_sampler_params params; /* pointer fields point at bias / exempt below */
  ci_logit_bias *bias;      /* owned copy, [params.n_logit_bias] */
  int32_t *exempt;          /* owned copy, [params.n_xtc_exempt] */
  int vocab;
  ci_rng rng;
  uint64_t next_index; /* output index s of the next ci_sampler_next */
  float *lp;           /* [vocab] log_softmax of the processed logits of the last call */
  uint64_t *cand;      /* [vocab] rank keys of the surviving tokens */
  int32_t *counts;     /* [vocab] zeroed scratch for the penalty windows */
  double *top_p_mass;  /* [TOP_P_BUCKETS] top-p histogram */
  double gumbel_bound[GUMBEL_BOUNDS];
};

static void gumbel_bounds_init(double *bound);

/* ==== Parameters ==== */

void ci_sampler_params_default(ci_sampler_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 0.7f;
  p->top_p = 1.0f;
  p->top_k = 0;
  p->min_p = 0.0f;
  p->min_tokens_to_keep = 1;
  p->xtc_probability = 0.0f;
  p->xtc_threshold = 0.1f;
  p->penalties = (ci_penalties){1.0f, 20, 0.0f, 20, 0.0f, 20};
}

/* Range checks of §4.1 as a table: field name, value, inclusive bounds. */
typedef struct {
  const char *name;
  float value;
  float min, max;
} float_range;

int ci_sampler_params_validate(const ci_sampler_params *p, int vocab) {
  const float_range ranges[] = {
      {"temperature", p->temperature, 0.0f, 5.0f},
      {"top_p", p->top_p, 0.0f, 1.0f},
      {"min_p", p->min_p, 0.0f, 1.0f},
      {"xtc_probability", p->xtc_probability, 0.0f, 1.0f},
      {"xtc_threshold", p->xtc_threshold, 0.0f, 0.5f},
      {"presence_penalty", p->penalties.presence, -2.0f, 2.0f},
      {"frequency_penalty", p->penalties.frequency, -2.0f, 2.0f},
  };
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
    if (!(ranges[i].value >= ranges[i].min && ranges[i].value <= ranges[i].max))
      return ci_fail("%s must be in [%g, %g]", ranges[i].name, (double)ranges[i].min,
                     (double)ranges[i].max);
  if (!(p->penalties.repetition > 0.0f) || !isfinite(p->penalties.repetition))
    return ci_fail("repetition_penalty must be a positive number");
  if (p->top_k < 0) return ci_fail("top_k must be an integer >= 0");
  if (p->min_tokens_to_keep < 1) return ci_fail("min_tokens_to_keep must be an integer >= 1");
  if (p->penalties.repetition_context < 0) return ci_fail("repetition_context_size must be >= 0");
  if (p->penalties.presence_context < 0) return ci_fail("presence_context_size must be >= 0");
  if (p->penalties.frequency_context < 0) return ci_fail("frequency_context_size must be >= 0");
  if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
    return ci_fail("logit_bias: bad entry count");
  for (int i = 0; i < p->n_logit_bias; i++) {
    const ci_logit_bias *b = &p->logit_bias[i];
    int bias_ok = (b->bias >= -100.0f && b->bias <= 100.0f) || b->bias == -INFINITY;
    if (b->id < 0 || b->id >= vocab || !bias_ok)
      return ci_fail("logit_bias must map token ids (< vocab size %d) to numbers in [-100, 100] "
                     "(entry %d: id %d, bias %g)",
                     vocab, i, (int)b->id, (double)b->bias);
  }
  if (p->n_xtc_exempt < 0 || (p->n_xtc_exempt > 0 && !p->xtc_exempt))
    return ci_fail("xtc exempt ids: bad entry count");
  return CI_OK;
}

/* ==== Creation ==== */

ci_sampler *ci_sampler_create(const ci_sampler_params *params, int vocab) {
  if (vocab < 1) {
    ci_fail("sampler: vocabulary size %d must be >= 1", vocab);
    return NULL;
  }
  if (ci_sampler_params_validate(params, vocab)) return NULL;
  ci_sampler *s = calloc(1, sizeof *s);
  if (!s) {
    ci_fail("out of memory");
    return NULL;
  }
  s->params = *params;
  s->vocab = vocab;
  s->lp = calloc((size_t)vocab, sizeof *s->lp);
  s->cand = malloc((size_t)vocab * sizeof *s->cand);
  s->counts = calloc((size_t)vocab, sizeof *s->counts);
  s->top_p_mass = malloc(TOP_P_BUCKETS * sizeof *s->top_p_mass);
  s->bias = malloc(((size_t)params->n_logit_bias + 1) * sizeof *s->bias);
  s->exempt = malloc(((size_t)params->n_xtc_exempt + 1) * sizeof *s->exempt);
  if (!s->lp || !s->cand || !s->counts || !s->top_p_mass || !s->bias || !s->exempt) {
    ci_sampler_free(s);
    ci_fail("out of memory for a sampler over %d tokens", vocab);
    return NULL;
  }
  if (params->n_logit_bias)
    memcpy(s->bias, params->logit_bias, (size_t)params->n_logit_bias * sizeof *s->bias);
  if (params->n_xtc_exempt)
    memcpy(s->exempt, params->xtc_exempt, (size_t)params->n_xtc_exempt * sizeof *s->exempt);
  gumbel_bounds_init(s->gumbel_bound);
  s->params.logit_bias = s->bias;
  s->params.xtc_exempt = s->exempt;
  if (params->has_seed) {
    ci_rng_init(&s->rng, params->seed);
  } else if (ci_rng_init_os(&s->rng)) {
    ci_sampler_free(s);
    return NULL;
  }
  s->params.seed = s->rng.seed;
  s->params.has_seed = 1;
  return s;
}

void ci_sampler_free(ci_sampler *s) {
  if (!s) return;
  free(s->lp);
  free(s->cand);
  free(s->counts);
  free(s->top_p_mass);
  free(s->bias);
  free(s->exempt);
  free(s);
}

const float *ci_sampler_logprobs(const ci_sampler *s) {
  return s->lp;
}

uint64_t ci_sampler_seed(const ci_sampler *s) {
  return s->rng.seed;
}

uint64_t ci_sampler_index(const ci_sampler *s) {
  return s->next_index;
}

const ci_sampler_params *ci_sampler_get_params(const ci_sampler *s) {
  return &s->params;
}

/* ==== Rank keys and partial selection ==== */

/* Ascending key order = descending lp, then ascending id. lp is never NaN here and -0 is
 * folded into +0 so that equal values tie on the id. */
static uint64_t rank_key(float lp, int32_t id) {
  uint32_t bits;
  if (lp == 0.0f) lp = 0.0f;
  memcpy(&bits, &lp, sizeof bits);
  uint32_t ascending = bits & 0x80000000u ? ~bits : bits | 0x80000000u;
  return (uint64_t)(~ascending) << 32 | (uint32_t)id;
}

static int32_t key_id(uint64_t key) {
  return (int32_t)(uint32_t)key;
}

static int compare_keys(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static void swap_keys(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}

/* Max-heap on keys (the worst kept token at the root). */
static void sift_down(uint64_t *heap, size_t n, size_t i) {
  for (;;) {
    size_t largest = i, l = 2 * i + 1, r = l + 1;
    if (l < n && heap[l] > heap[largest]) largest = l;
    if (r < n && heap[r] > heap[largest]) largest = r;
    if (largest == i) return;
    swap_keys(&heap[i], &heap[largest]);
    i = largest;
  }
}

/* Small k: a k-entry heap in a[0..k) absorbs the rest in one pass, with almost every key
 * rejected by one comparison against the root. */
static void select_best_heap(uint64_t *a, size_t n, size_t k) {
  for (size_t i = k / 2; i-- > 0;) sift_down(a, k, i);
  for (size_t i = k; i < n; i++) {
    if (a[i] >= a[0]) continue;
    swap_keys(&a[0], &a[i]); /* keeps a[0..n) a permutation */
    sift_down(a, k, 0);
  }
}

/* Large k: quickselect with a median-of-three pivot; sorts if it degenerates. */
static void select_best_quick(uint64_t *a, size_t n, size_t k) {
  size_t lo = 0, hi = n - 1;
  int budget = 64;
  while (hi > lo) {
    if (budget-- == 0) {
      qsort(a + lo, hi - lo + 1, sizeof *a, compare_keys);
      return;
    }
    size_t mid = lo + (hi - lo) / 2;
    if (a[mid] < a[lo]) swap_keys(&a[mid], &a[lo]);
    if (a[hi] < a[lo]) swap_keys(&a[hi], &a[lo]);
    if (a[hi] < a[mid]) swap_keys(&a[hi], &a[mid]);
    swap_keys(&a[mid], &a[hi]); /* median as pivot at hi */
    const uint64_t pivot = a[hi];
    size_t store = lo;
    for (size_t i = lo; i < hi; i++)
      if (a[i] < pivot) swap_keys(&a[i], &a[store++]);
    swap_keys(&a[store], &a[hi]);
    if (store == k || store + 1 == k) return;
    if (store > k)
      hi = store - 1;
    else
      lo = store + 1;
  }
}

/* Permutes a[0..n) so that a[0..k) hold the k smallest keys (the k best tokens), in no
 * particular order (0 < k < n). */
static void select_best(uint64_t *a, size_t n, size_t k) {
  if (k <= SELECT_HEAP_MAX)
    select_best_heap(a, n, k);
  else
    select_best_quick(a, n, k);
}

/* ==== The chain (§4.3) ==== */

/* The candidate list of one step. */
typedef struct {
  uint64_t *keys;
  size_t n;
  int sorted; /* keys[0..n) in rank order */
} candidates;

/* Position of the best candidate. */
static size_t best_position(const candidates *c) {
  if (c->sorted) return 0;
  size_t best = 0;
  for (size_t i = 1; i < c->n; i++)
    if (c->keys[i] < c->keys[best]) best = i;
  return best;
}

/* Bucket of lp in the top-p histogram: TOP_P_BUCKETS equal slices of TOP_P_RANGE nats below
 * the best lp, the last one also holding everything further down. Monotone in lp. */
static size_t top_p_bucket(float lp, float lp_max) {
  const float slice = (lp_max - lp) * (float)(TOP_P_BUCKETS / TOP_P_RANGE);
  return slice < (float)(TOP_P_BUCKETS - 1) ? (size_t)slice : TOP_P_BUCKETS - 1;
}

/* top-p when the nucleus lies within the TOP_P_PREFIX best (the usual case for a trained
 * model): select and sort those, walk their mass. Returns 0, leaving c a permutation of its
 * input, when their mass stays below p. */
static int filter_top_p_prefix(candidates *c, const float *lp, float top_p) {
  const size_t k = c->n < TOP_P_PREFIX ? c->n : TOP_P_PREFIX;
  if (k < c->n) select_best(c->keys, c->n, k);
  qsort(c->keys, k, sizeof *c->keys, compare_keys);
  double mass = 0.0;
  for (size_t r = 0; r < k; r++) {
    if (r > 0 && mass >= (double)top_p) {
      c->n = r;
      c->sorted = 1;
      return 1;
    }
    mass += exp((double)lp[key_id(c->keys[r])]);
  }
  if (k < c->n) return 0;
  c->sorted = 1; /* every candidate is inside the nucleus */
  return 1;
}

/* top-p: keep rank r iff the mass of ranks < r is < p. Masses are exp(lp) in double (libm, so
 * the cut does not depend on a fast approximation), summed in double.
 * A large nucleus is found in O(n): a histogram of the mass over lp buckets locates the one
 * bucket the cut falls in, and only that bucket is sorted and walked. */
static void filter_top_p(candidates *c, const float *lp, float top_p, double *mass) {
  if (filter_top_p_prefix(c, lp, top_p)) return;
  const float lp_max = lp[key_id(c->keys[best_position(c)])];
  for (size_t b = 0; b < TOP_P_BUCKETS; b++) mass[b] = 0.0;
  for (size_t i = 0; i < c->n; i++) {
    const float v = lp[key_id(c->keys[i])];
    mass[top_p_bucket(v, lp_max)] += exp((double)v);
  }
  double before = 0.0; /* mass of the buckets above the cut bucket */
  size_t cut = 0;
  while (cut < TOP_P_BUCKETS && before + mass[cut] < (double)top_p) before += mass[cut++];
  if (cut == TOP_P_BUCKETS) return; /* the whole mass is below p: everything stays */
  /* Move buckets < cut to the front, then the cut bucket after them; drop the rest. */
  size_t above = 0, kept = 0;
  for (size_t i = 0; i < c->n; i++) {
    const size_t b = top_p_bucket(lp[key_id(c->keys[i])], lp_max);
    if (b <= cut) c->keys[kept++] = c->keys[i];
  }
  for (size_t i = 0; i < kept; i++)
    if (top_p_bucket(lp[key_id(c->keys[i])], lp_max) < cut)
      swap_keys(&c->keys[i], &c->keys[above++]);
  qsort(c->keys + above, kept - above, sizeof *c->keys, compare_keys);
  size_t r = above;
  while (r < kept && (r == 0 || before < (double)top_p))
    before += exp((double)lp[key_id(c->keys[r++])]);
  c->n = r;
  c->sorted = above == 0;
}

/* min-p: drop t with lp_t < max(lp) + ln(min_p), except the min_keep best. */
static void filter_min_p(candidates *c, const float *lp, float min_p, int min_tokens_to_keep) {
  const float threshold = lp[key_id(c->keys[best_position(c)])] + logf(min_p);
  const size_t min_keep = (size_t)min_tokens_to_keep < c->n ? (size_t)min_tokens_to_keep : c->n;
  size_t survivors = 0;
  for (size_t i = 0; i < c->n; i++) survivors += !(lp[key_id(c->keys[i])] < threshold);
  if (survivors < min_keep) {
    /* The survivors are a rank prefix, so the protected set is just the min_keep best. */
    if (!c->sorted && min_keep < c->n) select_best(c->keys, c->n, min_keep);
    c->n = min_keep;
    return;
  }
  size_t kept = 0;
  for (size_t i = 0; i < c->n; i++)
    if (!(lp[key_id(c->keys[i])] < threshold)) c->keys[kept++] = c->keys[i];
  c->n = kept;
}

static int is_exempt(const ci_sampler_params *p, int32_t id) {
  for (int i = 0; i < p->n_xtc_exempt; i++)
    if (p->xtc_exempt[i] == id) return 1;
  return 0;
}

/* XTC: with probability xtc_probability, drop every non-exempt candidate whose renormalised
 * probability exceeds the threshold except the least likely of those, when there are >= 2. */
static void filter_xtc(candidates *c, const float *lp, const ci_sampler_params *p, uint64_t key) {
  if (ci_rng_uniform(key, CI_RNG_STREAM_XTC, 0) > (double)p->xtc_probability) return;
  const double max = lp[key_id(c->keys[best_position(c)])];
  double sum = 0.0;
  for (size_t i = 0; i < c->n; i++) sum += exp(lp[key_id(c->keys[i])] - max);
  size_t above = 0;
  double least = INFINITY;
  for (size_t i = 0; i < c->n; i++) {
    double prob = exp(lp[key_id(c->keys[i])] - max) / sum;
    if (prob > (double)p->xtc_threshold) {
      above++;
      if (prob < least) least = prob;
    }
  }
  if (above < 2) return;
  size_t kept = 0;
  for (size_t i = 0; i < c->n; i++) {
    int32_t id = key_id(c->keys[i]);
    if (exp(lp[id] - max) / sum > least && !is_exempt(p, id)) continue;
    c->keys[kept++] = c->keys[i];
  }
  c->n = kept;
}

/* top-k: keep the k best (partial selection unless already sorted). */
static void filter_top_k(candidates *c, int top_k) {
  if (top_k <= 0 || (size_t)top_k >= c->n) return;
  if (!c->sorted) select_best(c->keys, c->n, (size_t)top_k);
  c->n = (size_t)top_k;
}

/* ==== The draw ==== */

/* Gumbel-max: argmax over surviving t of lp_t / T + G_t, G_t = -ln(-ln u_t), u_t =
 * uniform(K_s, 0, t), in double; ties to the lower id. G grows with u, so two exact bounds
 * skip most of the work: G_t <= bound[255] (u <= 1 - 2^-25) rules a token out before its
 * Philox word is computed, and G_t <= bound[w0 >> 24] before its logarithms are. Words are
 * computed CI_RNG_BATCH tokens at a time; the order of evaluation cannot change the argmax. */
typedef struct {
  const float *lp;
  double inv_temperature;
  uint64_t key;
  const double *bound;
  int32_t best;
  double best_score;
  uint32_t pending[CI_RNG_BATCH]; /* tokens waiting for their Philox words */
  int n_pending;
} gumbel_race;

static double gumbel_score(const gumbel_race *g, int32_t t, uint32_t w0) {
  return (double)g->lp[t] * g->inv_temperature - log(-log(ci_rng_word_to_uniform(w0)));
}

static void gumbel_flush(gumbel_race *g) {
  uint32_t w0[CI_RNG_BATCH];
  for (int j = g->n_pending; j < CI_RNG_BATCH; j++) g->pending[j] = 0;
  ci_rng_words_batch(g->key, CI_RNG_STREAM_DRAW, g->pending, w0);
  for (int j = 0; j < g->n_pending; j++) {
    const int32_t t = (int32_t)g->pending[j];
    if ((double)g->lp[t] * g->inv_temperature + g->bound[w0[j] >> 24] < g->best_score) continue;
    const double score = gumbel_score(g, t, w0[j]);
    if (score > g->best_score || (score == g->best_score && t < g->best)) {
      g->best = t;
      g->best_score = score;
    }
  }
  g->n_pending = 0;
}

static void gumbel_enter(gumbel_race *g, int32_t t) {
  const double base = (double)g->lp[t] * g->inv_temperature;
  if (base + g->bound[GUMBEL_BOUNDS - 1] < g->best_score || t == g->best) return;
  g->pending[g->n_pending++] = (uint32_t)t;
  if (g->n_pending == CI_RNG_BATCH) gumbel_flush(g);
}

/* The winner, after the last candidate entered. */
static int32_t gumbel_finish(gumbel_race *g) {
  if (g->n_pending) gumbel_flush(g);
  return g->best;
}

/* Starts the race with the most likely token (the strongest early bound). */
static void gumbel_start(gumbel_race *g, int32_t first) {
  g->best = first;
  g->best_score = gumbel_score(g, first, ci_rng_word(g->key, CI_RNG_STREAM_DRAW, (uint64_t)first));
}

/* Upper bounds of G over the 256 ranges of w0's top byte (padded against libm rounding). */
static void gumbel_bounds_init(double *bound) {
  for (int k = 0; k < GUMBEL_BOUNDS; k++) {
    const uint32_t w_max = (uint32_t)k << 24 | 0xFFFFFFu;
    bound[k] = -log(-log(ci_rng_word_to_uniform(w_max))) + 1e-9;
  }
}

/* ==== Sampling ==== */

/* §4.2: processors in order (the grammar mask, processor 5, belongs to its caller), then
 * lp = log_softmax(z) into s->lp. */
static int process(ci_sampler *s, float *logits, const int32_t *history, size_t n_history) {
  const ci_sampler_params *p = &s->params;
  ci_logits_apply_bias(logits, s->vocab, p->logit_bias, p->n_logit_bias);
  ci_logits_apply_penalties(logits, s->vocab, &p->penalties, history, n_history, s->counts);
  return ci_log_softmax(logits, s->vocab, s->lp);
}

static int has_filters(const ci_sampler_params *p, int vocab) {
  return (p->top_p > 0.0f && p->top_p < 1.0f) || p->min_p > 0.0f || p->xtc_probability > 0.0f ||
         (p->top_k > 0 && p->top_k < vocab);
}

/* §4.3 steps 1-4 on s->lp: the surviving tokens as rank keys in s->cand. */
static candidates filter_chain(ci_sampler *s, uint64_t key) {
  const ci_sampler_params *p = &s->params;
  const float *lp = s->lp;
  candidates c = {s->cand, 0, 0};
  for (int32_t t = 0; t < s->vocab; t++)
    if (lp[t] > -INFINITY) c.keys[c.n++] = rank_key(lp[t], t);
  if (p->top_p > 0.0f && p->top_p < 1.0f) filter_top_p(&c, lp, p->top_p, s->top_p_mass);
  if (p->min_p > 0.0f) filter_min_p(&c, lp, p->min_p, p->min_tokens_to_keep);
  if (p->xtc_probability > 0.0f) filter_xtc(&c, lp, p, key);
  filter_top_k(&c, p->top_k);
  return c;
}

int32_t ci_sampler_sample_at(ci_sampler *s, float *logits, const int32_t *history, size_t n_history,
                             uint64_t index) {
  const ci_sampler_params *p = &s->params;
  if (process(s, logits, history, n_history)) return -1;
  const float *lp = s->lp;
  /* greedy: the processed logits' argmax (lp's could tie where rounding z - lse merges two
   * values); a device's row pick takes the same */
  if (p->temperature == 0.0f) return ci_argmax(logits, s->vocab);
  const int32_t top = ci_argmax(lp, s->vocab);

  const uint64_t key = ci_rng_key(&s->rng, index);
  gumbel_race race = {lp, 1.0 / (double)p->temperature, key, s->gumbel_bound, 0, 0.0, {0}, 0};
  if (!has_filters(p, s->vocab)) { /* every token with lp > -inf races; no list is built */
    gumbel_start(&race, top);
    for (int32_t t = 0; t < s->vocab; t++)
      if (lp[t] > -INFINITY) gumbel_enter(&race, t);
    return gumbel_finish(&race);
  }
  candidates c = filter_chain(s, key);
  if (c.n == 1) return key_id(c.keys[0]);
  gumbel_start(&race, key_id(c.keys[best_position(&c)]));
  for (size_t i = 0; i < c.n; i++) gumbel_enter(&race, key_id(c.keys[i]));
  return gumbel_finish(&race);
}

int ci_sampler_distribution(ci_sampler *s, float *logits, const int32_t *history, size_t n_history,
                            uint64_t index, int32_t *ids, float *probs) {
  if (process(s, logits, history, n_history)) return -1;
  const float *lp = s->lp;
  if (s->params.temperature == 0.0f) {
    ids[0] = ci_argmax(logits, s->vocab);
    probs[0] = 1.0f;
    return 1;
  }
  candidates c = filter_chain(s, ci_rng_key(&s->rng, index));
  const double inv_temperature = 1.0 / (double)s->params.temperature;
  const double top = lp[key_id(c.keys[best_position(&c)])];
  double sum = 0.0;
  for (size_t i = 0; i < c.n; i++)
    sum += exp(((double)lp[key_id(c.keys[i])] - top) * inv_temperature);
  for (size_t i = 0; i < c.n; i++) {
    const int32_t t = key_id(c.keys[i]);
    ids[i] = t;
    probs[i] = (float)(exp(((double)lp[t] - top) * inv_temperature) / sum);
  }
  return (int)c.n;
}

int ci_sampler_takes_row_picks(const ci_sampler *s) {
  const ci_sampler_params *p = &s->params;
  return p->temperature == 0.0f && p->n_logit_bias == 0 && p->penalties.repetition == 1.0f &&
         p->penalties.presence == 0.0f && p->penalties.frequency == 0.0f;
}

int32_t ci_sampler_next(ci_sampler *s, float *logits, const int32_t *history, size_t n_history) {
  int32_t token = ci_sampler_sample_at(s, logits, history, n_history, s->next_index);
  if (token >= 0) s->next_index++;
  return token;
}

void ci_sampler_advance(ci_sampler *s, uint64_t n) {
  s->next_index += n;
}
