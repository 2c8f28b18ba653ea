/* libFuzzer target: arbitrary bytes as a tokenizer.json must either be rejected with a message or
 * load into a tokenizer that encodes a fixed multi-script text and decodes the ids back, without
 * crashing. */
#include "base/error.h"
#include "text/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char text[] = "Hello, World! <s> 123 naïve café e\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 "
                           "\xF0\x9F\x98\x80  \t\n\r\n <mask>x [UNK]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ci_clear_error();
  ci_tokenizer *tok = ci_tokenizer_load_json((const char *)data, size);
  if (!tok) {
    if (ci_last_error()[0] == '\0') abort();
    return 0;
  }
  for (int special = 0; special < 2; special++) {
    int32_t *ids;
    size_t n;
    if (ci_tokenizer_encode(tok, text, sizeof text - 1, special, &ids, &n) == CI_OK) {
      char *out;
      size_t len;
      for (size_t i = 0; i < n; i++)
        if (ids[i] < 0) abort();
      if (ci_tokenizer_decode(tok, ids, n, special, &out, &len) == CI_OK) {
        if (strlen(out) > len) abort();
        free(out);
      }
      free(ids);
    }
  }
  ci_tokenizer_free(tok);
  return 0;
}
