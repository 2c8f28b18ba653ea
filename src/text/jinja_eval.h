/* Jinja interpreter internals shared by the evaluator (jinja_eval.c), the builtin tables
 * (jinja_filters.c, jinja_tests.c, jinja_methods.c) and tojson (jinja_json.c). Internal to
 * src/text. */
#ifndef CI_TEXT_JINJA_EVAL_H
#define CI_TEXT_JINJA_EVAL_H

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/jinja_value.h"

#include <stdint.h>

typedef struct jscope jscope;
typedef struct ci_jctx ci_jctx;

/* Arguments of a call: positional values, then keyword names and values (all borrowed). */
typedef struct {
  const jv *pos;
  size_t n_pos;
  const char *const *kw_names;
  const jv *kw;
  size_t n_kw;
} jargs;

/* A builtin function, filter or bound method: self is the receiver (the filtered value for a
 * filter, the object for a method, undefined for a global). Writes an owned value to *out. */
typedef int (*jbuiltin_fn)(ci_jctx *c, jv self, const jargs *args, jv *out);
/* A test: writes 0/1 to *result. */
typedef int (*jtest_fn)(ci_jctx *c, jv value, const jargs *args, int *result);

struct jfunc {
  const char *name;
  jbuiltin_fn fn;     /* builtin (NULL for a macro) */
  jv self;            /* bound receiver */
  const jnode *macro; /* JN_MACRO or JN_CALLBLOCK (the caller of a call block) */
  jscope *closure;    /* scope the macro was defined in */
};

/* Render state: the heap, limits and error bookkeeping of one ci_jinja_render call. */
struct ci_jctx {
  ci_jheap heap;
  jscope *kept; /* scopes captured by macros, freed when the render ends */
  jv pipe_in;   /* the captured body a {% filter %} / {% set x | f %} chain applies to */
  uintptr_t stack_base;
  int call_depth;
  uint64_t iterations;
  int located; /* the current error already names its template position */
  ci_jinja_limits limits;
  uint64_t work; /* bytes of strings built so far */
};

enum {
  JINJA_MAX_CALL_DEPTH = 200,
  JINJA_MAX_STACK = 2 << 20, /* bytes of C stack a render may use */
  JINJA_HEAP_LIMIT = 1u << 30,
};

/* Binds args to named parameters: slots[i] receives positional i or the keyword names[i];
 * missing ones are left JV_UNDEF (borrowed values). Fails on unknown keywords or too many
 * positionals, naming `what`. */
int jargs_bind(const jargs *args, const char *const *names, size_t n_names, jv *slots,
               const char *what);

/* Attribute and item access with Jinja2's fallbacks (a.b tries the attribute then a['b']). */
int jinja_getattr(ci_jctx *c, jv obj, const char *name, jv *out);
int jinja_getitem(ci_jctx *c, jv obj, jv key, jv *out);
/* Calls a callable value. */
int jinja_call(ci_jctx *c, jv fn, const jargs *args, jv *out);
/* Fails with the message an undefined value raises when used ("'x' is undefined"). */
int jinja_undefined_error(jv undef);
/* Python `item in container`. */
int jinja_contains(jv container, jv item, int *result);
/* The items iterating over v yields (list items, dict keys, string characters): a new list. */
int jinja_iterate(ci_jctx *c, jv v, jlist **out);
/* Creates a heap function value (for bound methods and globals). */
int jinja_make_func(ci_jctx *c, const char *name, jbuiltin_fn fn, jv self, jv *out);

/* Builtin tables (data, looked up by name). */
jbuiltin_fn jinja_filter_find(const char *name);
jtest_fn jinja_test_find(const char *name);
jbuiltin_fn jinja_method_find(jv self, const char *name);
jbuiltin_fn jinja_global_find(const char *name);
/* Applies filter/test `name` with extra args (used by map, select, ...). */
int jinja_apply_filter(ci_jctx *c, const char *name, jv value, const jargs *args, jv *out);
int jinja_apply_test(ci_jctx *c, const char *name, jv value, const jargs *args, int *result);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) as Python writes it. indent < 0:
 * none; item_sep/key_sep NULL: Python's defaults. */
int jinja_tojson(ci_jctx *c, jv v, int indent, const char *indent_str, const char *item_sep,
                 const char *key_sep, int ensure_ascii, int sort_keys, jbuf *out);

/* String operations shared by methods and filters (jinja_methods.c). */
enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP };
int jinja_strip(jv s, const char *chars, size_t chars_len, int left, int right, jv *out);
int jinja_change_case(jv s, int mode, jv *out);
int jinja_replace(jv s, jv old, jv repl, int64_t count, jv *out);
/* Python `fmt % args` (printf-style; args a tuple, a dict or one value). */
int jinja_str_format(ci_jctx *c, jv fmt, jv args, jv *out);
/* raise_exception: fails with exactly msg (no template position added). */
int jinja_raise(ci_jctx *c, const char *msg);

/* Checks a freshly built string value (a NULL string means the size limit was hit). */
int jinja_check_str(jv v);

#endif
