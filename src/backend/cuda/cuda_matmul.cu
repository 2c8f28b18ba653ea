/* The CUDA backend's matmul: y[m, N] = x[m, K] @ W[N, K]^T with cuBLASLt, for bf16, f16 and f32
 * weights. x is f32 in the workspace; for half-precision weights it is rounded to the weight's
 * type first (one conversion kernel), and the product accumulates in f32. cuBLASLt runs with no
 * workspace, so it never splits K across blocks: a row's result is the same for every m, which
 * keeps batched rows bit-identical to solo ones (tested on the GPU). Long affine rows are summed
 * in K segments (ci_cuda_k_segment) in one strided-batched call and an in-order sum. Up to 16 input
 * rows of bf16 weights go to the small-batch kernel of cuda_gemv.cu instead, which computes the
 * same bits at the bandwidth limit (affine weights up to 16 rows too); affine weights above that
 * up to CI_CUDA_BATCH_ROWS the batch kernel of cuda_batch_gemm.cu (dequantised on chip; same
 * bits again); only larger affine products (prefill) dequantise slices for cuBLASLt. Plans
 * (layouts and the chosen algorithm) are cached per shape;
 * cuBLASLt itself is opened at run time, so programs that never start a GPU never load it. */
#include "backend/cuda/cuda_internal.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PLAN_CACHE = 1024 };

typedef struct {
  int64_t n, k, lda, m, ldc;
  int batch;        /* products in one call (K segments, k elements apart in A and B), 1: one */
  int64_t stride_c; /* floats between the batch's outputs */
  int dtype;
  int valid;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
} plan;

/* The cuBLASLt entry points the backend calls, resolved with dlsym. */
struct ci_cuda_blas {
  void *lib;
  cublasLtHandle_t handle;
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  cublasLtMatmulPreference_t pref;
  plan plans[PLAN_CACHE];
  int next_victim;
};

template <typename F> static int resolve(void *lib, const char *name, F *out) {
  *out = (F)dlsym(lib, name);
  return *out ? 0 : -1;
}

int ci_cuda_blas_create(ci_cuda *cu) {
  ci_cuda_blas *b = (ci_cuda_blas *)calloc(1, sizeof *b);
  if (!b) return ci_fail("out of memory");
  static const char *const names[] = {"libcublasLt.so.13",
#ifdef CINFER_CUDA_LIBDIR
                                      CINFER_CUDA_LIBDIR "/libcublasLt.so.13",
#endif
                                      "libcublasLt.so.12", "libcublasLt.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !b->lib; i++)
    b->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!b->lib) {
    free(b);
    return ci_fail("CUDA: cannot load cuBLASLt (libcublasLt.so.13): %s", dlerror());
  }
  int missing = resolve(b->lib, "cublasLtCreate", &b->create) |
                resolve(b->lib, "cublasLtDestroy", &b->destroy) |
                resolve(b->lib, "cublasLtMatmulDescCreate", &b->desc_create) |
                resolve(b->lib, "cublasLtMatmulDescDestroy", &b->desc_destroy) |
                resolve(b->lib, "cublasLtMatmulDescSetAttribute", &b->desc_set) |
                resolve(b->lib, "cublasLtMatrixLayoutCreate", &b->layout_create) |
                resolve(b->lib, "cublasLtMatrixLayoutDestroy", &b->layout_destroy) |
                resolve(b->lib, "cublasLtMatrixLayoutSetAttribute", &b->layout_set) |
                resolve(b->lib, "cublasLtMatmulPreferenceCreate", &b->pref_create) |
                resolve(b->lib, "cublasLtMatmulPreferenceDestroy", &b->pref_destroy) |
                resolve(b->lib, "cublasLtMatmulPreferenceSetAttribute", &b->pref_set) |
                resolve(b->lib, "cublasLtMatmulAlgoGetHeuristic", &b->heuristic) |
                resolve(b->lib, "cublasLtMatmul", &b->matmul);
  if (missing) {
    dlclose(b->lib);
    free(b);
    return ci_fail("CUDA: cuBLASLt lacks an entry point cinfer needs");
  }
  /* no workspace and no split-K reduction of any kind: every output element is one in-order
   * accumulation over K, whatever the number of rows */
  size_t workspace = 0;
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  if (b->create(&b->handle) != CUBLAS_STATUS_SUCCESS ||
      b->pref_create(&b->pref) != CUBLAS_STATUS_SUCCESS ||
      b->pref_set(b->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                  sizeof workspace) != CUBLAS_STATUS_SUCCESS ||
      b->pref_set(b->pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                  sizeof reduction) != CUBLAS_STATUS_SUCCESS) {
    dlclose(b->lib);
    free(b);
    return ci_fail("CUDA: cannot start cuBLASLt");
  }
  cu->blas = b;
  return CI_OK;
}

