/* Prompt cache routes (docs/server.md "Prompt cache"): POST /v1/cache/save writes every block the
 * prefix cache holds that is not on disk yet and answers once they are written; POST
 * /v1/cache/load reads a prompt's blocks from disk into the prefix cache ahead of the requests
 * that will start with it. Neither takes a path: the engine names its files by content inside
 * --prompt-cache-dir, so a body naming a file, a path or anything else unknown is refused. These
 * are admin routes (http.c gates them: the API key whenever one is set, and off beyond loopback
 * without one). */
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(json_t **out, int status, const char *code, const char *msg) {
  *out = ci_server_error_body(0, status, code, msg);
  return status;
}

/* 400 for a field outside `allowed` (a NULL-terminated list). Returns 0 when all are known. */
static int unknown_field(const json_t *body, const char *const *allowed, json_t **out) {
  const char *key;
  json_t *value;
  json_object_foreach((json_t *)body, key, value) {
    int known = 0;
    for (int i = 0; allowed[i] && !known; i++) known = !strcmp(key, allowed[i]);
    if (known) continue;
    char msg[300];
    snprintf(msg, sizeof msg,
             "unknown field '%.80s': the prompt cache takes no file names or paths (it names its "
             "files by content inside --prompt-cache-dir)",
             key);
    return fail(out, 400, "invalid_value", msg);
  }
  return 0;
}

/* 501 when the server runs without --prompt-cache-dir. */
static int cache_off(ci_server *s, json_t **out) {
  cinfer_engine_stats st;
  cinfer_engine_get_stats(s->o.engine, &st);
  if (st.prompt_cache_on) return 0;
  return fail(out, 501, "not_implemented",
              "the prompt cache on disk is off (start the server with --prompt-cache-dir DIR)");
}

int ci_server_cache_save(ci_server *s, const json_t *body, json_t **out) {
  static const char *const allowed[] = {NULL};
  int status = unknown_field(body, allowed, out);
  if (status || (status = cache_off(s, out))) return status;
  int64_t blocks = 0;
  if (cinfer_engine_cache_save(s->o.engine, &blocks) != CINFER_OK)
    return fail(out, 503, "unavailable", cinfer_last_error());
  cinfer_engine_stats st;
  cinfer_engine_get_stats(s->o.engine, &st);
  *out = json_pack("{s:s, s:I, s:I, s:I, s:I}", "object", "prompt_cache.save", "saved_blocks",
                   (json_int_t)blocks, "blocks_written", (json_int_t)st.prompt_cache_blocks_written,
                   "bytes_written", (json_int_t)st.prompt_cache_bytes_written, "write_errors",
                   (json_int_t)st.prompt_cache_write_errors);
  return *out ? 200 : fail(out, 500, "internal_error", "out of memory");
}

/* {"prompt": "text" | [ids]} or {"messages": [...]} (rendered as /v1/chat/completions renders
 * them), optionally with the "kv" extension (the plan whose blocks to load). */
int ci_server_cache_load(ci_server *s, json_t *body, json_t **out) {
  static const char *const allowed[] = {"prompt", "messages", "kv", NULL};
  int status = unknown_field(body, allowed, out);
  if (status || (status = cache_off(s, out))) return status;
  json_t *prompt = json_object_get(body, "prompt");
  json_t *messages = json_object_get(body, "messages");
  if (!prompt == !messages)
    return fail(out, 400, "invalid_value", "give either prompt (text or token ids) or messages");
  char *err = NULL;
  ci_srv_job job;
  memset(&job, 0, sizeof job);
  if (ci_srv_parse_sampling(s, body, 0, &job, 512, &err)) {
    status = fail(out, 400, job.err_code ? job.err_code : "invalid_value", err ? err : "bad kv");
    free(err);
    ci_srv_job_free(&job);
    return status;
  }
  if (messages) {
    if (!json_is_array(messages) || json_array_size(messages) == 0) {
      ci_srv_job_free(&job);
      return fail(out, 400, "invalid_value", "messages must be a non-empty array");
    }
    if (ci_srv_tokenize_chat(s, messages, NULL, NULL, &job, &err)) {
      status = fail(out, 400, "invalid_value", err ? err : "cannot render the messages");
      free(err);
      ci_srv_job_free(&job);
      return status;
    }
  } else if (json_is_string(prompt)) {
    size_t n = 0;
    if (cinfer_tokenizer_encode(s->o.tokenizer, json_string_value(prompt),
                                json_string_length(prompt), 1, &job.prompt, &n) != CINFER_OK ||
        n == 0) {
      ci_srv_job_free(&job);
      return fail(out, 400, "invalid_value", "prompt encodes to no tokens");
    }
    job.n_prompt = (int)n;
  } else if (json_is_array(prompt) && json_array_size(prompt) > 0) {
    job.prompt = malloc(json_array_size(prompt) * sizeof *job.prompt);
    if (!job.prompt) {
      ci_srv_job_free(&job);
      return fail(out, 500, "internal_error", "out of memory");
    }
    size_t i;
    json_t *v;
    json_array_foreach(prompt, i, v) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->o.vocab) {
        ci_srv_job_free(&job);
        return fail(out, 400, "invalid_value",
                    "prompt token ids must be integers below the vocabulary size");
      }
      job.prompt[job.n_prompt++] = (int32_t)json_integer_value(v);
    }
  } else {
    ci_srv_job_free(&job);
    return fail(out, 400, "invalid_value", "prompt must be a string or a token-id array");
  }
  int64_t cached = 0, loaded = 0;
  const cinfer_status st = cinfer_engine_cache_load(s->o.engine, job.prompt, (size_t)job.n_prompt,
                                                    &job.params, &cached, &loaded);
  const int n_prompt = job.n_prompt;
  ci_srv_job_free(&job);
  if (st == CINFER_QUEUE_FULL) return fail(out, 429, "busy", cinfer_last_error());
  if (st == CINFER_INVALID_ARGUMENT) return fail(out, 400, "invalid_value", cinfer_last_error());
  if (st != CINFER_OK) return fail(out, 503, "unavailable", cinfer_last_error());
  *out = json_pack("{s:s, s:i, s:I, s:I}", "object", "prompt_cache.load", "prompt_tokens", n_prompt,
                   "cached_tokens", (json_int_t)cached, "loaded_blocks", (json_int_t)loaded);
  return *out ? 200 : fail(out, 500, "internal_error", "out of memory");
}
