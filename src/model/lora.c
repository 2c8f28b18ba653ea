/* LoRA adapter loading (see lora.h): adapter_config.json in either format, the weight file read
 * and parsed, every tensor mapped to (layer, target) and checked against the model, A and B kept
 * as f32 matmul weights in backend memory. */
#include "model/lora.h"

#include "base/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const target_paths[CI_LORA_N_TARGETS] = {
    [CI_LORA_Q] = "self_attn.q_proj", [CI_LORA_K] = "self_attn.k_proj",
    [CI_LORA_V] = "self_attn.v_proj", [CI_LORA_O] = "self_attn.o_proj",
    [CI_LORA_GATE] = "mlp.gate_proj", [CI_LORA_UP] = "mlp.up_proj",
    [CI_LORA_DOWN] = "mlp.down_proj"};

const char *ci_lora_target_path(ci_lora_target target) {
  return target >= 0 && target < CI_LORA_N_TARGETS ? target_paths[target] : "?";
}

/* What adapter_config.json says. */
typedef struct {
  int peft;         /* 1: PEFT, 0: mlx-lm */
  int rank;         /* r / lora_parameters.rank */
  double alpha;     /* PEFT lora_alpha */
  int rslora;       /* PEFT use_rslora */
  int rank_pattern; /* PEFT rank_pattern is non-empty: ranks come from the tensors */
  double scale;     /* mlx-lm lora_parameters.scale */
  json_t *targets;  /* borrowed: a list of module names (PEFT target_modules, mlx-lm keys) */
} adapter_config;

static int is_empty_json(const json_t *v) {
  return !v || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0) ||
         (json_is_array(v) && json_array_size(v) == 0) ||
         (json_is_string(v) && !*json_string_value(v));
}

static int read_rank(json_t *v, const char *key, int *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > CI_LORA_MAX_RANK)
    return ci_fail("adapter_config.json: %s must be an integer in 1..%d", key, CI_LORA_MAX_RANK);
  *out = (int)json_integer_value(v);
  return CI_OK;
}

static int read_peft_config(json_t *cfg, adapter_config *c) {
  c->peft = 1;
  json_t *type = json_object_get(cfg, "peft_type");
  if (type && !(json_is_string(type) && strcmp(json_string_value(type), "LORA") == 0))
    return ci_fail("adapter_config.json: peft_type %s is not LORA (only LoRA adapters are "
                   "supported)",
                   json_is_string(type) ? json_string_value(type) : "(not a string)");
  if (read_rank(json_object_get(cfg, "r"), "r", &c->rank)) return CI_ERR;
  json_t *alpha = json_object_get(cfg, "lora_alpha");
  if (!alpha)
    c->alpha = 8.0; /* PEFT's default */
  else if (!json_is_number(alpha) || !isfinite(json_number_value(alpha)))
    return ci_fail("adapter_config.json: lora_alpha must be a number");
  else
    c->alpha = json_number_value(alpha);
  json_t *rs = json_object_get(cfg, "use_rslora");
  if (rs && !json_is_boolean(rs) && !json_is_null(rs))
    return ci_fail("adapter_config.json: use_rslora must be true or false");
  c->rslora = json_is_true(rs);
  if (json_is_true(json_object_get(cfg, "use_dora")))
    return ci_fail("adapter_config.json: use_dora is true (DoRA adapters are not supported)");
  if (json_is_true(json_object_get(cfg, "fan_in_fan_out")))
    return ci_fail("adapter_config.json: fan_in_fan_out is true (Conv1D layers are not "
                   "supported)");
  json_t *bias = json_object_get(cfg, "bias");
  if (bias && !json_is_null(bias) &&
      !(json_is_string(bias) && strcmp(json_string_value(bias), "none") == 0))
    return ci_fail("adapter_config.json: bias must be \"none\" (trained biases are not "
                   "supported)");
  if (json_is_true(json_object_get(cfg, "lora_bias")))
    return ci_fail("adapter_config.json: lora_bias is true (LoRA B biases are not supported)");
  if (!is_empty_json(json_object_get(cfg, "modules_to_save")))
    return ci_fail("adapter_config.json: modules_to_save is set (adapters that replace whole "
                   "modules are not supported)");
  if (!is_empty_json(json_object_get(cfg, "alpha_pattern")))
    return ci_fail("adapter_config.json: alpha_pattern is set (per-module alphas are not "
                   "supported)");
  c->rank_pattern = !is_empty_json(json_object_get(cfg, "rank_pattern"));
  json_t *t = json_object_get(cfg, "target_modules");
  c->targets = json_is_array(t) ? t : NULL;
  return CI_OK;
}