static void plan_free(ci_cuda_blas *b, plan *p) {
  if (!p->valid) return;
  b->layout_destroy(p->a);
  b->layout_destroy(p->b);
  b->layout_destroy(p->c);
  b->desc_destroy(p->desc);
  p->valid = 0;
}

void ci_cuda_blas_destroy(ci_cuda *cu) {
  ci_cuda_blas *b = cu->blas;
  if (!b) return;
  for (int i = 0; i < PLAN_CACHE; i++) plan_free(b, &b->plans[i]);
  b->pref_destroy(b->pref);
  b->destroy(b->handle);
  dlclose(b->lib);
  free(b);
  cu->blas = NULL;
}

static cudaDataType_t cuda_type(int dtype) {
  return dtype == CI_BF16 ? CUDA_R_16BF : dtype == CI_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Column-major view: C[N, m] = op(A)[N, K] . B[K, m] with A = W stored [N][lda] (K x N col-major,
 * transposed), B = x stored [m][lda] (K x m), C = y stored [m][ldc] (N x m); K <= lda (a segment
 * of the rows' columns). */
static plan *plan_get(ci_cuda *cu, int64_t n, int64_t k, int64_t lda, int64_t m, int64_t ldc,
                      int dtype, int batch, int64_t stride_c) {
  ci_cuda_blas *b = cu->blas;
  unsigned h =
      (unsigned)(((((n * 31 + k) * 131 + m * 7 + dtype) * 17 + ldc) * 13 + lda) * 7 + batch) %
      PLAN_CACHE;
  for (int probe = 0; probe < 8; probe++) {
    plan *p = &b->plans[(h + probe) % PLAN_CACHE];
    if (p->valid && p->n == n && p->k == k && p->lda == lda && p->m == m && p->ldc == ldc &&
        p->dtype == dtype && p->batch == batch && p->stride_c == stride_c)
      return p;
  }
  plan *p = NULL;
  for (int probe = 0; probe < 8 && !p; probe++)
    if (!b->plans[(h + probe) % PLAN_CACHE].valid) p = &b->plans[(h + probe) % PLAN_CACHE];
  if (!p) {
    p = &b->plans[(h + (unsigned)(b->next_victim++ & 7)) % PLAN_CACHE];
    plan_free(b, p);
  }
  cudaDataType_t t = cuda_type(dtype);
  cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  if (b->desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
    ci_fail("cuBLASLt: cannot create a matmul descriptor");
    return NULL;
  }
  b->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa);
  b->desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb);
  int ok = b->layout_create(&p->a, t, (uint64_t)k, (uint64_t)n, lda) == CUBLAS_STATUS_SUCCESS;
  ok = ok && b->layout_create(&p->b, t, (uint64_t)k, (uint64_t)m, lda) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       b->layout_create(&p->c, CUDA_R_32F, (uint64_t)n, (uint64_t)m, ldc) == CUBLAS_STATUS_SUCCESS;
  if (ok && batch > 1) { /* strided batch: the next k columns, outputs stride_c floats apart */
    const int32_t count = batch;
    const cublasLtMatrixLayoutAttribute_t nb = CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                          off = CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET;
    cublasLtMatrixLayout_t layouts[3] = {p->a, p->b, p->c};
    const int64_t strides[3] = {k, k, stride_c};
    for (int i = 0; i < 3 && ok; i++)
      ok = b->layout_set(layouts[i], nb, &count, sizeof count) == CUBLAS_STATUS_SUCCESS &&
           b->layout_set(layouts[i], off, &strides[i], sizeof strides[i]) == CUBLAS_STATUS_SUCCESS;
  }
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  if (ok && b->heuristic(b->handle, p->desc, p->a, p->b, p->c, p->c, b->pref, 1, &result, &found) !=
                CUBLAS_STATUS_SUCCESS)
    found = 0;
  p->valid = 1;
  if (!ok || found < 1) {
    plan_free(b, p);
    ci_fail("cuBLASLt: no algorithm for a %lld x %lld x %lld matmul", (long long)m, (long long)n,
            (long long)k);
    return NULL;
  }
  p->algo = result.algo;
  p->n = n;
  p->k = k;
  p->lda = lda;
  p->batch = batch;
  p->stride_c = stride_c;
  p->m = m;
  p->ldc = ldc;
  p->dtype = dtype;
  return p;
}

