/* Jinja syntax tree: one node shape for every expression and statement, built by
 * jinja_parser.c and walked by jinja_eval.c. All nodes of a template live in its node arena and
 * are freed together. Internal to src/text. */
#ifndef CI_TEXT_JINJA_AST_H
#define CI_TEXT_JINJA_AST_H

#include "text/jinja_value.h"

typedef enum {
  /* expressions */
  JN_LITERAL,  /* lit */
  JN_NAME,     /* name */
  JN_LIST,     /* kids */
  JN_TUPLE,    /* kids */
  JN_DICT,     /* kids = key, value, key, value ... */
  JN_GETATTR,  /* a . name */
  JN_GETITEM,  /* a [ b ] */
  JN_SLICE,    /* a [ kids[0] : kids[1] : kids[2] ] (entries may be NULL) */
  JN_CALL,     /* a ( kids ) — kids are expressions or JN_KWARG */
  JN_KWARG,    /* name = a */
  JN_STARARG,  /* *a in a call: a's items are positional arguments */
  JN_DSTARARG, /* **a in a call: a's entries are keyword arguments */
  JN_FILTER,   /* a | name ( kids ); a NULL means the block's captured body */
  JN_TEST,     /* a is [not] name ( kids ); op = 1 when negated */
  JN_UNARY,    /* op a */
  JN_BINARY,   /* a op b */
  JN_COMPARE,  /* a (ops[i] kids[i])... — a chain like Python's */
  JN_COND,     /* b if a else c (c may be NULL) */
  /* statements */
  JN_TEXT,        /* lit (a string) */
  JN_OUTPUT,      /* {{ a }} */
  JN_IF,          /* if a: body else: orelse */
  JN_FOR,         /* for a in b [if c]: body else: orelse */
  JN_SET,         /* set a = b */
  JN_SETBLOCK,    /* set a [| c filter chain]: body */
  JN_MACRO,       /* macro name(kids = JN_PARAM): body */
  JN_PARAM,       /* name [= a] */
  JN_CALLBLOCK,   /* call(kids = JN_PARAM) a: body */
  JN_FILTERBLOCK, /* filter c: body */
  JN_BREAK,
  JN_CONTINUE,
  JN_NSREF, /* assignment target name.attr (name2) */
} jnode_kind;

/* Operators of JN_UNARY / JN_BINARY / JN_COMPARE. */
typedef enum {
  JOP_ADD,
  JOP_SUB,
  JOP_MUL,
  JOP_DIV,
  JOP_FLOORDIV,
  JOP_MOD,
  JOP_POW,
  JOP_CONCAT,
  JOP_AND,
  JOP_OR,
  JOP_NOT,
  JOP_NEG,
  JOP_POS,
  JOP_EQ,
  JOP_NE,
  JOP_LT,
  JOP_LE,
  JOP_GT,
  JOP_GE,
  JOP_IN,
  JOP_NOTIN,
} jop;

typedef struct jnode jnode;
struct jnode {
  jnode_kind kind;
  int line, col;
  jnode *a, *b, *c;
  jnode **kids; /* expression children (arguments, items, parameters) */
  size_t n_kids;
  int *ops; /* JN_COMPARE: one operator per kid */
  jnode **body, **orelse;
  size_t n_body, n_orelse;
  char *name, *name2;
  int op;
  jv lit;
};

/* A parsed template: its top-level statements and every node it owns. */
struct ci_jinja_template {
  jnode **body;
  size_t n_body;
  jnode **nodes; /* all nodes, for freeing */
  size_t n_nodes, cap_nodes;
};

#endif
