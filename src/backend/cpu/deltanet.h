/* The gated DeltaNet op of the CPU backend (Qwen3.5 linear attention): convolution, q/k
 * normalisation, the gated delta rule in chunked and recurrent form, gated RMSNorm. */
#ifndef CI_BACKEND_CPU_DELTANET_H
#define CI_BACKEND_CPU_DELTANET_H

#include "backend/cpu/kernels.h"
#include "base/arena.h"
#include "base/threadpool.h"
#include "tensor/backend.h"

/* Rows of one block of the chunked (block-parallel) form. */
enum { CI_DELTANET_CHUNK = 64 };

/* Runs the op of ci_deltanet_args on `pool` with the dot and axpy kernels of `vec`, its scratch
 * taken from `scratch` (reset first). Returns CI_OK, or CI_ERR with ci_last_error (bad geometry,
 * out of memory). */
int ci_cpu_gated_deltanet(ci_threadpool *pool, ci_arena *scratch, const ci_cpu_vec_kernels *vec,
                          const ci_deltanet_args *args);

#endif