static int64_t k_segment_of(const ci_cuda_k_rule *rule, int dtype, int64_t n, int64_t k) {
  /* bf16 rows stream near the bandwidth as one chain each; cutting them measured slower (8B
   * down projection, H200). Affine rows longer than 4096 columns (the down projection), measured
   * on the 8B (14336 columns, 256 row groups) and 1B (8192, 128) geometries: q4 in four
   * segments (8B: 3,584 columns beat 2,048 and 1,024; 1B: 2,048 beat 4,096, and 1,024 won at
   * batch 1 but lost at 16); q8, whose larger stages leave fewer blocks an SM, in about 512
   * (row group, segment) units: two segments for the 8B (+3% at batch 1 over four), four for
   * the 1B (+3% over two). Rows of 2048 to 4096 columns of matrices of at most 4096 rows (q, k,
   * v, o): two segments for q4 (8B batch 1 +2%, 1B +3%), none for q8 (-2%); cutting the gate
   * and up rows too lost. */
  if (!ci_dtype_is_affine((ci_dtype)dtype)) return k;
  int64_t segs = rule->segments;
  if (k <= rule->above) {
    segs = dtype == CI_Q4 && n <= 4096 && k >= 2048 ? rule->short_segments : 1;
  } else if (dtype == CI_Q8 && rule->q8_units > 0) {
    const int64_t groups = (n + 15) / 16, want = (rule->q8_units + groups / 2) / groups;
    segs = want < 2 ? 2 : want > segs ? segs : want;
  }
  /* (the row bound keeps a small-batch launch's row groups within its segment counters) */
  if (segs < 2 || n > 16 * (CI_CUDA_GEMV_COUNTS / CI_CUDA_GEMV_MAX_PARTS)) return k;
  const int64_t cols = ((k + segs - 1) / segs + 511) / 512 * 512; /* whole small-batch stages */
  return cols < k ? cols : k;
}

int64_t ci_cuda_k_segment(const ci_cuda *cu, int dtype, int64_t n, int64_t k) {
  return k_segment_of(&cu->k_rule, dtype, n, k);
}

extern "C" int64_t ci_cuda_k_segment_host(int dtype, int64_t n, int64_t k) {
  const ci_cuda_k_rule rule = ci_cuda_k_rule_default();
  return k_segment_of(&rule, dtype, n, k);
}

static int segments_of(int64_t k, int64_t seg_cols) {
  return (int)((k + seg_cols - 1) / seg_cols);
}

enum { DEQUANT_SLICE_BYTES = 64 << 20 };

/* Rows of an affine weight dequantised per cuBLASLt call: whole multiples of 16, at most
 * DEQUANT_SLICE_BYTES of bf16. */
static int64_t dequant_slice_rows(int64_t n, int64_t k) {
  int64_t rows = DEQUANT_SLICE_BYTES / (k * 2) / 16 * 16;
  if (rows < 16) rows = 16;
  return rows < n ? rows : n;
}

static int is_half(int dtype) {
  return dtype == CI_BF16 || dtype == CI_F16 || ci_dtype_is_affine((ci_dtype)dtype);
}

/* 1 when matmul commands [c, c + parts) run in the small-batch kernel: every part fits it and all
 * share the weight format (the same decision sizes the scratch and runs them); consecutive parts
 * cut into the same K segments run as one launch. */
