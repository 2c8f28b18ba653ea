/* cinfer request extensions (docs/server.md "Extensions"), shared by every generation route: `kv`
 * (the request's own KV codec plan, docs/kv-cache.md §7, mapped onto the engine job's
 * kv_plan/kv_target/kv_start), `ignore_eos`, `stop_token_ids` (added to the job's EOS set, so they
 * finish with "stop"), `continue_final_message`, and the speculative decoding options
 * `num_draft` / `speculative` (the request's drafts per round; 0 or false: no speculation). */
#include "server/server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An optional integer member of kv in [lo, hi]; *out keeps its default when absent. */
static int kv_int(const json_t *kv, const char *key, long long lo, long long hi, long long *out,
                  int *has, char **err) {
  const json_t *v = json_object_get(kv, key);
  if (has) *has = 0;
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
    return ci_srv_fail(err, "kv.%s must be an integer between %lld and %lld", key, lo, hi);
  *out = json_integer_value(v);
  if (has) *has = 1;
  return 0;
}

/* kv.bits: an integer (K and V), [K, V], or "K,V". */
static int kv_bits(const json_t *kv, long long *k, long long *v, int *has, char **err) {
  const json_t *bits = json_object_get(kv, "bits");
  *has = 0;
  if (!bits || json_is_null(bits)) return 0;
  const char *msg = "kv.bits must be an integer, [key_bits, value_bits] or \"K,V\"";
  if (json_is_integer(bits)) {
    *k = *v = json_integer_value(bits);
  } else if (json_is_array(bits) && json_array_size(bits) == 2 &&
             json_is_integer(json_array_get(bits, 0)) && json_is_integer(json_array_get(bits, 1))) {
    *k = json_integer_value(json_array_get(bits, 0));
    *v = json_integer_value(json_array_get(bits, 1));
  } else if (json_is_string(bits)) {
    int kk, vv, used = 0;
    if (sscanf(json_string_value(bits), "%d,%d%n", &kk, &vv, &used) != 2 ||
        json_string_value(bits)[used])
      return ci_srv_fail(err, "%s", msg);
    *k = kk;
    *v = vv;
  } else {
    return ci_srv_fail(err, "%s", msg);
  }
  *has = 1;
  return 0;
}

