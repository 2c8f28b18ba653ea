/* Attention inner loops per KV codec (see kv_kernels.h). The plain loops here are the reference
 * for every codec; bf16 goes through the ISA's vector kernels. */
#include "backend/cpu/kv_kernels.h"

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/turbo_quant.h"

#include <string.h>

enum { TURBO_V_GROUP = 32 };

static float load_f16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return ci_f16_to_f32(h);
}

static float load_bf16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return ci_bf16_to_f32(h);
}

/* ==== Plain formats ==== */

static void prepare_copy(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *q, float *qp) {
  (void)k;
  memcpy(qp, q, (size_t)kv->head_dim * sizeof *qp);
}

static float dot_bf16(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp,
                      const uint8_t *row) {
  return k->vec->dot_bf16(qp, (const uint16_t *)(const void *)row, kv->head_dim);
}

static void axpy_bf16(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
                      const uint8_t *row) {
  k->vec->axpy_bf16(acc, a, (const uint16_t *)(const void *)row, kv->head_dim);
}

static float dot_f32(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp,
                     const uint8_t *row) {
  (void)k;
  const float *x = (const float *)(const void *)row;
  float sum = 0.0f;
  for (int i = 0; i < kv->head_dim; i++) sum += qp[i] * x[i];
  return sum;
}

static void axpy_f32(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
                     const uint8_t *row) {
  (void)k;
  const float *x = (const float *)(const void *)row;
  for (int i = 0; i < kv->head_dim; i++) acc[i] += a * x[i];
}

static void finish_copy(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float *out) {
  (void)k;
  memcpy(out, acc, (size_t)kv->head_dim * sizeof *out);
}

/* ==== Affine (MLX): <q, s*code + b> = sum_G s_G <q_G, code_G> + b_G sum(q_G) ==== */

static void prepare_group_sums(const ci_paged_kv *kv, const float *q, float *qp, int group) {
  const int D = kv->head_dim;
  memcpy(qp, q, (size_t)D * sizeof *qp);
  for (int g = 0; g < D / group; g++) {
    float sum = 0.0f;
    for (int i = g * group; i < (g + 1) * group; i++) sum += q[i];
    qp[D + g] = sum;
  }
}

static void prepare_affine(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *q,
                           float *qp) {
  (void)k;
  prepare_group_sums(kv, q, qp, kv->format.group_size);
}

/* sum_i q[i] * code[i] over one group of a bit stream. */
static float code_dot(const float *q, const uint8_t *codes, int first, int n, int bits) {
  float sum = 0.0f;
  if (bits == 8) {
    for (int i = 0; i < n; i++) sum += q[i] * (float)codes[first + i];
  } else if (bits == 4) {
    const uint8_t *c = codes + first / 2;
    for (int i = 0; i < n; i += 2) {
      sum += q[i] * (float)(c[i / 2] & 15u);
      sum += q[i + 1] * (float)(c[i / 2] >> 4);
    }
  } else {
    for (int i = 0; i < n; i++) sum += q[i] * (float)ci_kv_code_at(codes, first + i, bits);
  }
  return sum;
}

static float dot_affine(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp,
                        const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.k_bits, group = kv->format.group_size;
  const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * (D / group);
  float sum = 0.0f;
  for (int g = 0; g < D / group; g++)
    sum += load_bf16(scales + 2 * g) * code_dot(qp + g * group, row, g * group, group, bits) +
           load_bf16(biases + 2 * g) * qp[D + g];
  return sum;
}

static void axpy_affine(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
                        const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.v_bits, group = kv->format.group_size;
  const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * (D / group);
  for (int g = 0; g < D / group; g++) {
    const float s = a * load_bf16(scales + 2 * g), b = a * load_bf16(biases + 2 * g);
    for (int i = g * group; i < (g + 1) * group; i++)
      acc[i] += s * (float)ci_kv_code_at(row, i, bits) + b;
  }
}

/* ==== TurboQuant: score and accumulate in the rotated basis ==== */

static void prepare_rotate(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *q,
                           float *qp) {
  (void)k;
  for (int i = 0; i < kv->head_dim; i++) qp[i] = kv->signs[i] * q[i];
  ci_fwht(qp, kv->head_dim);
}

static float dot_turbo(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp,
                       const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.k_bits;
  const float *c = ci_lloyd_max_centroids(bits);
  float sum = 0.0f;
  if (bits == 4) {
    for (int i = 0; i < D; i += 2) {
      sum += qp[i] * c[row[i / 2] & 15u];
      sum += qp[i + 1] * c[row[i / 2] >> 4];
    }
  } else {
    for (int i = 0; i < D; i++) sum += qp[i] * c[ci_kv_code_at(row, i, bits)];
  }
  return sum * load_f16(row + (size_t)D * bits / 8);
}

static void axpy_turbo(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
                       const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.v_bits;
  const float *c = ci_lloyd_max_centroids(bits);
  const float w = a * load_f16(row + (size_t)D * bits / 8);
  for (int i = 0; i < D; i++) acc[i] += w * c[ci_kv_code_at(row, i, bits)];
}

