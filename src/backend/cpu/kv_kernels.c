/* Attention inner loops per KV codec (see kv_kernels.h): the plain-C row decoders are the
 * reference for every codec; AVX-512 decoders replace them where kv_kernels_avx512.c has one.
 * The attention loop is the ISA's (kv_kernels_avx2.c, kv_kernels_avx512.c), or the plain-C one. */
#include "backend/cpu/kv_kernels.h"

#include "backend/cpu/kernels_impl.h"

#include "base/error.h"
#include "tensor/dtype.h"
#include "tensor/turbo_quant.h"

#include <math.h>
#include <string.h>

enum { TURBO_V_GROUP = 32 };

/* ==== Query and output bases ==== */

static void prepare_copy(const ci_paged_kv *kv, const float *q, float *qp) {
  memcpy(qp, q, (size_t)kv->head_dim * sizeof *qp);
}

/* q̃ = Π q = H (s ⊙ q) */
static void prepare_rotate(const ci_paged_kv *kv, const float *q, float *qp) {
  for (int i = 0; i < kv->head_dim; i++) qp[i] = kv->signs[i] * q[i];
  ci_fwht(qp, kv->head_dim);
}

static void finish_copy(const ci_paged_kv *kv, float *acc, float *out) {
  memcpy(out, acc, (size_t)kv->head_dim * sizeof *out);
}

/* o = Π^T õ = s ⊙ (H õ) */
static void finish_unrotate(const ci_paged_kv *kv, float *acc, float *out) {
  ci_fwht(acc, kv->head_dim);
  for (int i = 0; i < kv->head_dim; i++) out[i] = kv->signs[i] * acc[i];
}

/* ==== Reference row decoders ==== */

static void decode_bf16(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  for (int i = 0; i < kv->head_dim; i++) x[i] = ci_bf16_load(row + 2 * i);
}

static void decode_f32(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  memcpy(x, row, (size_t)kv->head_dim * sizeof *x);
}

/* s_G * code + b_G */
static void decode_affine(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.k_bits, group = kv->format.group_size;
  const uint8_t *scales = row + (size_t)D * bits / 8, *biases = scales + 2 * (D / group);
  for (int g = 0; g < D / group; g++) {
    const float s = ci_bf16_load(scales + 2 * g), b = ci_bf16_load(biases + 2 * g);
    for (int i = g * group; i < (g + 1) * group; i++)
      x[i] = s * (float)ci_kv_code_at(row, i, bits) + b;
  }
}

/* ν ĉ[code], rotated basis */
static void decode_turbo(const ci_paged_kv *kv, const uint8_t *row, int bits, float *x) {
  const int D = kv->head_dim;
  const float *c = ci_lloyd_max_centroids(bits);
  const float nu = ci_f16_load(row + (size_t)D * bits / 8);
  for (int i = 0; i < D; i++) x[i] = nu * c[ci_kv_code_at(row, i, bits)];
}

static void decode_turbo_k(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  decode_turbo(kv, row, kv->format.k_bits, x);
}

static void decode_turbo_v(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  decode_turbo(kv, row, kv->format.v_bits, x);
}

/* turbo-v K: (idx + zp_G) * sc_G, model basis */
static void decode_turbo_v_key(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.k_bits, groups = D / TURBO_V_GROUP;
  const uint8_t *sc = row + (size_t)D * bits / 8, *zp = sc + 2 * groups;
  for (int g = 0; g < groups; g++) {
    const float s = ci_f16_load(sc + 2 * g), z = ci_f16_load(zp + 2 * g);
    for (int i = g * TURBO_V_GROUP; i < (g + 1) * TURBO_V_GROUP; i++) {
      const unsigned code = ci_kv_code_at(row, i, bits);
      x[i] = ((bits == 8 ? (float)(int8_t)(uint8_t)code : (float)code) + z) * s;
    }
  }
}

/* turbo-v V: ĉ[code] r_G, rotated basis */
static void decode_turbo_v_value(const ci_paged_kv *kv, const uint8_t *row, float *x) {
  const int D = kv->head_dim, bits = kv->format.v_bits;
  const float *c = ci_lloyd_max_centroids(bits);
  const uint8_t *r = row + (size_t)D * bits / 8;
  for (int g = 0; g < D / TURBO_V_GROUP; g++) {
    const float scale = ci_f16_load(r + 2 * g);
    for (int i = g * TURBO_V_GROUP; i < (g + 1) * TURBO_V_GROUP; i++)
      x[i] = scale * c[ci_kv_code_at(row, i, bits)];
  }
}

/* ==== The attention loop ==== */

