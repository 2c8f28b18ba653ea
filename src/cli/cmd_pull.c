/* `cinfer pull org/name[@revision]`: downloads a model repo from the Hugging Face Hub into the
 * hub cache (cinfer_pull), drawing a progress bar (bytes, rate, ETA) on a terminal and plain
 * lines otherwise; prints the snapshot folder on stdout. */
#include "cinfer.h"
#include "cli/hub_verbs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: cinfer pull org/name[@revision] [--quiet]\n"
    "  Downloads the files cinfer needs (config, tokenizer, chat template, safetensors) of a\n"
    "  Hugging Face Hub model repo into the Hugging Face cache ($HF_HUB_CACHE, else\n"
    "  $HF_HOME/hub, else ~/.cache/huggingface/hub), resuming partial downloads and verifying\n"
    "  every file's hash. Prints the snapshot folder.\n"
    "  revision      a branch, tag or commit (main)\n"
    "  --quiet       no progress output\n"
    "environment: HF_TOKEN (gated and private repos), HF_ENDPOINT (another hub)\n";

typedef struct {
  int tty;   /* stderr is a terminal: redraw one line */
  int drawn; /* a progress line is on screen without its newline */
} progress_view;

static void format_seconds(double s, char *buf, size_t size) {
  if (s < 0 || s > 359999) {
    snprintf(buf, size, "--:--");
    return;
  }
  const long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    snprintf(buf, size, "%ld:%02ld", t / 60, t % 60);
}

/* "[ 2/9] NAME" with the name cut to fit. */
static void file_label(const cinfer_pull_progress *p, char *buf, size_t size) {
  snprintf(buf, size, "[%d/%d] %.40s", p->file_index + 1, p->n_files, p->file);
}

static void draw_bar(progress_view *v, const cinfer_pull_progress *p) {
  char label[64], have[32], want[32], rate[32], eta[16];
  file_label(p, label, sizeof label);
  ci_cli_format_bytes(p->file_done, have, sizeof have);
  ci_cli_format_bytes(p->file_total, want, sizeof want);
  const double bytes_per_s = p->seconds > 0 ? (double)p->downloaded / p->seconds : 0;
  ci_cli_format_bytes((int64_t)bytes_per_s, rate, sizeof rate);
  format_seconds(bytes_per_s > 0 ? (double)(p->total - p->done) / bytes_per_s : -1, eta,
                 sizeof eta);
  const double frac = p->file_total > 0 ? (double)p->file_done / (double)p->file_total : 1;
  char bar[21];
  const int filled = (int)(frac * 20);
  for (int i = 0; i < 20; i++) bar[i] = i < filled ? '=' : i == filled ? '>' : ' ';
  bar[20] = '\0';
  fprintf(stderr, "\r%-48s %3d%% [%s] %s/%s %s/s ETA %s\033[K", label, (int)(frac * 100), bar, have,
          want, rate, eta);
  fflush(stderr);
  v->drawn = 1;
}

static void end_line(progress_view *v) {
  if (v->drawn) fputc('\n', stderr);
  v->drawn = 0;
}

static int on_progress(void *user, const cinfer_pull_progress *p) {
  progress_view *v = user;
  char label[64], size[32], total[32];
  switch (p->event) {
  case CINFER_PULL_LISTED:
    ci_cli_format_bytes(p->total, total, sizeof total);
    fprintf(stderr, "pull: %s at %.12s: %d files, %s\n", p->repo_id, p->commit, p->n_files, total);
    break;
  case CINFER_PULL_FILE_CACHED:
    file_label(p, label, sizeof label);
    ci_cli_format_bytes(p->file_total, size, sizeof size);
    fprintf(stderr, "%-48s %s already in the cache\n", label, size);
    break;
  case CINFER_PULL_FILE_START:
    if (v->tty) {
      draw_bar(v, p);
    } else {
      file_label(p, label, sizeof label);
      ci_cli_format_bytes(p->file_total, size, sizeof size);
      if (p->file_done > 0) {
        char have[32];
        ci_cli_format_bytes(p->file_done, have, sizeof have);
        fprintf(stderr, "%s %s: resuming at %s\n", label, size, have);
      } else {
        fprintf(stderr, "%s %s: downloading\n", label, size);
      }
    }
    break;
  case CINFER_PULL_FILE_PROGRESS:
    if (v->tty) draw_bar(v, p);
    break;
  case CINFER_PULL_FILE_RETRY: {
    char have[32];
    end_line(v);
    ci_cli_format_bytes(p->file_done, have, sizeof have);
    fprintf(stderr, "pull: %s: transfer broke (%s); resuming at %s\n", p->file, p->message, have);
    break;
  }
  case CINFER_PULL_FILE_DONE:
    if (v->tty) {
      draw_bar(v, p);
      end_line(v);
    } else {
      file_label(p, label, sizeof label);
      ci_cli_format_bytes(p->file_total, size, sizeof size);
      fprintf(stderr, "%s %s: verified\n", label, size);
    }
    break;
  }
  return 0;
}

int ci_cli_pull(const char *repo, int quiet, char **snapshot) {
  progress_view view = {.tty = isatty(STDERR_FILENO)};
  cinfer_pull_options o;
  cinfer_pull_options_init(&o);
  if (!quiet) {
    o.progress = on_progress;
    o.user = &view;
  }
  char *dir = NULL;
  const cinfer_status st = cinfer_pull(repo, &o, &dir);
  end_line(&view);
  if (st != CINFER_OK) {
    fprintf(stderr, "cinfer pull: %s\n", cinfer_last_error());
    return st == CINFER_INVALID_ARGUMENT ? 2 : 1;
  }
  if (snapshot)
    *snapshot = dir;
  else
    cinfer_free(dir);
  return 0;
}

int ci_verb_pull(int argc, char **argv) {
  ci_flag flags[] = {{"--quiet", "-q", 0, NULL}, {"--help", "-h", 0, NULL}};
  const int nf = (int)(sizeof flags / sizeof flags[0]);
  const char *repo = NULL;
  const int rc = ci_cli_args_positional(argc, argv, flags, nf, "pull", &repo);
  if (rc) return rc;
  if (ci_args_get(flags, nf, "--help")) {
    fputs(usage, stdout);
    return 0;
  }
  if (!repo) {
    fprintf(stderr, "cinfer pull: which model? (cinfer pull org/name)\n%s", usage);
    return 2;
  }
  char *dir = NULL;
  const int status = ci_cli_pull(repo, ci_args_get(flags, nf, "--quiet") != NULL, &dir);
  if (status) return status;
  printf("%s\n", dir);
  cinfer_free(dir);
  return 0;
}
