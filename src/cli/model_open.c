/* Loading a model for a verb: --threads, --device, --gpu, --mmap, --precision and
 * --tensor-parallel into
 * cinfer_model_options (--threads
 * above the online CPUs is capped to them with a one-line warning), then cinfer_model_load with
 * its error printed as one line. */
#include "cli/verbs.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ci_cli_model_options; warn: print the --threads cap (once per verb: the load reads the flags
 * again without it). */
static int read_options(const ci_flag *flags, int n_flags, const char *verb,
                        cinfer_model_options *options, int warn) {
  cinfer_model_options_init(options);
  long long threads, gpu, ranks;
  if (ci_args_int(flags, n_flags, "--threads", 0, 1, 4096, &threads) ||
      ci_args_int(flags, n_flags, "--gpu", 0, 0, 1024, &gpu) ||
      ci_args_int(flags, n_flags, "--tensor-parallel", 1, 1, 8, &ranks))
    return 2;
  const char *device = ci_args_get(flags, n_flags, "--device");
  if (device && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0 &&
      strcmp(device, "auto") != 0) {
    fprintf(stderr, "cinfer %s: --device must be cpu, cuda or auto, got '%s'\n", verb, device);
    return 2;
  }
  const char *precision = ci_args_get(flags, n_flags, "--precision");
  if (precision && strcmp(precision, "fast") != 0 && strcmp(precision, "exact") != 0) {
    fprintf(stderr, "cinfer %s: --precision must be fast or exact, got '%s'\n", verb, precision);
    return 2;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && threads > online) {
    if (warn)
      fprintf(stderr,
              "cinfer %s: warning: --threads %lld is more than the %ld online CPUs; using %ld\n",
              verb, threads, online, online);
    threads = online;
  }
  options->n_threads = (int)threads;
  options->device = device;
  options->gpu = (int)gpu;
  options->tensor_parallel = (int)ranks;
  options->mmap = ci_args_get(flags, n_flags, "--mmap") != NULL;
  options->precision =
      precision && strcmp(precision, "exact") == 0 ? CINFER_PRECISION_EXACT : CINFER_PRECISION_FAST;
  return 0;
}

int ci_cli_model_options(const ci_flag *flags, int n_flags, const char *verb,
                         cinfer_model_options *options) {
  return read_options(flags, n_flags, verb, options, 1);
}

int ci_cli_model_load(const ci_flag *flags, int n_flags, const char *verb, const char *model_arg,
                      cinfer_model **out) {
  *out = NULL;
  cinfer_model_options options;
  if (read_options(flags, n_flags, verb, &options, 0)) return 2;
  const cinfer_status status = cinfer_model_load(model_arg, &options, out);
  if (status != CINFER_OK) {
    fprintf(stderr, "cinfer: %s\n", cinfer_last_error());
    return status == CINFER_INVALID_ARGUMENT ? 2 : 1;
  }
  if (*cinfer_model_device_note(*out))
    fprintf(stderr, "cinfer %s: running on the CPU: %s (--device cpu skips the GPU)\n", verb,
            cinfer_model_device_note(*out));
  return 0;
}