static int parts_take_gemv(const ci_cuda *cu, const ci_cuda_cmd *c, int parts) {
  const ci_cuda_weight *w0 = &c->a.matmul.w;
  const int64_t k = c->a.matmul.k, m = c->a.matmul.m;
  const int planes = is_half(w0->dtype) ? cu->input_planes : 1;
  int small = parts <= CI_CUDA_GEMV_MAX_PARTS;
  for (int p = 0; p < parts; p++)
    small &= c[p].a.matmul.w.dtype == w0->dtype && c[p].a.matmul.w.group_size == w0->group_size &&
             c[p].a.matmul.w.f16_pairs == w0->f16_pairs &&
             ci_cuda_gemv_fits(w0->dtype, c[p].a.matmul.n, k, m, planes);
  return small;
}

/* 1 when matmul commands [c, c + parts) that the small-batch kernel does not take run in the batch
 * kernel (cuda_batch_gemm.cu): every part is affine in one format and the rows fit it. */
static int parts_take_batch(const ci_cuda *cu, const ci_cuda_cmd *c, int parts) {
  const ci_cuda_weight *w0 = &c->a.matmul.w;
  const int64_t k = c->a.matmul.k, m = c->a.matmul.m;
  int batch = parts <= CI_CUDA_GEMV_MAX_PARTS &&
              ci_cuda_batch_gemm_fits(cu, w0->dtype, w0->group_size, k, cu->input_planes * m);
  for (int p = 1; p < parts; p++)
    batch &= c[p].a.matmul.w.dtype == w0->dtype && c[p].a.matmul.w.group_size == w0->group_size &&
             c[p].a.matmul.w.f16_pairs == w0->f16_pairs;
  return batch;
}

/* Whether a product writes partial products to scratch slot 4 ([segments][planes * m][n]) for
 * ci_cuda_segment_sum: with K segments always; the batch kernel with two planes too. */
static int writes_partials(int segs, int batch, int planes) {
  return segs > 1 || (batch && planes == 2);
}

void ci_cuda_matmul_scratch(const ci_cuda *cu, const ci_cuda_cmd *c, int parts,
                            size_t need[CI_CUDA_SCRATCH_SLOTS]) {
  const int dtype = c->a.matmul.w.dtype;
  const int64_t k = c->a.matmul.k, m = c->a.matmul.m;
  const int planes = is_half(dtype) ? cu->input_planes : 1;
  const int small = parts_take_gemv(cu, c, parts);
  const int batch = !small && parts_take_batch(cu, c, parts);
  for (int s = 0; s < CI_CUDA_SCRATCH_SLOTS; s++) need[s] = 0;
  need[0] = is_half(dtype) ? (size_t)planes * m * k * sizeof(uint16_t) : 0;
  size_t partial = 0; /* the partial products: [segments][planes * m][n] a part */
  for (int p = 0; p < parts; p++) {
    const int64_t n = c[p].a.matmul.n, segs = segments_of(k, ci_cuda_k_segment(cu, dtype, n, k));
    partial += writes_partials((int)segs, batch, planes)
                   ? (size_t)(segs * planes * m * n) * sizeof(float)
                   : 0;
  }
  need[4] = partial;
  for (int p = 0; p < parts && !small && !batch; p++) {
    const int64_t n = c[p].a.matmul.n;
    const size_t sum = planes == 2 && segments_of(k, ci_cuda_k_segment(cu, dtype, n, k)) == 1
                           ? (size_t)2 * m * n * sizeof(float)
                           : 0;
    const size_t slice = ci_dtype_is_affine((ci_dtype)c[p].a.matmul.w.dtype)
                             ? (size_t)dequant_slice_rows(n, k) * k * sizeof(uint16_t)
                             : 0;
    need[1] = sum > need[1] ? sum : need[1];
    need[3] = slice > need[3] ? slice : need[3];
  }
}

/* out[., ldc] = input W^T with cuBLASLt for an n-row W in a half type or f32 (input already in
 * W's type, planes * m rows), over k columns of rows lda apart; with batch > 1, as many products
 * of the next k columns each (K segments), their outputs stride_c floats apart. */
