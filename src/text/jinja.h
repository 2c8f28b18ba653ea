/* Jinja templates: a Jinja2-compatible interpreter for the subset real chat templates use
 * (expressions, filters, tests, for/if/set/macro/call/filter blocks, namespaces, loop controls),
 * configured as transformers configures Jinja2 (trim_blocks, lstrip_blocks, tojson with
 * ensure_ascii=False, raise_exception, strftime_now).
 *
 * A parsed template is immutable and may be rendered from several threads at once. */
#ifndef CI_TEXT_JINJA_H
#define CI_TEXT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ci_jinja_template ci_jinja_template;

/* Parses template source (len bytes). NULL + ci_last_error() ("line L, column C: ...") on a
 * syntax error. The caller owns the result (ci_jinja_free). */
ci_jinja_template *ci_jinja_parse(const char *source, size_t len);
void ci_jinja_free(ci_jinja_template *t);

/* Renders with the keys of `vars` (a JSON object, may be NULL) as the template's variables.
 * *out is malloc'd and NUL-terminated (caller frees), *out_len its length. Returns CI_ERR with
 * ci_last_error() set on failure: for raise_exception(msg) the message is exactly msg; other
 * errors name the template line. Loops, recursion, memory and output size are bounded, so no
 * template can hang or exhaust memory. */
int ci_jinja_render(const ci_jinja_template *t, const json_t *vars, char **out, size_t *out_len);

/* Bounds on one render (exceeding one is an error naming it). */
typedef struct {
  uint64_t max_iterations; /* for-loop iterations plus macro calls */
  uint64_t max_work;       /* total bytes of the strings expressions build */
  size_t max_output;       /* bytes of rendered output */
} ci_jinja_limits;

/* The limits ci_jinja_render uses: 1,000,000 iterations, 4 GiB of string work, 256 MiB out. */
ci_jinja_limits ci_jinja_default_limits(void);
/* ci_jinja_render with explicit limits (NULL: the defaults). */
int ci_jinja_render_limited(const ci_jinja_template *t, const json_t *vars,
                            const ci_jinja_limits *limits, char **out, size_t *out_len);

#endif
