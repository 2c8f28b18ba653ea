/* JSON Schema -> GBNF (grammar/grammar.h): the grammar of the JSON texts a schema accepts, for
 * structured output. Supported: type (string, number, integer, boolean, null, object, array, or a
 * list of them), properties, required, additionalProperties (false, true or a schema; absent =
 * false when strict, else any), enum, const, items, minItems, maxItems, minLength, maxLength,
 * format (date, time, date-time, uuid), anyOf, oneOf (as anyOf), $ref to #/$defs/... or
 * #/definitions/... (recursive ones too), and the annotations (title, description, default,
 * examples, $schema, $id, $comment, deprecated, readOnly, writeOnly), which change nothing. Any
 * other keyword is an error naming it and where it is.
 *
 * The JSON generated is compact with an optional single space after each token; numbers have at
 * most 16 integer digits, 16 fraction digits and 3 exponent digits. Required properties come
 * first in their declared order, then the optional ones in theirs. */
#ifndef CI_GRAMMAR_JSON_SCHEMA_H
#define CI_GRAMMAR_JSON_SCHEMA_H

#include "grammar/grammar.h"

#include <jansson.h>
#include <stddef.h>

/* The GBNF text (start rule "root") of the schema; malloc'd, the caller frees. NULL with
 * ci_last_error ("json_schema: unsupported keyword \"pattern\" at /properties/name"). */
char *ci_json_schema_to_gbnf(json_t *schema, int strict);

/* The same from JSON text. */
char *ci_json_schema_text_to_gbnf(const char *text, size_t len, int strict);

/* The GBNF text of any JSON object (response_format json_object); static. */
const char *ci_json_object_gbnf(void);

/* Compiles the schema (JSON text) to a grammar. NULL with ci_last_error. */
ci_grammar *ci_grammar_from_json_schema(const char *text, size_t len, int strict);

#endif