static int blas_launch(ci_cuda *cu, const void *w, int dtype, int64_t n, int64_t k, int64_t lda,
                       const void *input, int64_t rows, float *out, int64_t ldc, int batch,
                       int64_t stride_c) {
  plan *p = plan_get(cu, n, k, lda, rows, ldc, dtype, batch, stride_c);
  if (!p) return CI_ERR;
  const float one = 1.0f, zero = 0.0f;
  cublasStatus_t st = cu->blas->matmul(cu->blas->handle, p->desc, &one, w, p->a, input, p->b, &zero,
                                       out, p->c, out, p->c, &p->algo, NULL, 0, cu->stream);
  if (st != CUBLAS_STATUS_SUCCESS) /* the CUDA error says why a launch failed */
    return ci_fail("cuBLASLt: matmul %lld x %lld x %lld failed (status %d; CUDA: %s)",
                   (long long)rows, (long long)n, (long long)k, (int)st,
                   cudaGetErrorString(cudaGetLastError()));
  return CI_OK;
}

/* One matrix in cuBLASLt, K segment by K segment (ci_cuda_k_segment: each segment's product into
 * its partial, then their sum in order): affine weights slice by slice through their bf16
 * dequantisation; with two planes the products of both land in scratch (slot 1, or the partials)
 * and are summed. */
static int blas_matmul(ci_cuda *cu, const ci_cuda_weight *w, int64_t n, int64_t k,
                       const void *input, int64_t m, int planes, float *y) {
  const int64_t seg_cols = ci_cuda_k_segment(cu, w->dtype, n, k), rows_in = planes * m;
  const int segs = segments_of(k, seg_cols);
  /* rows [0, m): values, then remainders; segment s's products rows_in * n floats further on */
  float *out = segs > 1 ? (float *)cu->scratch[4] : planes == 2 ? (float *)cu->scratch[1] : y;
  const int affine = ci_dtype_is_affine((ci_dtype)w->dtype);
  const int dtype = affine ? CI_BF16 : w->dtype;
  const size_t elem = dtype == CI_F32 ? 4 : 2; /* bytes of a weight and of an input element */
  const int64_t slice = affine ? dequant_slice_rows(n, k) : n;
  for (int64_t r0 = 0; r0 < n; r0 += slice) {
    const int64_t rows = n - r0 < slice ? n - r0 : slice;
    const uint8_t *wr = (const uint8_t *)w->data;
    if (affine) {
      ci_cuda_affine_dequant(cu, w, r0, rows, k, cu->scratch[3]);
      wr = (const uint8_t *)cu->scratch[3];
    }
    /* the segments of seg_cols columns in one strided call, then a shorter last one */
    const int whole = (int)(k / seg_cols), rest = (int)(k - whole * seg_cols);
    const size_t seg_out = (size_t)rows_in * n;
    if (blas_launch(cu, wr, dtype, rows, seg_cols, k, input, rows_in, out + r0, n, whole,
                    (int64_t)seg_out))
      return CI_ERR;
    if (rest && blas_launch(cu, wr + (size_t)whole * seg_cols * elem, dtype, rows, rest, k,
                            (const uint8_t *)input + (size_t)whole * seg_cols * elem, rows_in,
                            out + whole * seg_out + r0, n, 1, 0))
      return CI_ERR;
  }
  if (segs > 1)
    ci_cuda_segment_sum(cu, y, out, segs, m, n, planes);
  else if (planes == 2)
    ci_cuda_sum(cu, y, out, out + m * n, m * n);
  return CI_OK;
}

/* Matrices in the batch kernel: runs of parts cut into the same K segments as one launch,
 * each part's partial products (segments, or two planes) at its own place in scratch slot 4 (as
 * ci_cuda_matmul_scratch sized it), then summed into y in the order blas_matmul sums them. */