/* The request's `kv` object (docs/server.md "Extensions", docs/kv-cache.md §7) onto job->kv_*. */
static int parse_kv(ci_server *s, const json_t *kv, ci_srv_job *job, char **err) {
  if (!kv || json_is_null(kv)) return 0;
  if (!json_is_object(kv))
    return ci_srv_fail(err, "kv must be an object {codec, bits, group_size, start, protect}");
  static const char *const known[] = {"codec",      "bits",  "value_bits",
                                      "group_size", "start", "protect"};
  const char *key;
  const json_t *member;
  json_object_foreach((json_t *)kv, key, member) {
    int ok = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= !strcmp(key, known[i]);
    if (!ok)
      return ci_srv_fail(err,
                         "kv.%.64s is not a known field (codec, bits, value_bits, group_size, "
                         "start, protect)",
                         key);
  }
  const cinfer_params *server = s->o.defaults;
  int server_quantized = 0;
  cinfer_params_kv_codec(server, NULL, 0, &server_quantized);
  long long k_bits = 0, v_bits = 0, value_bits = 0, group = 0, start = 0;
  long long protect = server->kv_protect;
  int has_bits, has_value_bits, has_group, has_start, has_protect;
  if (kv_bits(kv, &k_bits, &v_bits, &has_bits, err) ||
      kv_int(kv, "value_bits", 2, 8, &value_bits, &has_value_bits, err) ||
      kv_int(kv, "group_size", 1, 1024, &group, &has_group, err) ||
      kv_int(kv, "start", 0, 1LL << 40, &start, &has_start, err) ||
      kv_int(kv, "protect", 0, 1 << 20, &protect, &has_protect, err))
    return -1;
  if (protect > server->kv_protect) {
    job->err_code = "unsupported";
    return ci_srv_fail(err,
                       "kv.protect %lld exceeds the server's --kv-protect %d (protected layers get "
                       "blocks of their own when the server starts)",
                       protect, server->kv_protect);
  }
  cinfer_params *p = &job->params;
  p->kv_protect = (int)protect;
  if (has_value_bits) v_bits = value_bits;
  const json_t *codec_v = json_object_get(kv, "codec");
  if (codec_v && !json_is_null(codec_v) && !json_is_string(codec_v))
    return ci_srv_fail(err, "kv.codec must be one of bf16, affine, turbo, turbo-v, config");
  const char *codec = json_string_value(codec_v);
  if (!codec) {
    if (has_bits || has_group) {
      codec = "affine"; /* bits without a codec: affine (mlx-lm's meaning, as --kv-bits) */
    } else if (server_quantized) {
      p->kv_start = has_start ? start : server->kv_start; /* the server's codec from that start */
      return 0;
    } else {
      return ci_srv_fail(err, "kv.codec is required (the server has no quantized KV plan to start "
                              "later)");
    }
  }
  p->kv_start = start;
  const int plain = !strcmp(codec, "bf16") || !strcmp(codec, "config");
  if (plain && (has_bits || has_value_bits || has_group || has_start || has_protect))
    return ci_srv_fail(
        err, "kv.bits, kv.group_size, kv.start and kv.protect do not apply to kv.codec %s", codec);
  if (!strcmp(codec, "bf16")) {
    /* no plan: the engine's base format (bf16, or the server's plain --kv-codec) */
    p->kv_codec = server->kv_codec && !server_quantized ? server->kv_codec : "bf16";
    return 0;
  }
  if (!strcmp(codec, "config")) {
    p->kv_codec = NULL; /* the model folder's kv_config.json */
    return 0;
  }
  if (!strcmp(codec, "f32")) {
    job->err_code = "unsupported";
    return ci_srv_fail(err, "kv.codec f32 is a server-wide setting (cinfer serve --kv-codec f32)");
  }
  /* quantized codecs. Defaults (docs/server.md "Extensions"): affine 8 bits, turbo 4, turbo-v keys
     8 and values 4; an integer kv.bits sets keys and values alike, as --kv-bits does */
  const int is_affine = !strcmp(codec, "affine"), is_turbo = !strcmp(codec, "turbo");
  const int is_turbo_v = !strcmp(codec, "turbo-v");
  if (!is_affine && !is_turbo && !is_turbo_v)
    return ci_srv_fail(
        err, "kv.codec must be one of bf16, affine, turbo, turbo-v, config (got \"%.32s\")", codec);
  if (!has_bits) {
    k_bits = is_affine ? 8 : is_turbo ? 4 : 8;
    if (!has_value_bits) v_bits = is_affine ? 8 : 4;
  }
  if (is_affine) {
    if (k_bits != 4 && k_bits != 8) return ci_srv_fail(err, "kv.bits must be 4 or 8 for affine KV");
    if (v_bits != k_bits)
      return ci_srv_fail(err, "kv.bits: affine KV stores keys and values with the same bits");
    if (!has_group) group = 64;
    if (group != 32 && group != 64 && group != 128)
      return ci_srv_fail(err, "kv.group_size must be 32, 64 or 128");
  } else if (is_turbo) {
    if (k_bits < 2 || k_bits > 4 || v_bits < 2 || v_bits > 4)
      return ci_srv_fail(err, "kv.bits must be 2, 3 or 4 (keys and values) for turbo KV");
  } else {
    if (k_bits != 4 && k_bits != 8)
      return ci_srv_fail(err, "kv.bits: turbo-v keys take 4 or 8 bits");
    if (v_bits < 2 || v_bits > 4)
      return ci_srv_fail(err,
                         "kv.bits: turbo-v values take 2, 3 or 4 bits (e.g. \"bits\": [8, 3])");
  }
  if (has_group && strcmp(codec, "affine"))
    return ci_srv_fail(err, "kv.group_size applies to affine KV only");
  p->kv_codec = is_affine ? "affine" : is_turbo ? "turbo" : "turbo-v";
  p->kv_bits = (int)k_bits;
  p->kv_value_bits = (int)v_bits;
  p->kv_group_size = (int)group;
  if (cinfer_params_kv_codec(p, NULL, 0, NULL) != CINFER_OK)
    return ci_srv_fail(err, "kv: %s", cinfer_last_error());
  return 0; /* whether every cache layer can store it is checked when the request is submitted */
}