static int read_mlx_config(json_t *cfg, json_t *lp, adapter_config *c) {
  c->peft = 0;
  json_t *type = json_object_get(cfg, "fine_tune_type");
  if (type && !(json_is_string(type) && strcmp(json_string_value(type), "lora") == 0))
    return ci_fail("adapter_config.json: fine_tune_type %s is not lora (DoRA and full "
                   "fine-tunes are not adapters cinfer applies)",
                   json_is_string(type) ? json_string_value(type) : "(not a string)");
  if (!json_is_object(lp)) return ci_fail("adapter_config.json: lora_parameters is not an object");
  if (read_rank(json_object_get(lp, "rank"), "lora_parameters.rank", &c->rank)) return CI_ERR;
  json_t *scale = json_object_get(lp, "scale");
  if (!json_is_number(scale) || !isfinite(json_number_value(scale)))
    return ci_fail("adapter_config.json: lora_parameters.scale must be a number");
  c->scale = json_number_value(scale);
  json_t *keys = json_object_get(lp, "keys");
  c->targets = json_is_array(keys) ? keys : NULL;
  return CI_OK;
}

/* Reads DIR/adapter_config.json into c; *cfg_out keeps the JSON alive (c->targets borrows it). */
static int read_config(const char *dir, adapter_config *c, json_t **cfg_out) {
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  json_error_t err;
  json_t *cfg = json_load_file(path, 0, &err);
  if (!cfg) {
    if (ci_fail_if_unopenable(path)) return CI_ERR;
    return ci_fail("%s: invalid JSON at line %d: %s", path, err.line, err.text);
  }
  *cfg_out = cfg;
  if (!json_is_object(cfg)) return ci_fail("%s is not a JSON object", path);
  json_t *lp = json_object_get(cfg, "lora_parameters");
  if (lp) return read_mlx_config(cfg, lp, c) ? ci_fail_context("adapter %s", dir) : CI_OK;
  if (json_object_get(cfg, "peft_type") || json_object_get(cfg, "r"))
    return read_peft_config(cfg, c) ? ci_fail_context("adapter %s", dir) : CI_OK;
  return ci_fail("%s: neither a PEFT config (peft_type, r, lora_alpha) nor an mlx-lm config "
                 "(lora_parameters)",
                 path);
}

/* Reads a whole regular file of at most CI_LORA_MAX_FILE_BYTES. */
static uint8_t *read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ci_fail("cannot open %s: %s", path, strerror(errno)), NULL;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return ci_fail("%s is not a regular file", path), NULL;
  }
  if ((int64_t)st.st_size > CI_LORA_MAX_FILE_BYTES) {
    close(fd);
    return ci_fail("%s is %lld bytes, over the adapter limit of %lld", path, (long long)st.st_size,
                   (long long)CI_LORA_MAX_FILE_BYTES),
           NULL;
  }
  uint8_t *buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
  if (!buf) {
    close(fd);
    return ci_fail("out of memory reading %s", path), NULL;
  }
  size_t done = 0;
  while (done < (size_t)st.st_size) {
    ssize_t r = read(fd, buf + done, (size_t)st.st_size - done);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      free(buf);
      close(fd);
      return ci_fail("cannot read %s: %s", path, r < 0 ? strerror(errno) : "file shrank"), NULL;
    }
    done += (size_t)r;
  }
  close(fd);
  *len = done;
  return buf;
}

/* Splits an adapter tensor name into (layer, target, part): part 0 = A, 1 = B. Returns CI_OK, or
 * CI_ERR naming the tensor and what is wrong with it. */
