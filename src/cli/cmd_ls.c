/* `cinfer ls`: the models of the Hugging Face cache — repo id, revision, size on disk, weight
 * dtype or quantization, architecture and whether cinfer supports it (cinfer_cache_list). */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "usage: cinfer ls [--json]\n"
                            "  Lists the models of the Hugging Face cache ($HF_HUB_CACHE, else\n"
                            "  $HF_HOME/hub, else ~/.cache/huggingface/hub).\n"
                            "  --json   one JSON array (sizes in bytes, full commit hashes)\n";

static int print_json(const cinfer_cached_model *m, size_t n) {
  json_t *list = json_array();
  for (size_t i = 0; list && i < n; i++) {
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:b, s:s}", "model", m[i].repo_id,
                  "revision", m[i].revision, "commit", m[i].commit, "path", m[i].path, "size_bytes",
                  (json_int_t)m[i].size_bytes, "dtype", m[i].info.dtype, "architecture",
                  m[i].info.architecture, "supported", m[i].info.supported, "why", m[i].info.why);
    if (!o || json_array_append_new(list, o)) {
      json_decref(list);
      list = NULL;
    }
  }
  char *text = list ? json_dumps(list, JSON_INDENT(2)) : NULL;
  json_decref(list);
  if (!text) {
    fprintf(stderr, "cinfer ls: out of memory\n");
    return 1;
  }
  printf("%s\n", text);
  free(text);
  return 0;
}

static void print_table(const cinfer_cached_model *m, size_t n) {
  int width = (int)strlen("MODEL");
  for (size_t i = 0; i < n; i++)
    if ((int)strlen(m[i].repo_id) > width) width = (int)strlen(m[i].repo_id);
  printf("%-*s  %-8s %-10s %9s  %-10s %-14s %s\n", width, "MODEL", "REVISION", "COMMIT", "SIZE",
         "DTYPE", "ARCH", "SUPPORTED");
  for (size_t i = 0; i < n; i++) {
    char size[32];
    ci_cli_format_bytes(m[i].size_bytes, size, sizeof size);
    const cinfer_model_info *info = &m[i].info;
    printf("%-*s  %-8s %-10.10s %9s  %-10s %-14s %s%s%s\n", width, m[i].repo_id,
           m[i].revision[0] ? m[i].revision : "-", m[i].commit[0] ? m[i].commit : "-", size,
           info->dtype[0] ? info->dtype : "-", info->architecture[0] ? info->architecture : "-",
           info->supported ? "yes" : "no", info->supported ? "" : ": ", info->why);
  }
}

int ci_verb_ls(int argc, char **argv) {
  ci_flag flags[] = {{"--json", NULL, 0, NULL}, {"--help", "-h", 0, NULL}};
  const int nf = (int)(sizeof flags / sizeof flags[0]);
  const int rc = ci_args_parse(argc, argv, flags, nf, "ls");
  if (rc) return rc;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  char *hub = NULL;
  if (cinfer_hub_cache_dir(&hub) != CINFER_OK) {
    fprintf(stderr, "cinfer ls: %s\n", cinfer_last_error());
    return 1;
  }
  cinfer_cached_model *models = NULL;
  size_t n = 0;
  if (cinfer_cache_list(hub, &models, &n) != CINFER_OK) {
    fprintf(stderr, "cinfer ls: %s\n", cinfer_last_error());
    cinfer_free(hub);
    return 1;
  }
  int status = 0;
  if (ci_args_get(flags, nf, "--json"))
    status = print_json(models, n);
  else if (n == 0)
    printf("no models in the Hugging Face cache (%s); get one with `cinfer pull org/name`\n", hub);
  else
    print_table(models, n);
  cinfer_cache_list_free(models, n);
  cinfer_free(hub);
  return status;
}
