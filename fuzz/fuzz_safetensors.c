/* libFuzzer target: arbitrary bytes as a safetensors file image must be either rejected with a
 * message or accepted with every entry's byte range inside the buffer and consistent. */
#include "base/error.h"
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ci_st_tensor *tensors = NULL;
  int count = -1;
  ci_clear_error();
  if (ci_st_parse(data, size, "fuzz.safetensors", 0, &tensors, &count) != CI_OK) {
    if (tensors || count != 0 || ci_last_error()[0] == '\0') abort();
    return 0;
  }
  volatile unsigned checksum = 0; /* volatile: the reads below must not be optimised away */
  for (int i = 0; i < count; i++) {
    const ci_st_tensor *t = &tensors[i];
    const uint8_t *first = t->data;
    if (first < data || first + t->nbytes > data + size || t->name[0] == '\0') abort();
    if (t->ndim < 0 || t->ndim > CI_ST_MAX_DIMS) abort();
    if (i > 0 && strcmp(tensors[i - 1].name, t->name) >= 0) abort();
    if ((size_t)ci_st_tensor_numel(t) * (size_t)(ci_dtype_get(t->dtype)->bits / 8) != t->nbytes) {
      abort();
    }
    /* Touch both ends so ASan checks the range really is inside the input. */
    if (t->nbytes > 0) checksum += first[0] + first[t->nbytes - 1];
  }
  (void)checksum;
  free(tensors);
  return 0;
}