static int parse_name(const char *name, int peft, int n_layers, int *layer, ci_lora_target *target,
                      int *part) {
  const char *rest = name;
  if (peft) {
    if (strncmp(rest, "base_model.model.", 17) != 0)
      return ci_fail("adapter tensor %s: a PEFT tensor name starts with base_model.model.", name);
    rest += 17;
  }
  static const char *const prefixes[] = {"model.layers.", "model.language_model.layers.",
                                         "language_model.model.layers."};
  size_t skip = 0;
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !skip; i++)
    if (strncmp(rest, prefixes[i], strlen(prefixes[i])) == 0) skip = strlen(prefixes[i]);
  if (!skip)
    return ci_fail("adapter tensor %s: not in a decoder layer (cinfer adapts the linear layers "
                   "of self_attn and mlp only)",
                   name);
  rest += skip;
  char *end;
  errno = 0;
  long li = strtol(rest, &end, 10);
  if (end == rest || *end != '.' || errno || li < 0)
    return ci_fail("adapter tensor %s: no layer number", name);
  if (li >= n_layers)
    return ci_fail("adapter tensor %s: layer %ld, but the model has %d layers", name, li, n_layers);
  rest = end + 1;
  static const char *const suffixes[2][2] = {{".lora_a", ".lora_b"},
                                             {".lora_A.weight", ".lora_B.weight"}};
  size_t len = strlen(rest);
  *part = -1;
  for (int p = 0; p < 2; p++) {
    size_t n = strlen(suffixes[peft][p]);
    if (len > n && strcmp(rest + len - n, suffixes[peft][p]) == 0) {
      *part = p;
      len -= n;
    }
  }
  if (*part < 0)
    return ci_fail("adapter tensor %s: not a LoRA %s tensor (expected a name ending in %s or "
                   "%s)",
                   name, peft ? "A/B" : "a/b", suffixes[peft][0], suffixes[peft][1]);
  for (int t = 0; t < CI_LORA_N_TARGETS; t++)
    if (strlen(target_paths[t]) == len && strncmp(rest, target_paths[t], len) == 0) {
      *layer = (int)li;
      *target = (ci_lora_target)t;
      return CI_OK;
    }
  return ci_fail("adapter tensor %s: module %.*s is not a linear layer cinfer adapts (q_proj, "
                 "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)",
                 name, (int)len, rest);
}

/* The model's weight of (layer, target), or NULL when the model does not run it. */
static const ci_tensor *model_weight(const ci_model *m, int li, ci_lora_target t) {
  const ci_layer_weights *L = &m->layers[li];
  const int owner = m->spec.layers[li].cache_layer == li;
  const ci_tensor *w = NULL;
  switch (t) {
  case CI_LORA_Q:
    w = &L->wq;
    break;
  case CI_LORA_K:
    w = owner ? &L->wk : NULL;
    break;
  case CI_LORA_V:
    w = owner && !m->spec.layers[li].k_eq_v ? &L->wv : NULL;
    break;
  case CI_LORA_O:
    w = &L->wo;
    break;
  case CI_LORA_GATE:
    w = &L->w_gate;
    break;
  case CI_LORA_UP:
    w = &L->w_up;
    break;
  case CI_LORA_DOWN:
    w = &L->w_down;
    break;
  default:
    break;
  }
  return w && w->data ? w : NULL;
}

/* Whether the config's module list (NULL = no list) names the target (by its last component, as
 * PEFT's target_modules, or by its path inside the layer, as mlx-lm's keys). */
static int listed(const json_t *targets, ci_lora_target t) {
  if (!targets) return 1;
  const char *path = target_paths[t];
  const char *last = strchr(path, '.') + 1;
  size_t i;
  json_t *v;
  json_array_foreach(targets, i, v) {
    if (!json_is_string(v)) continue;
    const char *s = json_string_value(v);
    if (strcmp(s, path) == 0 || strcmp(s, last) == 0) return 1;
    size_t n = strlen(s), k = strlen(path);
    if (n > k && strcmp(s + n - k, path) == 0 && s[n - k - 1] == '.') return 1;
  }
  return 0;
}

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
  const uint8_t *p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

/* Fills the adapter's modules from the parsed tensors. */
/* The whole layer's [out, in] of target t in layer li, whose weight w a split model holds a share
 * of (model/tensor_parallel.h: rows of q, k, v, gate, up; columns of o and down). */
