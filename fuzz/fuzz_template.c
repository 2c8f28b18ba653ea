/* libFuzzer target: the fuzz input is a Jinja chat template, parsed and rendered over a fixed
 * conversation (with tools) under tight limits. Any template, however malformed or hostile,
 * must give output or an error — never a crash, a leak or a hang. */
#include "text/jinja.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static const char conversation[] =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    "{\"role\": \"user\", \"content\": \"Weather in Paris? \\u00e9\\u4f60\\ud83d\\ude00\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nok\", \"tool_calls\": "
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Paris\"}}}]},"
    "{\"role\": \"tool\", \"content\": \"18C\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks\"}, "
    "{\"type\": \"image\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
    "\"description\": \"Get weather\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\", \"default\": 1.5}}, "
    "\"required\": [\"city\"]}}}],"
    "\"documents\": null, \"add_generation_prompt\": true, \"enable_thinking\": false, "
    "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static json_t *vars; /* parsed once; never modified */
  if (!vars) vars = json_loads(conversation, 0, NULL);
  if (size > 1 << 16) return 0;
  ci_jinja_template *t = ci_jinja_parse((const char *)data, size);
  if (!t) return 0;
  ci_jinja_limits limits = {.max_iterations = 20000, .max_work = 32 << 20, .max_output = 1 << 20};
  char *out = NULL;
  size_t len = 0;
  if (ci_jinja_render_limited(t, vars, &limits, &out, &len) == 0) free(out);
  ci_jinja_free(t);
  return 0;
}