int ci_srv_parse_extensions(ci_server *s, const json_t *body, ci_srv_job *job, char **err) {
  const json_t *ignore_eos = json_object_get(body, "ignore_eos");
  if (ignore_eos && !json_is_null(ignore_eos) && !json_is_boolean(ignore_eos))
    return ci_srv_fail(err, "ignore_eos must be a boolean");
  if (ignore_eos && !json_is_null(ignore_eos)) job->params.ignore_eos = json_is_true(ignore_eos);
  const json_t *stop_ids = json_object_get(body, "stop_token_ids");
  if (stop_ids && !json_is_null(stop_ids)) {
    const char *msg = "stop_token_ids must be an array of token ids (< vocab size)";
    if (!json_is_array(stop_ids)) return ci_srv_fail(err, "%s", msg);
    size_t i;
    const json_t *v;
    json_array_foreach(stop_ids, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->o.vocab)
        return ci_srv_fail(err, "%s", msg);
      const int32_t id = (int32_t)json_integer_value(v);
      int seen = 0;
      for (int k = 0; k < job->n_stop_ids; k++) seen |= job->stop_ids[k] == id;
      if (seen) continue;
      if (job->n_stop_ids == CI_SRV_MAX_STOP_IDS / 2) /* room for the chat format's own */
        return ci_srv_fail(err, "stop_token_ids: at most %d distinct ids", CI_SRV_MAX_STOP_IDS / 2);
      job->stop_ids[job->n_stop_ids++] = id;
    }
  }
  const json_t *cont = json_object_get(body, "continue_final_message");
  if (cont && !json_is_null(cont) && !json_is_boolean(cont))
    return ci_srv_fail(err, "continue_final_message must be a boolean");
  job->continue_final = json_is_true(cont);
  /* speculative: false | true | {"num_draft": N}; num_draft: N (0 = off); absent = the server's */
  const json_t *spec = json_object_get(body, "speculative");
  const json_t *num_draft = json_object_get(body, "num_draft");
  if (spec && !json_is_null(spec)) {
    if (json_is_false(spec)) {
      job->params.num_draft = -1;
    } else if (json_is_object(spec)) {
      const char *key;
      const json_t *v;
      json_object_foreach((json_t *)spec, key, v) {
        if (strcmp(key, "num_draft") != 0)
          return ci_srv_fail(err, "speculative: unknown field \"%s\" (known: num_draft)", key);
      }
      if (json_object_get(spec, "num_draft")) num_draft = json_object_get(spec, "num_draft");
    } else if (!json_is_true(spec)) {
      return ci_srv_fail(err, "speculative must be a boolean or an object {\"num_draft\": N}");
    }
  }
  if (num_draft && !json_is_null(num_draft)) {
    if (!json_is_integer(num_draft) || json_integer_value(num_draft) < 0 ||
        json_integer_value(num_draft) > 64)
      return ci_srv_fail(err, "num_draft must be an integer between 0 and 64");
    const int n = (int)json_integer_value(num_draft);
    job->params.num_draft = n == 0 ? -1 : n;
  }
  if (ci_srv_parse_structured(s, body, job, err) || ci_srv_parse_adapter(s, body, job, err))
    return -1;
  return parse_kv(s, json_object_get(body, "kv"), job, err);
}