static void whole_shape(const ci_model *m, int li, ci_lora_target t, const ci_tensor *w,
                        int64_t *out, int64_t *in) {
  const int world = ci_model_tensor_parallel(m);
  *out = w->shape[0];
  *in = w->shape[1];
  if (world == 1) return;
  if (t == CI_LORA_K || t == CI_LORA_V) {
    const int heads = m->spec.layers[li].n_kv_heads;
    *out = *out / ci_tp_kv_heads_here(heads, world) * heads;
  } else if (t == CI_LORA_O || t == CI_LORA_DOWN) {
    *in *= world;
  } else {
    *out *= world;
  }
}

/* Rank r's share of a module whose whole A [rank, in] is fa and B [out, rank] fb: B's rows of the
 * rank's outputs, or A's columns of its inputs (an owned copy) for o and down. */
static int rank_share(ci_lora *lora, const ci_model *m, int li, ci_lora_target t, int r,
                      const float *fa, const float *fb, int64_t rank, int64_t in, int64_t out,
                      ci_lora_module *share) {
  const int world = ci_model_tensor_parallel(m);
  share->a = (ci_tensor){.dtype = CI_F32, .ndim = 2, .shape = {rank, in}, .data = fa};
  share->b = (ci_tensor){.dtype = CI_F32, .ndim = 2, .shape = {out, rank}, .data = fb};
  if (world == 1) return CI_OK;
  if (t == CI_LORA_O || t == CI_LORA_DOWN) {
    const int64_t width = in / world, first = width * r;
    float *copy = malloc((size_t)(rank * width) * sizeof *copy);
    float **owned = realloc(lora->owned, (size_t)(lora->n_owned + 1) * sizeof *owned);
    if (!copy || !owned) {
      free(copy);
      if (owned) lora->owned = owned;
      return ci_fail("out of memory");
    }
    lora->owned = owned;
    lora->owned[lora->n_owned++] = copy;
    for (int64_t k = 0; k < rank; k++)
      memcpy(copy + k * width, fa + k * in + first, (size_t)width * sizeof *copy);
    share->a.shape[1] = width;
    share->a.data = copy;
    return CI_OK;
  }
  int64_t first, count;
  if (t == CI_LORA_K || t == CI_LORA_V) {
    const int heads = m->spec.layers[li].n_kv_heads;
    const int64_t dim = out / heads;
    first = (int64_t)(r * heads / world) * dim;
    count = (int64_t)ci_tp_kv_heads_here(heads, world) * dim;
  } else {
    first = out * r / world;
    count = out * (r + 1) / world - first;
  }
  share->b.shape[0] = count;
  share->b.data = fb + first * rank;
  return CI_OK;
}

