/* TurboQuant primitives: sign vectors, Walsh-Hadamard transform, Lloyd-Max codebooks. */
#include "tensor/turbo_quant.h"

#include "tensor/dtype.h"

#include <math.h>
#include <stddef.h>

void ci_turbo_signs(int layer, int head_dim, float *signs) {
  uint64_t state = 0x63696E6665720000ULL ^ ((uint64_t)(uint32_t)layer << 16) ^ (uint64_t)head_dim;
  for (int j = 0; j < head_dim; j++) {
    state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
    signs[j] = (z >> 63) ? -1.0f : 1.0f;
  }
}

void ci_fwht(float *x, int head_dim) {
  for (int len = 1; len < head_dim; len <<= 1)
    for (int i = 0; i < head_dim; i += len << 1)
      for (int j = i; j < i + len; j++) {
        float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float scale = 1.0f / sqrtf((float)head_dim);
  for (int i = 0; i < head_dim; i++) x[i] *= scale;
}

/* ==== Lloyd-Max codebooks (docs/kv-cache.md §2.5) ==== */

static const float centroids2[4] = {-1.510418f, -0.452780f, 0.452780f, 1.510418f};
static const float thresholds2[3] = {-0.981599f, 0.0f, 0.981599f};
static const float centroids3[8] = {-2.151946f, -1.343909f, -0.756005f, -0.245094f,
                                    0.245094f,  0.756005f,  1.343909f,  2.151946f};
static const float thresholds3[7] = {-1.747927f, -1.049957f, -0.500550f, 0.0f,
                                     0.500550f,  1.049957f,  1.747927f};
static const float centroids4[16] = {
    -2.732590f, -2.069017f, -1.618046f, -1.256231f, -0.942340f, -0.656759f, -0.388048f, -0.128395f,
    0.128395f,  0.388048f,  0.656759f,  0.942340f,  1.256231f,  1.618046f,  2.069017f,  2.732590f};
static const float thresholds4[15] = {-2.400803f, -1.843532f, -1.437139f, -1.099286f, -0.799550f,
                                      -0.522404f, -0.258222f, 0.0f,       0.258222f,  0.522404f,
                                      0.799550f,  1.099286f,  1.437139f,  1.843532f,  2.400803f};

static const struct {
  const float *centroids, *thresholds;
  double mse;
} codebooks[5] = {[2] = {centroids2, thresholds2, 0.117482},
                  [3] = {centroids3, thresholds3, 0.034548},
                  [4] = {centroids4, thresholds4, 0.009501}};

const float *ci_lloyd_max_centroids(int bits) {
  return bits >= 2 && bits <= 4 ? codebooks[bits].centroids : NULL;
}

const float *ci_lloyd_max_thresholds(int bits) {
  return bits >= 2 && bits <= 4 ? codebooks[bits].thresholds : NULL;
}

double ci_lloyd_max_mse(int bits) {
  return bits >= 2 && bits <= 4 ? codebooks[bits].mse : 0.0;
}

uint8_t ci_lloyd_max_code(float u, int bits) {
  const float *t = codebooks[bits].thresholds;
  const int n = (1 << bits) - 1;
  /* Binary search for the number of thresholds strictly below u. */
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (t[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (uint8_t)lo;
}

uint16_t ci_f32_to_f16_saturate(float f) {
  if (f > 65504.0f) f = 65504.0f;
  if (f < -65504.0f) f = -65504.0f;
  return ci_f32_to_f16(f);
}
