/* What the files of the public C API (include/cinfer.h) share: the model handle's contents and
 * the resolution of cinfer_params into the engine's sampling, EOS and KV-plan settings. Internal
 * to libcinfer: an embedding program never sees it. */
#ifndef CI_API_API_INTERNAL_H
#define CI_API_API_INTERNAL_H

#include "cinfer.h"
#include "engine/generate.h"
#include "engine/model_open.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"
#include "io/generation_config.h"
#include "model/lora.h"
#include "sample/sampler.h"
#include "text/chat_template.h"
#include "text/gemma_output.h"
#include "text/tokenizer.h"

#include <pthread.h>

/* The public text handles wrap the internal ones; a model's are views of its own. */
struct cinfer_tokenizer {
  ci_tokenizer *impl;
};
struct cinfer_chat_template {
  ci_chat_template *impl;
};

/* A model family's chat output conventions (cinfer_chat_format_create). */
struct cinfer_chat_format {
  const ci_tokenizer *tok; /* borrowed */
  int think_format;        /* <think> and </think> are tokens */
  int32_t think_open, think_close;
  ci_gemma_markers gemma; /* Gemma 4 marker ids (-1 where absent) */
  int gemma_channels;     /* gemma-channel reasoning */
  int gemma_calls;        /* Gemma 4 tool-call tokens */
  int xml_calls;          /* the template asks for Qwen XML calls (<function=...><parameter=...>) */
};

/* Detects the conventions (chat_template and architecture may be NULL). */
void ci_api_chat_format_detect(cinfer_chat_format *format, const ci_tokenizer *tok,
                               const ci_chat_template *chat_template, const char *architecture);

struct cinfer_model {
  ci_model *model;                         /* owned (ci_model_open: with its backend) */
  char *dir;                               /* the resolved model folder; owned */
  ci_tokenizer *tokenizer;                 /* owned; NULL when the folder has no tokenizer.json */
  ci_chat_template *chat_template;         /* owned; NULL when the model has none */
  cinfer_tokenizer tokenizer_view;         /* {tokenizer}: what cinfer_model_tokenizer returns */
  cinfer_chat_template chat_template_view; /* {chat_template} */
  cinfer_chat_format chat_format;          /* valid when tokenizer is non-NULL */
  char template_error[256];                /* why chat_template is NULL */
  ci_generation_config generation;         /* generation_config.json (has_ flags 0 when absent) */
  ci_eos_set eos; /* config.json ∪ generation_config.json ∪ tokenizer eos_token */

  int threads;           /* CPU threads the forward pass uses (n_threads, or every online CPU) */
  char device_note[320]; /* why device auto chose the CPU over a visible GPU ("" when it did not) */

  pthread_mutex_t grammar_mu;      /* guards grammar_vocab */
  ci_grammar_vocab *grammar_vocab; /* owned; built on the first grammar-constrained request */
};

/* A LoRA adapter handle: one reference to the adapter and the model it was loaded for. */
struct cinfer_adapter {
  ci_lora *lora;
  const cinfer_model *model;
};

/* cinfer_params resolved for one sequence. */
typedef struct {
  ci_sampler_params sampling;
  int max_tokens;
  ci_eos_set eos; /* empty when ignore_eos */
  ci_kv_codec kv_base;
  ci_kv_plan_source kv_plan;
  ci_kv_format kv_target;
  int64_t kv_start;
  int kv_protect;
  ci_lora *lora; /* borrowed from params->adapter; NULL without one */
} ci_api_resolved;

/* The KV fields of params resolved into the sequence's plan (no model needed). Returns CINFER_OK
 * or CINFER_INVALID_ARGUMENT with the reason. */
cinfer_status ci_api_resolve_kv(const cinfer_params *params, ci_api_resolved *out);

/* Checks params against the model and resolves them. Returns CINFER_OK or
 * CINFER_INVALID_ARGUMENT with the reason as the last error. */
cinfer_status ci_api_resolve(const cinfer_model *model, const cinfer_params *params,
                             ci_api_resolved *out);

/* The grammar of params (grammar or json_schema; *grammar NULL when neither) and the model's
 * token bytes for it (*vocab borrowed from the model; built on first use). Returns CINFER_OK,
 * `invalid` naming the problem (a bad grammar or schema, both given), or CINFER_UNSUPPORTED
 * (the model has no tokenizer). */
cinfer_status ci_api_grammar(cinfer_model *model, const cinfer_params *params,
                             cinfer_status invalid, ci_grammar **grammar, ci_grammar_vocab **vocab);

/* Records a message as the last error and returns status (for `return ci_api_fail(...)`). */
cinfer_status ci_api_fail(cinfer_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The engine behind a cinfer_engine (api_engine.c), for the other API files (api_embed.c). */
struct ci_engine;
struct ci_engine *ci_api_engine_impl(cinfer_engine *engine);

#endif
