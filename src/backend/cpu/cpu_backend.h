/* The CPU backend: implements the op table of tensor/backend.h with the CPU kernels on a
 * thread pool. */
#ifndef CI_BACKEND_CPU_BACKEND_H
#define CI_BACKEND_CPU_BACKEND_H

#include "backend/cpu/kernels.h"
#include "tensor/backend.h"

/* Creates a CPU backend running on n_threads threads (0 = all online CPUs) with the best
 * kernels this CPU supports. Returns NULL with ci_last_error on failure. Free with
 * be->ops->destroy(be). */
ci_backend *ci_cpu_backend_create(int n_threads);

/* The ISA the backend's kernels use. */
ci_isa ci_cpu_backend_isa(const ci_backend *be);

#endif