static int batch_kernel_matmul(ci_cuda *cu, const ci_cuda_cmd *c, int parts, const void *input,
                               int planes) {
  const int64_t k = c->a.matmul.k, m = c->a.matmul.m;
  ci_cuda_weight w[CI_CUDA_GEMV_MAX_PARTS];
  int64_t n[CI_CUDA_GEMV_MAX_PARTS], seg_cols[CI_CUDA_GEMV_MAX_PARTS];
  int segs[CI_CUDA_GEMV_MAX_PARTS];
  float *out[CI_CUDA_GEMV_MAX_PARTS];
  float *partial = (float *)cu->scratch[4];
  for (int p = 0; p < parts; p++) {
    w[p] = c[p].a.matmul.w;
    n[p] = c[p].a.matmul.n;
    seg_cols[p] = ci_cuda_k_segment(cu, w[p].dtype, n[p], k);
    segs[p] = segments_of(k, seg_cols[p]);
    out[p] = c[p].a.matmul.y;
    if (writes_partials(segs[p], 1, planes)) {
      out[p] = partial;
      partial += (size_t)segs[p] * planes * m * n[p];
    }
  }
  for (int p = 0, run; p < parts; p += run) { /* equal segments: equal partials too */
    for (run = 1; p + run < parts && seg_cols[p + run] == seg_cols[p];) run++;
    ci_cuda_batch_gemm_launch(cu, run, w + p, n + p, out + p, writes_partials(segs[p], 1, planes),
                              k, input, planes * m, seg_cols[p]);
  }
  for (int p = 0; p < parts; p++)
    if (writes_partials(segs[p], 1, planes))
      ci_cuda_segment_sum(cu, c[p].a.matmul.y, out[p], segs[p], m, n[p], planes);
  return CI_OK;
}

int ci_cuda_matmul_run(ci_cuda *cu, const ci_cuda_cmd *c, int parts) {
  const ci_cuda_weight *w0 = &c->a.matmul.w;
  const int64_t k = c->a.matmul.k, m = c->a.matmul.m;
  const float *x = c->a.matmul.x;
  if (m <= 0) return CI_OK;
  size_t need[CI_CUDA_SCRATCH_SLOTS];
  ci_cuda_matmul_scratch(cu, c, parts, need);
  for (int s = 0; s < CI_CUDA_SCRATCH_SLOTS; s++)
    if (need[s] && !ci_cuda_scratch(cu, s, need[s])) return CI_ERR;
  const void *input = x;
  const int planes = is_half(w0->dtype) ? cu->input_planes : 1;
  if (is_half(w0->dtype)) { /* affine weights multiply bf16 inputs */
    const int bf16 = w0->dtype != CI_F16;
    const int kind = (bf16 ? CI_BF16 : CI_F16) * 4 + planes;
    if (cu->converted_x != x || cu->converted_n != m * k || cu->converted_kind != kind) {
      ci_cuda_to_half(cu, cu->scratch[0], x, m * k, bf16, planes);
      cu->converted_x = x;
      cu->converted_n = m * k;
      cu->converted_kind = kind;
    }
    input = cu->scratch[0];
  }
  const int small = parts_take_gemv(cu, c, parts);
  if (small) {
    ci_cuda_weight w[CI_CUDA_GEMV_MAX_PARTS];
    int64_t n[CI_CUDA_GEMV_MAX_PARTS];
    float *y[CI_CUDA_GEMV_MAX_PARTS];
    int64_t seg_cols[CI_CUDA_GEMV_MAX_PARTS];
    for (int p = 0; p < parts; p++) {
      w[p] = c[p].a.matmul.w;
      n[p] = c[p].a.matmul.n;
      y[p] = c[p].a.matmul.y;
      seg_cols[p] = ci_cuda_k_segment(cu, w[p].dtype, n[p], k);
    }
    for (int p = 0, run; p < parts; p += run) {
      for (run = 1; p + run < parts && seg_cols[p + run] == seg_cols[p];) run++;
      ci_cuda_gemv_launch(cu, run, w + p, n + p, y + p, k, input, m, planes, seg_cols[p],
                          (float *)cu->scratch[4]);
    }
    return CI_OK;
  }
  if (parts_take_batch(cu, c, parts)) return batch_kernel_matmul(cu, c, parts, input, planes);
  for (int p = 0; p < parts; p++)
    if (blas_matmul(cu, &c[p].a.matmul.w, c[p].a.matmul.n, k, input, m, planes, c[p].a.matmul.y))
      return CI_ERR;
  return CI_OK;
}
