/* Jinja runtime values: the Python-like value model the interpreter computes with (undefined,
 * none, bool, int, float, str, list/tuple, dict/namespace, callable), with Python semantics for
 * truth, equality, ordering and str()/repr().
 *
 * Ownership: strings are reference counted (jv_dup / jv_drop); containers and callables live in
 * the render's heap (ci_jheap) and are all freed together by ci_jheap_free, so reference cycles
 * (a namespace holding itself, a list appended to itself) cannot leak. A function that returns
 * a jv gives the caller one reference. */
#ifndef CI_TEXT_JINJA_VALUE_H
#define CI_TEXT_JINJA_VALUE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  JV_UNDEF,
  JV_NONE,
  JV_BOOL,
  JV_INT,
  JV_FLOAT,
  JV_STR,
  JV_LIST,
  JV_DICT,
  JV_FUNC,
} jv_kind;

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;

typedef struct {
  jv_kind kind;
  union {
    int b;
    int64_t i;
    double f;
    jstr *s;   /* JV_STR; for JV_UNDEF an optional hint ("'x' is undefined") or NULL */
    jlist *l;  /* JV_LIST */
    jdict *d;  /* JV_DICT */
    jfunc *fn; /* JV_FUNC */
  } u;
} jv;

struct jstr {
  int refs;
  size_t len;
  char data[]; /* NUL-terminated UTF-8 */
};

struct jlist {
  size_t n, cap;
  jv *items;
  int is_tuple; /* immutable and printed as (a, b) */
};

struct jdict {
  size_t n, cap;
  jv *keys, *vals; /* insertion ordered, like Python dicts */
  int is_namespace;
};

/* The heap owning a render's containers, plus its allocation budget. */
typedef struct jheap_obj jheap_obj;
typedef struct {
  jheap_obj *head;
  size_t bytes, limit;
  int over; /* set once the budget is exhausted */
} ci_jheap;

/* Strings longer than this are refused (a template cannot blow up memory). */
enum { JV_MAX_STR = 64 << 20 };

static inline jv jv_undef(void) {
  jv v = {.kind = JV_UNDEF};
  v.u.s = NULL;
  return v;
}
static inline jv jv_none(void) {
  jv v = {.kind = JV_NONE};
  v.u.i = 0;
  return v;
}
static inline jv jv_bool(int b) {
  jv v = {.kind = JV_BOOL};
  v.u.b = b != 0;
  return v;
}
static inline jv jv_int(int64_t i) {
  jv v = {.kind = JV_INT};
  v.u.i = i;
  return v;
}
static inline jv jv_float(double f) {
  jv v = {.kind = JV_FLOAT};
  v.u.f = f;
  return v;
}

jv jv_dup(jv v);
void jv_drop(jv v);
/* Makes a string immortal: jv_dup and jv_drop leave it alone (a parsed template's literals, which
 * concurrent renders share); jv_free_frozen releases it with its template. */
void jv_freeze(jv *v);
void jv_free_frozen(jv v);

/* Strings. On allocation failure or a size over JV_MAX_STR they return a JV_STR whose u.s is
 * NULL: check with jv_is_err(). */
jv jv_str(const char *s, size_t len);
jv jv_cstr(const char *s);
static inline int jv_is_err(jv v) {
  return v.kind == JV_STR && v.u.s == NULL;
}
/* An undefined value carrying the message Jinja would raise when it is used. */
jv jv_undef_hint(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Heap containers: allocation returns NULL once the heap's byte budget is exhausted. */
void ci_jheap_init(ci_jheap *h, size_t limit);
void ci_jheap_free(ci_jheap *h);
void *ci_jheap_alloc(ci_jheap *h, size_t size, void (*fini)(void *));
jlist *jv_new_list(ci_jheap *h, size_t cap);
jdict *jv_new_dict(ci_jheap *h, size_t cap);
static inline jv jv_list(jlist *l) {
  jv v = {.kind = JV_LIST};
  v.u.l = l;
  return v;
}
static inline jv jv_dict(jdict *d) {
  jv v = {.kind = JV_DICT};
  v.u.d = d;
  return v;
}
/* Appends (takes the reference). 0 ok, -1 out of memory. */
int jlist_push(ci_jheap *h, jlist *l, jv item);
/* Borrowed lookup by string key; NULL if absent. */
jv *jdict_get(const jdict *d, const char *key, size_t len);
/* Borrowed lookup by any key (Python equality). */
jv *jdict_get_v(const jdict *d, jv key);
/* Sets (takes references to key and val, replacing an existing entry). */
int jdict_set(ci_jheap *h, jdict *d, jv key, jv val);

/* Python truthiness. */
int jv_truthy(jv v);
/* Python == (1 == 1.0 == True; deep for containers; two undefineds are equal). */
int jv_equal(jv a, jv b);
/* Python ordering for sort and < >: sets *cmp (-1/0/1); -1 return on a type error (message set
 * with ci_fail). */
int jv_compare(jv a, jv b, int *cmp);
/* Python-style type name for messages: "str", "int", "list", "dict", "NoneType", "Undefined". */
const char *jv_type_name(jv v);

/* Output buffer used for rendering and for building strings. */
typedef struct {
  char *data;
  size_t len, cap;
  int failed; /* allocation failure or size limit */
} jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_putc(jbuf *b, char c);
void jbuf_free(jbuf *b);
/* Moves the buffer into a new string value (the buffer is reset). */
jv jbuf_take(jbuf *b);

/* str(v) as Python prints it (None, True, 1.5, ['a', 1], {'k': 'v'}); undefined prints "". */
void jv_write_str(jbuf *b, jv v);
/* repr(v). */
void jv_write_repr(jbuf *b, jv v);
/* str(v) as a new string value (a string returns itself, with a new reference). */
jv jv_to_str(jv v);
/* Python float repr (shortest round-trip, "1.0", "1e-05", "inf"). */
void jv_write_float(jbuf *b, double f);

/* JSON → value (containers in h). 0 ok, -1 on failure (message set). */
int jv_from_json(ci_jheap *h, const json_t *j, jv *out);

/* UTF-8 helpers: number of code points, byte offset of code point i (clamped). */
size_t ju8_count(const char *s, size_t len);
size_t ju8_offset(const char *s, size_t len, size_t cp_index);
/* Decodes one code point at s (len > 0); returns its byte length (1 for invalid bytes). */
size_t ju8_decode(const char *s, size_t len, int32_t *cp);
void ju8_encode(jbuf *b, int32_t cp);
/* Python str.isspace() for one code point. */
int ju8_isspace(int32_t cp);

#endif