/* o = Π^T õ = s ⊙ (H õ) */
static void finish_unrotate(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float *out) {
  (void)k;
  ci_fwht(acc, kv->head_dim);
  for (int i = 0; i < kv->head_dim; i++) out[i] = kv->signs[i] * acc[i];
}

/* ==== turbo-v: asymmetric affine K decoded inline, rotated Lloyd-Max V ==== */

static void prepare_turbo_v(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *q,
                            float *qp) {
  (void)k;
  prepare_group_sums(kv, q, qp, TURBO_V_GROUP);
}

/* <q, (idx + zp) * sc> = sum_G sc_G (<q_G, idx_G> + zp_G sum(q_G)) */
static float dot_turbo_v(const ci_kv_kernels *k, const ci_paged_kv *kv, const float *qp,
                         const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.k_bits, groups = D / TURBO_V_GROUP;
  const uint8_t *sc = row + (size_t)D * bits / 8, *zp = sc + 2 * groups;
  float sum = 0.0f;
  for (int g = 0; g < groups; g++) {
    const float *q = qp + g * TURBO_V_GROUP;
    float idx_dot = 0.0f;
    if (bits == 8) {
      const int8_t *c = (const int8_t *)(const void *)(row + g * TURBO_V_GROUP);
      for (int i = 0; i < TURBO_V_GROUP; i++) idx_dot += q[i] * (float)c[i];
    } else {
      idx_dot = code_dot(q, row, g * TURBO_V_GROUP, TURBO_V_GROUP, bits);
    }
    sum += load_f16(sc + 2 * g) * (idx_dot + load_f16(zp + 2 * g) * qp[D + g]);
  }
  return sum;
}

static void axpy_turbo_v(const ci_kv_kernels *k, const ci_paged_kv *kv, float *acc, float a,
                         const uint8_t *row) {
  (void)k;
  const int D = kv->head_dim, bits = kv->format.v_bits;
  const float *c = ci_lloyd_max_centroids(bits);
  const uint8_t *r = row + (size_t)D * bits / 8;
  for (int g = 0; g < D / TURBO_V_GROUP; g++) {
    const float w = a * load_f16(r + 2 * g);
    for (int i = g * TURBO_V_GROUP; i < (g + 1) * TURBO_V_GROUP; i++)
      acc[i] += w * c[ci_kv_code_at(row, i, bits)];
  }
}

ci_kv_kernels ci_cpu_kv_kernels(ci_isa isa, const ci_kv_format *format) {
  ci_kv_kernels k = {.vec = ci_cpu_vec_kernels_get(isa)};
  switch (format->codec) {
  case CI_KV_BF16:
    k.prepare = prepare_copy, k.dot = dot_bf16, k.axpy = axpy_bf16, k.finish = finish_copy;
    break;
  case CI_KV_AFFINE:
    k.prepare = prepare_affine, k.dot = dot_affine, k.axpy = axpy_affine, k.finish = finish_copy;
    break;
  case CI_KV_TURBO:
    k.prepare = prepare_rotate, k.dot = dot_turbo, k.axpy = axpy_turbo, k.finish = finish_unrotate;
    break;
  case CI_KV_TURBO_V:
    k.prepare = prepare_turbo_v, k.dot = dot_turbo_v, k.axpy = axpy_turbo_v,
    k.finish = finish_unrotate;
    break;
  default:
    k.prepare = prepare_copy, k.dot = dot_f32, k.axpy = axpy_f32, k.finish = finish_copy;
  }
  return k;
}

int ci_cpu_kv_store(ci_isa isa, const ci_paged_kv *kv, const float *k, const float *v,
                    const int32_t *pos, int n_rows) {
  const ci_cpu_vec_kernels *vec = ci_cpu_vec_kernels_get(isa);
  const int D = kv->head_dim;
  const int64_t width = (int64_t)kv->n_kv_heads * D;
  for (int r = 0; r < n_rows; r++) {
    if (pos[r] < 0 || pos[r] / kv->block_tokens >= kv->n_table_entries ||
        kv->block_table[pos[r] / kv->block_tokens] < 0)
      return ci_fail("kv_store: position %d has no block", pos[r]);
    for (int h = 0; h < kv->n_kv_heads; h++) {
      const float *kr = k + r * width + h * D, *vr = v + r * width + h * D;
      uint8_t *k_out = ci_kv_row_at(kv, 0, pos[r], h), *v_out = ci_kv_row_at(kv, 1, pos[r], h);
      if (kv->format.codec == CI_KV_BF16) {
        vec->f32_to_bf16((uint16_t *)(void *)k_out, kr, D);
        vec->f32_to_bf16((uint16_t *)(void *)v_out, vr, D);
      } else {
        ci_kv_encode_row(&kv->format, 0, kv->signs, kr, D, k_out);
        ci_kv_encode_row(&kv->format, 1, kv->signs, vr, D, v_out);
      }
    }
  }
  return CI_OK;
}
