/* The greedy pick of a logits row on the host (tensor/backend.h's ci_row_pick): the CPU
 * backend's pick_rows, and the reference the GPU's picks are tested against. */
#ifndef CI_BACKEND_CPU_ROW_PICK_H
#define CI_BACKEND_CPU_ROW_PICK_H

#include "tensor/backend.h"

#include <stdint.h>

/* The pick of z[0..vocab): ci_row_pick's rule, the sum of e^(z - max) in f32 lanes folded in
 * f64 (as the sampler's log-softmax takes it). */
ci_row_pick ci_row_pick_of(const float *z, int64_t vocab);

#endif
