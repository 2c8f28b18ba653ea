/* The CPU backend: implements the op table of tensor/backend.h with the CPU kernels on a
 * thread pool. */
#ifndef CI_BACKEND_CPU_BACKEND_H
#define CI_BACKEND_CPU_BACKEND_H

#include "backend/cpu/kernels.h"
#include "tensor/backend.h"

/* Creates a CPU backend running on n_threads threads (0 = all online CPUs) with the best
 * kernels this CPU supports, its matmuls in `precision`. Returns NULL with ci_last_error on
 * failure. Free with be->ops->destroy(be). */
ci_backend *ci_cpu_backend_create_with(int n_threads, ci_precision precision);

/* ci_cpu_backend_create_with in CI_PRECISION_EXACT (the reference numerics). */
ci_backend *ci_cpu_backend_create(int n_threads);

/* The precision of the backend's matmuls. */
ci_precision ci_cpu_backend_precision(const ci_backend *be);

/* The ISA the backend's kernels use. */
ci_isa ci_cpu_backend_isa(const ci_backend *be);

#endif