static int bind_tensors(ci_lora *lora, const ci_model *m, const adapter_config *c,
                        const ci_st_tensor *ts, int n, const char *file) {
  const ci_st_tensor **parts =
      calloc((size_t)lora->n_layers * CI_LORA_N_TARGETS * 2, sizeof *parts);
  if (!parts) return ci_fail("out of memory");
  int status = CI_OK;
  int64_t floats = 0;
  for (int i = 0; i < n && status == CI_OK; i++) {
    int li = 0, part = 0;
    ci_lora_target t = CI_LORA_Q;
    if (parse_name(ts[i].name, c->peft, lora->n_layers, &li, &t, &part)) {
      status = ci_fail_context("%s", file);
      break;
    }
    const ci_tensor *w = model_weight(m, li, t);
    if (!w) {
      status = ci_fail("%s: adapter tensor %s: layer %d of this model has no %s it runs", file,
                       ts[i].name, li, target_paths[t]);
      break;
    }
    if (!listed(c->targets, t)) {
      status = ci_fail("%s: adapter tensor %s: %s is not among the modules adapter_config.json "
                       "lists",
                       file, ts[i].name, target_paths[t]);
      break;
    }
    if (ts[i].dtype != CI_F32 && ts[i].dtype != CI_F16 && ts[i].dtype != CI_BF16) {
      status = ci_fail("%s: adapter tensor %s: dtype %s is not a float type", file, ts[i].name,
                       ci_dtype_get(ts[i].dtype)->name);
      break;
    }
    if (ts[i].ndim != 2 || ts[i].shape[0] < 1 || ts[i].shape[1] < 1) {
      status = ci_fail("%s: adapter tensor %s is not a 2-D matrix", file, ts[i].name);
      break;
    }
    parts[((int64_t)li * CI_LORA_N_TARGETS + t) * 2 + part] = &ts[i];
    floats += ts[i].shape[0] * ts[i].shape[1];
  }
  if (status == CI_OK && floats == 0) status = ci_fail("%s holds no LoRA tensors", file);
  if (status == CI_OK && !(lora->data = malloc((size_t)floats * sizeof(float))))
    status = ci_fail("out of memory for the adapter (%lld values)", (long long)floats);
  float *next = lora->data;
  uint64_t key = 1469598103934665603ULL;
  for (int64_t k = 0; status == CI_OK && k < (int64_t)lora->n_layers * CI_LORA_N_TARGETS; k++) {
    const ci_st_tensor *a = parts[2 * k], *b = parts[2 * k + 1];
    if (!a && !b) continue;
    const int li = (int)(k / CI_LORA_N_TARGETS);
    const ci_lora_target t = (ci_lora_target)(k % CI_LORA_N_TARGETS);
    if (!a || !b) {
      status = ci_fail("%s: layer %d %s has LoRA %s but no %s", file, li, target_paths[t],
                       a ? "A" : "B", a ? "B" : "A");
      break;
    }
    const ci_tensor *w = model_weight(m, li, t);
    int64_t out, in;
    whole_shape(m, li, t, w, &out, &in);
    /* PEFT: A [r, in], B [out, r]; mlx-lm: a [in, r], b [r, out] */
    const int64_t rank = c->peft ? a->shape[0] : a->shape[1];
    const int64_t a_in = c->peft ? a->shape[1] : a->shape[0];
    const int64_t b_out = c->peft ? b->shape[0] : b->shape[1];
    const int64_t b_rank = c->peft ? b->shape[1] : b->shape[0];
    if (a_in != in || b_out != out || b_rank != rank) {
      status = ci_fail("%s: layer %d %s: A is [%lld, %lld] and B [%lld, %lld], but the model's "
                       "layer is [%lld out, %lld in] (%s layout: %s)",
                       file, li, target_paths[t], (long long)a->shape[0], (long long)a->shape[1],
                       (long long)b->shape[0], (long long)b->shape[1], (long long)out,
                       (long long)in, c->peft ? "PEFT" : "mlx-lm",
                       c->peft ? "A [r, in], B [out, r]" : "lora_a [in, r], lora_b [r, out]");
      break;
    }
    if (rank > CI_LORA_MAX_RANK || rank > (in < out ? in : out)) {
      status =
          ci_fail("%s: layer %d %s: rank %lld is more than the layer's smaller side (%lld)", file,
                  li, target_paths[t], (long long)rank, (long long)(in < out ? in : out));
      break;
    }
    if (!c->rank_pattern && rank != c->rank) {
      status = ci_fail("%s: layer %d %s: rank %lld, but adapter_config.json says %d", file, li,
                       target_paths[t], (long long)rank, c->rank);
      break;
    }
    ci_lora_module *mod = &lora->modules[k];
    mod->rank = (int)rank;
    mod->scale = c->peft ? (float)(c->alpha / (c->rslora ? sqrt((double)rank) : (double)rank))
                         : (float)c->scale;
    /* A as [rank, in] and B as [out, rank], whatever the file's layout */
    float *fa = next, *fb = next + rank * in;
    next += rank * (in + out);
    for (int64_t r = 0; r < rank; r++)
      for (int64_t i = 0; i < in; i++)
        fa[r * in + i] =
            ci_float_at(a->dtype, a->data, (size_t)(c->peft ? r * in + i : i * rank + r));
    for (int64_t o = 0; o < out; o++)
      for (int64_t r = 0; r < rank; r++)
        fb[o * rank + r] =
            ci_float_at(b->dtype, b->data, (size_t)(c->peft ? o * rank + r : r * out + o));
    for (int64_t i = 0; i < rank * (in + out); i++)
      if (!isfinite(fa[i])) {
        status = ci_fail("%s: layer %d %s holds a non-finite value", file, li, target_paths[t]);
        break;
      }
    if (status) break;
    /* each rank's share (the whole module for a whole model), in its backend's memory */
    for (int r = 0; r < ci_model_tensor_parallel(m) && status == CI_OK; r++) {
      ci_lora_module *share = r == 0 ? mod : &lora->rank_modules[r][k];
      share->rank = mod->rank;
      share->scale = mod->scale;
      ci_backend *be = ci_tp_rank_backend(m, r);
      if (rank_share(lora, m, li, t, r, fa, fb, rank, in, out, share) ||
          be->ops->prepare_weight(be, &share->a) || be->ops->prepare_weight(be, &share->b))
        status = ci_fail_context("adapter layer %d %s", li, target_paths[t]);
    }
    if (status) break;
    lora->n_modules++;
    lora->n_params += rank * (in + out);
    if (rank > lora->max_rank) lora->max_rank = (int)rank;
    if (in > lora->max_width) lora->max_width = in;
    if (out > lora->max_width) lora->max_width = out;
    const int64_t id[2] = {k, rank};
    key = fnv(key, id, sizeof id);
    key = fnv(key, &mod->scale, sizeof mod->scale);
    key = fnv(key, fa, (size_t)(rank * (in + out)) * sizeof(float));
  }
  lora->key = key;
  free(parts);
  return status;
}