/* One KV head: its G query heads over keys [lo, hi). */
static void attend_head_ref(const ci_kv_kernels *k, const ci_paged_kv *kv, int kv_head,
                            const float *qp, int G, int64_t lo, int64_t hi, float scale,
                            float softcap, float *tile, float *out) {
  const int D = kv->head_dim, T = kv->block_tokens;
  float *ktile = tile, *vtile = tile + (size_t)T * D;
  for (int g = 0; g < G; g++) {
    float *o = out + g * (D + 2);
    o[0] = -INFINITY;
    o[1] = 0.0f;
    memset(o + 2, 0, (size_t)D * sizeof(float));
  }
  float scores[CI_MAX_GQA_GROUP][64];
  for (int64_t j = lo; j < hi;) {
    const int64_t end = (j / T + 1) * T < hi ? (j / T + 1) * T : hi;
    const int count = (int)(end - j);
    /* Rows of one head are contiguous inside a block. */
    const uint8_t *krow = ci_kv_row_at(kv, 0, j, kv_head), *vrow = ci_kv_row_at(kv, 1, j, kv_head);
    for (int r = 0; r < count; r++) {
      k->decode_k(kv, krow + (size_t)r * kv->k_row_bytes, ktile + (size_t)r * D);
      k->decode_v(kv, vrow + (size_t)r * kv->v_row_bytes, vtile + (size_t)r * D);
    }
    for (int g = 0; g < G; g++) {
      float *o = out + g * (D + 2);
      float block_max = o[0];
      for (int r = 0; r < count; r++) {
        float s = k->vec->dot_f32(qp + g * D, ktile + (size_t)r * D, D) * scale;
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        scores[g][r] = s;
        if (s > block_max) block_max = s;
      }
      const float rescale = o[1] > 0.0f ? expf(o[0] - block_max) : 0.0f;
      o[0] = block_max;
      o[1] *= rescale;
      for (int i = 0; i < D; i++) o[2 + i] *= rescale;
      for (int r = 0; r < count; r++) {
        const float w = expf(scores[g][r] - block_max);
        o[1] += w;
        k->vec->axpy_f32(o + 2, w, vtile + (size_t)r * D, D);
      }
    }
    j = end;
  }
}

void ci_kv_attend_ref(const ci_kv_kernels *k, const ci_paged_kv *kv, int head0, int n_heads,
                      const float *qp, int G, int64_t lo, int64_t hi, float scale, float softcap,
                      float *scratch, float *out) {
  const int D = kv->head_dim;
  for (int h = 0; h < n_heads; h++)
    attend_head_ref(k, kv, head0 + h, qp + (size_t)h * G * D, G, lo, hi, scale, softcap, scratch,
                    out + (size_t)h * G * (D + 2));
}

ci_kv_kernels ci_cpu_kv_kernels(ci_isa isa, const ci_kv_format *format, int head_dim,
                                ci_precision precision) {
  ci_kv_kernels k = {.vec = ci_cpu_vec_kernels_get(isa),
                     .attend = ci_kv_attend_ref,
                     .prepare = prepare_copy,
                     .finish = finish_copy};
  switch (format->codec) {
  case CI_KV_BF16:
    k.decode_k = k.decode_v = decode_bf16;
    break;
  case CI_KV_AFFINE:
    k.decode_k = k.decode_v = decode_affine;
    break;
  case CI_KV_TURBO:
    k.prepare = prepare_rotate, k.finish = finish_unrotate;
    k.decode_k = decode_turbo_k, k.decode_v = decode_turbo_v;
    break;
  case CI_KV_TURBO_V:
    k.finish = finish_unrotate;
    k.decode_k = decode_turbo_v_key, k.decode_v = decode_turbo_v_value;
    break;
  default:
    k.decode_k = k.decode_v = decode_f32;
  }
  if (isa == CI_ISA_AVX2 && head_dim % 8 == 0) k.attend = ci_kv_attend_avx2;
  if (isa == CI_ISA_AVX512 && head_dim % 16 == 0) {
    k.attend = ci_kv_attend_avx512;
    ci_kv_row_decoder fast_k = ci_kv_decoder_avx512(format, 0);
    ci_kv_row_decoder fast_v = ci_kv_decoder_avx512(format, 1);
    if (fast_k) k.decode_k = fast_k;
    if (fast_v) k.decode_v = fast_v;
    k.bf16_dots = precision == CI_PRECISION_FAST && format->codec == CI_KV_BF16 &&
                  head_dim % 32 == 0 && ci_cpu_bf16_dot_enabled();
    if (k.bf16_dots && ci_cpu_amx_enabled()) k.attend = ci_kv_attend_amx;
    const int bits = format->k_bits, group = format->group_size;
    const int affine_ok = format->codec == CI_KV_AFFINE && bits == format->v_bits &&
                          ((bits == 8 && group >= 32 && head_dim % 32 == 0) ||
                           (bits == 4 && group >= 64 && head_dim % 64 == 0));
    const int turbo_ok =
        format->codec == CI_KV_TURBO && (bits == 4 || format->v_bits == 4) && head_dim % 64 == 0;
    k.int_dots = precision == CI_PRECISION_FAST && head_dim <= 256 &&
                 ci_cpu_int8_matmul_enabled() && (affine_ok || turbo_ok);
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
