/* cinfer command line: `cinfer <verb> [flags]`, dispatched through a verb table. */
#include "cli/hub_verbs.h"
#include "cli/verbs.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} verb;

/* In the order a newcomer needs them: run a model, chat with it, serve it, get one, list them;
 * then managing the cache, measuring, and the tools for developers. */
static const verb verbs[] = {
    {"generate", ci_verb_generate, "continue a prompt: -m MODEL -p TEXT (sampling, --chat)"},
    {"chat", ci_verb_chat, "interactive multi-turn chat through the model's chat template"},
    {"serve", ci_verb_serve, "serve the OpenAI and Anthropic HTTP APIs and a chat page"},
    {"pull", ci_verb_pull, "download a model from the Hugging Face Hub into the cache"},
    {"ls", ci_verb_ls, "list the models of the Hugging Face cache"},
    {"rm", ci_verb_rm, "delete a model from the Hugging Face cache"},
    {"cache", ci_verb_cache, "list or prune a prompt cache directory (serve --prompt-cache-dir)"},
    {"fit", ci_verb_fit, "check whether a model fits this machine's memory, per KV codec"},
    {"bench", ci_verb_bench, "measure prefill and decode tok/s"},
    {"perplexity", ci_verb_perplexity, "teacher-forced NLL and perplexity of token sequences"},
    {"kv-quality", ci_verb_kv_quality, "KL divergence and top-1 agreement of a KV codec vs bf16"},
    {"render", ci_verb_render, "print the chat-template rendering of a chat request"},
    {"tokenize", ci_verb_tokenize, "encode a text file to a JSON array of token ids"},
    {"detokenize", ci_verb_detokenize, "decode comma-separated token ids to text"},
    {"logits", ci_verb_logits, "write teacher-forced f32 logits of a token-id prompt"},
    {"init-random", ci_verb_init_random, "write a random-weight model for a config"},
};

/* The verbs that manage the cache themselves take no --model to pull. */
static int takes_pull_flag(const char *verb) {
  return strcmp(verb, "pull") && strcmp(verb, "ls") && strcmp(verb, "rm") && strcmp(verb, "fit") &&
         strcmp(verb, "cache");
}

static void print_usage(FILE *out) {
  fprintf(out, "usage: cinfer <verb> [flags]   (cinfer <verb> --help for its flags)\n\n"
               "  cinfer pull Qwen/Qwen3-0.6B\n"
               "  cinfer chat -m Qwen/Qwen3-0.6B\n\nverbs:\n");
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    fprintf(out, "  %-12s %s\n", verbs[i].name, verbs[i].summary);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    print_usage(stdout);
    return 0;
  }
  if (!strcmp(argv[1], "--version")) {
    printf("cinfer 0.1.0\n");
    return 0;
  }
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
    if (!strcmp(argv[1], verbs[i].name)) {
      int verb_argc = argc - 1;
      const int rc = takes_pull_flag(verbs[i].name)
                         ? ci_cli_model_pull_flag(&verb_argc, argv + 1, verbs[i].name)
                         : -1;
      return rc >= 0 ? rc : verbs[i].run(verb_argc, argv + 1);
    }
  fprintf(stderr, "cinfer: unknown verb '%s'\n", argv[1]);
  print_usage(stderr);
  return 2;
}