ci_lora *ci_lora_load(const char *dir, const ci_model *model) {
  if (!dir || !*dir) return ci_fail("adapter: no folder given"), NULL;
  struct stat st;
  if (stat(dir, &st) != 0) return ci_fail("adapter %s: %s", dir, strerror(errno)), NULL;
  if (!S_ISDIR(st.st_mode)) return ci_fail("adapter %s is not a folder", dir), NULL;
  adapter_config c = {0};
  json_t *cfg = NULL;
  ci_lora *lora = calloc(1, sizeof *lora);
  uint8_t *buf = NULL;
  ci_st_tensor *ts = NULL;
  int n = 0;
  char file[4096];
  if (!lora) {
    ci_fail("out of memory");
    goto fail;
  }
  atomic_init(&lora->refs, 1);
  lora->model = model;
  if (read_config(dir, &c, &cfg)) goto fail;
  lora->format = c.peft ? "peft" : "mlx-lm";
  lora->scale = c.peft ? (float)(c.alpha / (c.rslora ? sqrt((double)c.rank) : (double)c.rank))
                       : (float)c.scale;
  lora->n_layers = model->spec.n_layers;
  lora->modules = calloc((size_t)lora->n_layers * CI_LORA_N_TARGETS, sizeof *lora->modules);
  if (!lora->modules) {
    ci_fail("out of memory");
    goto fail;
  }
  for (int r = 1; r < ci_model_tensor_parallel(model); r++)
    if (!(lora->rank_modules[r] =
              calloc((size_t)lora->n_layers * CI_LORA_N_TARGETS, sizeof *lora->rank_modules[r]))) {
      ci_fail("out of memory");
      goto fail;
    }
  snprintf(file, sizeof file, "%s/%s", dir,
           c.peft ? "adapter_model.safetensors" : "adapters.safetensors");
  size_t len = 0;
  if (!(buf = read_file(file, &len))) goto fail;
  if (ci_st_parse(buf, len, file, 0, &ts, &n)) goto fail;
  size_t end = 0;
  for (int i = 0; i < n; i++)
    if (ts[i].offset + ts[i].nbytes > end) end = ts[i].offset + ts[i].nbytes;
  if (n > 0 && end < len) {
    ci_fail("%s: %zu bytes after the last tensor (an oversized or damaged file)", file, len - end);
    goto fail;
  }
  if (bind_tensors(lora, model, &c, ts, n, file)) goto fail;
  free(ts);
  free(buf);
  json_decref(cfg);
  return lora;
fail:
  free(ts);
  free(buf);
  json_decref(cfg);
  ci_lora_release(lora);
  return NULL;
}

ci_lora *ci_lora_retain(ci_lora *lora) {
  if (lora) atomic_fetch_add(&lora->refs, 1);
  return lora;
}

void ci_lora_release(ci_lora *lora) {
  if (!lora || atomic_fetch_sub(&lora->refs, 1) != 1) return;
  free(lora->modules);
  for (int r = 1; r < CI_MAX_RANKS; r++) free(lora->rank_modules[r]);
  for (int i = 0; i < lora->n_owned; i++) free(lora->owned[i]);
  free(lora->owned);
  free(lora->data);
  free(lora);
}
