/* edgespec._native: the thin CPython binding over the native proposers.
 *
 * Token inputs are validated here (1-D, int32, contiguous buffers go through
 * zero-copy; lists and tuples of ints are copied with range checks); the C
 * library re-checks ranges and reports status codes, which become exceptions.
 * Calls on large inputs release the GIL; each object carries a lock (a
 * cursor: its tree's) so that a call without the GIL never races another call
 * on the same object. Every type is a NativeObject described by a
 * native_kind, so init, extend, memory, check and the locked calls are
 * written once. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <string.h>

#include "es_native.h"

#define GIL_RELEASE_TOKENS 4096
#define SMALL_TOKENS 64

static PyObject *CapacityError;   /* the byte budget is spent (subclass of MemoryError) */
static PyObject *IntegrityError;  /* an integrity check failed */
static PyObject *StateError;      /* the call does not fit the object's state */

static PyObject *raise_status(es_status st, const char *what) {
    switch (st) {
    case ES_E_ARG:
        PyErr_Format(PyExc_ValueError, "%s: invalid argument", what);
        break;
    case ES_E_RANGE:
        PyErr_Format(PyExc_ValueError, "%s: token ids must be >= 0", what);
        break;
    case ES_E_NOMEM:
        PyErr_Format(PyExc_MemoryError, "%s: out of memory", what);
        break;
    case ES_E_FULL:
        PyErr_Format(CapacityError, "%s: memory budget (max_bytes) exhausted", what);
        break;
    case ES_E_STATE:
        PyErr_Format(StateError, "%s: %s", what, es_strerror(st));
        break;
    default:
        PyErr_Format(IntegrityError, "%s: %s", what, es_strerror(st));
        break;
    }
    return NULL;
}

/* ------------------------------------------------------------ locking */

static void lock_acquire(PyThread_type_lock lk) {
    if (!PyThread_acquire_lock(lk, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(lk, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

/* Takes up to two locks (either may be NULL, both may be the same) in
 * address order, so that two callers cannot deadlock; held[] says which. */
static void lock_two(PyThread_type_lock a, PyThread_type_lock b, PyThread_type_lock held[2]) {
    if (a == b) b = NULL;
    if (a && b && (uintptr_t)a > (uintptr_t)b) {
        PyThread_type_lock x = a;
        a = b;
        b = x;
    }
    held[0] = a;
    held[1] = b;
    if (a) lock_acquire(a);
    if (b) lock_acquire(b);
}

static void unlock_two(PyThread_type_lock held[2]) {
    if (held[1]) PyThread_release_lock(held[1]);
    if (held[0]) PyThread_release_lock(held[0]);
}

/* ------------------------------------------------------- token input */

typedef struct {
    const int32_t *data;
    Py_ssize_t n;
    Py_buffer view;
    int has_view;
    int32_t *owned;
    int32_t small[SMALL_TOKENS];
} tokens_t;

static int is_int32_format(const char *f) {
    if (f == NULL) return 0;
    if (*f == '@' || *f == '=') f++;
#if PY_LITTLE_ENDIAN
    else if (*f == '<') f++;
#else
    else if (*f == '>' || *f == '!') f++;
#endif
    if (strcmp(f, "i") == 0) return 1;
    return strcmp(f, "l") == 0 && sizeof(long) == 4;
}

static void tokens_release(tokens_t *tb) {
    if (tb->has_view) PyBuffer_Release(&tb->view);
    tb->has_view = 0;
    if (tb->owned != NULL) PyMem_Free(tb->owned);
    tb->owned = NULL;
}

static int tokens_from_buffer(PyObject *obj, tokens_t *tb) {
    if (PyObject_GetBuffer(obj, &tb->view, PyBUF_RECORDS_RO) < 0) return -1;
    tb->has_view = 1;
    Py_buffer *v = &tb->view;
    if (v->ndim != 1) {
        PyErr_Format(PyExc_ValueError, "tokens must be 1-D (got %d dimensions)", v->ndim);
        return -1;
    }
    if (v->itemsize != 4 || !is_int32_format(v->format)) {
        PyErr_Format(PyExc_TypeError,
                     "tokens must be int32 (got buffer format '%s', item size %zd); "
                     "convert with numpy.asarray(tokens, dtype=numpy.int32)",
                     v->format ? v->format : "B", v->itemsize);
        return -1;
    }
    if (v->shape[0] > 1 && v->strides[0] != 4) {
        PyErr_SetString(PyExc_ValueError,
                        "tokens must be contiguous; use numpy.ascontiguousarray(tokens)");
        return -1;
    }
    tb->data = (const int32_t *)v->buf;
    tb->n = v->shape[0];
    return 0;
}

static int tokens_from_sequence(PyObject *obj, tokens_t *tb) {
    PyObject *seq = PySequence_Fast(obj, "tokens must be a sequence of ints or an int32 buffer");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int32_t *dst = tb->small;
    if (n > SMALL_TOKENS) {
        tb->owned = PyMem_Malloc((size_t)n * sizeof(int32_t));
        if (tb->owned == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        dst = tb->owned;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "token %zd is %.100s, not an int", i,
                         Py_TYPE(items[i])->tp_name);
            Py_DECREF(seq);
            return -1;
        }
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (overflow || x < 0 || x > INT32_MAX) {
            PyErr_Format(PyExc_ValueError, "token %zd is out of range: ids must be in [0, 2**31)", i);
            Py_DECREF(seq);
            return -1;
        }
        dst[i] = (int32_t)x;
    }
    Py_DECREF(seq);
    tb->data = dst;
    tb->n = n;
    return 0;
}

/* Fills tb from obj; on failure tb holds nothing and an exception is set. */
static int tokens_get(PyObject *obj, tokens_t *tb) {
    memset(tb, 0, offsetof(tokens_t, small));
    int rc;
    if (PyList_Check(obj) || PyTuple_Check(obj)) rc = tokens_from_sequence(obj, tb);
    else if (PyObject_CheckBuffer(obj)) rc = tokens_from_buffer(obj, tb);
    else rc = -2;
    if (rc == 0) return 0;
    tokens_release(tb);
    if (rc == -1) return -1;
    PyErr_Format(PyExc_TypeError,
                 "tokens must be a list/tuple of ints or a 1-D int32 buffer, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
}

static PyObject *tuple_of_tokens(const int32_t *t, int32_t n) {
    PyObject *tup = PyTuple_New(n);
    if (tup == NULL) return NULL;
    for (int32_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(t[i]);
        if (v == NULL) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, i, v);
    }
    return tup;
}

/* (tokens, probs, match_len, score, source) of a draft. */
static PyObject *draft_result(const es_draft *d) {
    PyObject *tt = tuple_of_tokens(d->tokens, d->n);
    PyObject *pt = tt ? PyTuple_New(d->n) : NULL;
    for (int32_t i = 0; pt != NULL && i < d->n; i++) {
        PyObject *f = PyFloat_FromDouble(d->probs[i]);
        if (f == NULL) Py_CLEAR(pt);
        else PyTuple_SET_ITEM(pt, i, f);
    }
    if (pt == NULL) {
        Py_XDECREF(tt);
        return NULL;
    }
    return Py_BuildValue("(NNidi)", tt, pt, (int)d->match_len, d->score, (int)d->source);
}

/* ------------------------------------------------------ native objects */

/* What the shared code needs to know about one C object type. */
typedef struct {
    const char *name;
    void (*destroy)(void *);
    size_t (*memory)(const void *);
    es_status (*check)(const void *, int, char *, size_t);  /* NULL: none */
    es_status (*extend)(void *, const int32_t *, int64_t);
} native_kind;

typedef struct {
    PyObject_HEAD
    void *obj;                 /* the C object; NULL until __init__ succeeds */
    const native_kind *kind;
    PyThread_type_lock lock;   /* serialises calls; a cursor borrows its tree's */
    PyObject *owner;           /* a cursor's tree (strong reference: it must outlive the cursor) */
} NativeObject;

/* The C API takes typed pointers; these adapters give every kind one shape
 * (calling a function through a pointer of another type is undefined). */
#define ADAPT_COMMON(pfx, T)                                                              \
    static void pfx##_destroy_v(void *o) { pfx##_destroy((T *)o); }                       \
    static size_t pfx##_memory_v(const void *o) { return pfx##_memory((const T *)o); }    \
    static es_status pfx##_extend_v(void *o, const int32_t *t, int64_t n) {               \
        return pfx##_extend((T *)o, t, n);                                                \
    }
#define ADAPT_CHECK(pfx, T)                                                               \
    static es_status pfx##_check_v(const void *o, int deep, char *msg, size_t cap) {      \
        return pfx##_check((const T *)o, deep, msg, cap);                                 \
    }

ADAPT_COMMON(es_ngram, es_ngram)
ADAPT_CHECK(es_ngram, es_ngram)
ADAPT_COMMON(es_stree, es_stree)
ADAPT_CHECK(es_stree, es_stree)
ADAPT_COMMON(es_cursor, es_cursor)
ADAPT_COMMON(es_ngstat, es_ngstat)
ADAPT_CHECK(es_ngstat, es_ngstat)

static const native_kind NGRAM_KIND = {"NgramIndex", es_ngram_destroy_v, es_ngram_memory_v,
                                       es_ngram_check_v, es_ngram_extend_v};
static const native_kind TREE_KIND = {"SuffixTree", es_stree_destroy_v, es_stree_memory_v,
                                      es_stree_check_v, es_stree_extend_v};
static const native_kind CURSOR_KIND = {"SuffixCursor", es_cursor_destroy_v, es_cursor_memory_v,
                                        NULL, es_cursor_extend_v};
static const native_kind STATS_KIND = {"NgramStats", es_ngstat_destroy_v, es_ngstat_memory_v,
                                       es_ngstat_check_v, es_ngstat_extend_v};

#define NEED_INIT(self)                                                                   \
    do {                                                                                  \
        if ((self)->obj == NULL) {                                                        \
            PyErr_Format(PyExc_RuntimeError, "%s is not initialised", Py_TYPE(self)->tp_name); \
            return NULL;                                                                  \
        }                                                                                 \
    } while (0)

static int refuse_reinit(NativeObject *self) {
    if (self->obj == NULL) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s is already initialised", Py_TYPE(self)->tp_name);
    return -1;
}

/* Takes ownership of a freshly created C object (st: its create status).
 * lock == NULL: allocate one of its own. Returns 0, or -1 with an error set. */
static int native_adopt(NativeObject *self, const native_kind *kind, es_status st, void *obj,
                        PyThread_type_lock lock, PyObject *owner) {
    if (st != ES_OK) return raise_status(st, kind->name), -1;
    if (lock == NULL && (lock = PyThread_allocate_lock()) == NULL) {
        kind->destroy(obj);
        PyErr_NoMemory();
        return -1;
    }
    self->obj = obj;
    self->kind = kind;
    self->lock = lock;
    Py_XINCREF(owner);
    self->owner = owner;
    return 0;
}

static void native_dealloc(NativeObject *self) {
    if (self->obj != NULL) self->kind->destroy(self->obj);
    if (self->lock != NULL && self->owner == NULL) PyThread_free_lock(self->lock);
    Py_XDECREF(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Calls fn(obj) under the object's lock. */
static PyObject *locked_call(NativeObject *self, es_status (*fn)(void *), const char *what) {
    NEED_INIT(self);
    lock_acquire(self->lock);
    es_status st = fn(self->obj);
    PyThread_release_lock(self->lock);
    if (st != ES_OK) return raise_status(st, what);
    Py_RETURN_NONE;
}

/* Calls fn(obj, tokens) under the object's lock, without the GIL for large inputs. */
static PyObject *locked_tokens(NativeObject *self, PyObject *arg,
                               es_status (*fn)(void *, const int32_t *, int64_t), const char *what) {
    NEED_INIT(self);
    tokens_t tb;
    if (tokens_get(arg, &tb) < 0) return NULL;
    es_status st;
    lock_acquire(self->lock);
    if (tb.n >= GIL_RELEASE_TOKENS) {
        Py_BEGIN_ALLOW_THREADS
        st = fn(self->obj, tb.data, tb.n);
        Py_END_ALLOW_THREADS
    } else {
        st = fn(self->obj, tb.data, tb.n);
    }
    PyThread_release_lock(self->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, what);
    Py_RETURN_NONE;
}

static PyObject *native_extend(NativeObject *self, PyObject *arg) {
    NEED_INIT(self);
    char what[64];
    PyOS_snprintf(what, sizeof what, "%s.extend", self->kind->name);
    return locked_tokens(self, arg, self->kind->extend, what);
}

static PyObject *native_memory(NativeObject *self, PyObject *Py_UNUSED(x)) {
    NEED_INIT(self);
    lock_acquire(self->lock);
    size_t b = self->kind->memory(self->obj);
    PyThread_release_lock(self->lock);
    return PyLong_FromSize_t(b);
}

static PyObject *native_check(NativeObject *self, PyObject *args, PyObject *kw) {
    NEED_INIT(self);
    static char *names[] = {"deep", NULL};
    int deep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, &deep)) return NULL;
    char msg[256] = "";
    es_status st;
    lock_acquire(self->lock);
    Py_BEGIN_ALLOW_THREADS
    st = self->kind->check(self->obj, deep, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    PyThread_release_lock(self->lock);
    if (st == ES_E_CORRUPT) {
        PyErr_Format(IntegrityError, "%s: %s", self->kind->name, msg);
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, self->kind->name);
    Py_RETURN_NONE;
}

/* A read-only integer attribute: closure points at one of these. */
typedef struct {
    int64_t (*get)(const void *);
} int_getter;

static PyObject *native_get_int(NativeObject *self, void *closure) {
    NEED_INIT(self);
    lock_acquire(self->lock);
    int64_t v = ((const int_getter *)closure)->get(self->obj);
    PyThread_release_lock(self->lock);
    return PyLong_FromLongLong(v);
}

/* What an object exports, copied into a new bytes object under its lock:
 * fn(obj, arg, NULL, &n) sets n, the number of int32s; fn(obj, arg, buf, &n)
 * fills buf (n: its capacity). ES_E_ARG raises arg_error with what. */
typedef es_status (*export_fn)(const void *obj, const void *arg, int32_t *buf, int64_t *n);

static PyObject *locked_export(NativeObject *self, export_fn fn, const void *arg, PyObject *arg_error,
                               const char *what) {
    NEED_INIT(self);
    lock_acquire(self->lock);
    int64_t n = 0;
    es_status st = fn(self->obj, arg, NULL, &n);
    PyObject *out = NULL;
    if (st == ES_OK) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n * 4);
        if (out != NULL) st = fn(self->obj, arg, (int32_t *)PyBytes_AS_STRING(out), &n);
    }
    PyThread_release_lock(self->lock);
    if (st == ES_OK) return out;
    Py_XDECREF(out);
    if (st == ES_E_ARG) {
        PyErr_SetString(arg_error, what);
        return NULL;
    }
    return raise_status(st, what);
}

/* A type object over NativeObject: every native type differs only in these. */
#define NATIVE_TYPE(cname, pyname, doc, methods, getset, init)                  \
    static PyTypeObject cname = {                                              \
        PyVarObject_HEAD_INIT(NULL, 0)                                         \
        .tp_name = "edgespec._native." pyname,                                 \
        .tp_basicsize = sizeof(NativeObject),                                  \
        .tp_dealloc = (destructor)native_dealloc,                              \
        .tp_flags = Py_TPFLAGS_DEFAULT,                                        \
        .tp_doc = doc,                                                         \
        .tp_methods = methods,                                                 \
        .tp_getset = getset,                                                   \
        .tp_init = (initproc)init,                                             \
        .tp_new = PyType_GenericNew,                                           \
    }

/* ------------------------------------------------------------ NgramIndex */

/* NgramIndex and NgramStats take the same arguments: min_n, max_n, max_bytes. */
typedef es_status (*orders_create)(int32_t min_n, int32_t max_n, int64_t max_bytes, void **out);

static es_status ngram_create_v(int32_t lo, int32_t hi, int64_t bytes, void **out) {
    es_ngram_config cfg = {lo, hi, bytes};
    es_ngram *ix = NULL;
    es_status st = es_ngram_create(&cfg, &ix);
    *out = ix;
    return st;
}

static es_status ngstat_create_v(int32_t lo, int32_t hi, int64_t bytes, void **out) {
    es_ngstat_config cfg = {lo, hi, bytes};
    es_ngstat *s = NULL;
    es_status st = es_ngstat_create(&cfg, &s);
    *out = s;
    return st;
}

static int orders_init(NativeObject *self, PyObject *args, PyObject *kw, const native_kind *kind,
                       int max_order, orders_create create) {
    static char *names[] = {"min_n", "max_n", "max_bytes", NULL};
    int min_n, max_n;
    long long max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiL", names, &min_n, &max_n, &max_bytes)) return -1;
    if (refuse_reinit(self) < 0) return -1;
    void *obj = NULL;
    es_status st = create(min_n, max_n, max_bytes, &obj);
    if (st == ES_E_ARG) {
        PyErr_Format(PyExc_ValueError, "need 1 <= min_n <= max_n <= %d and max_bytes > 0 "
                     "(got min_n=%d, max_n=%d, max_bytes=%lld)", max_order, min_n, max_n, max_bytes);
        return -1;
    }
    return native_adopt(self, kind, st, obj, NULL, NULL);
}

static int Ngram_init(NativeObject *self, PyObject *args, PyObject *kw) {
    return orders_init(self, args, kw, &NGRAM_KIND, ES_MAX_NGRAM, ngram_create_v);
}

static int check_k(long k, const char *name) {
    if (k == -1 && PyErr_Occurred()) return -1;
    if (k >= 0 && k <= ES_MAX_DRAFT) return 0;
    PyErr_Format(PyExc_ValueError, "%s must be in [0, %d] (got %ld)", name, ES_MAX_DRAFT, k);
    return -1;
}

static PyObject *Ngram_propose(NativeObject *self, PyObject *arg) {
    NEED_INIT(self);
    long k = PyLong_AsLong(arg);
    if (check_k(k, "k") < 0) return NULL;
    int32_t out[ES_MAX_DRAFT];
    int32_t n = 0, match = 0;
    lock_acquire(self->lock);
    es_status st = es_ngram_propose(self->obj, (int32_t)k, out, &n, &match);
    PyThread_release_lock(self->lock);
    if (st != ES_OK) return raise_status(st, "NgramIndex.propose");
    PyObject *tup = tuple_of_tokens(out, n);
    if (tup == NULL) return NULL;
    return Py_BuildValue("(Ni)", tup, (int)match);
}

static Py_ssize_t Ngram_len(NativeObject *self) {
    if (self->obj == NULL) return 0;
    lock_acquire(self->lock);
    Py_ssize_t n = (Py_ssize_t)es_ngram_length(self->obj);
    PyThread_release_lock(self->lock);
    return n;
}

#define CHECK_METHOD                                                             \
    {"check", (PyCFunction)(void (*)(void))native_check, METH_VARARGS | METH_KEYWORDS, \
     "check(deep=False): raise IntegrityError if an invariant does not hold."}
#define COMMON_METHODS                                                                \
    {"extend", (PyCFunction)native_extend, METH_O, "extend(tokens): append tokens."}, \
    {"memory_usage", (PyCFunction)native_memory, METH_NOARGS, "Bytes held by the object."}

static PyMethodDef Ngram_methods[] = {
    COMMON_METHODS,
    CHECK_METHOD,
    {"propose", (PyCFunction)Ngram_propose, METH_O,
     "propose(k) -> (tokens, match_n): up to k tokens continuing the stream."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods Ngram_as_seq = {.sq_length = (lenfunc)Ngram_len};

NATIVE_TYPE(NgramType, "NgramIndex",
            "NgramIndex(min_n, max_n, max_bytes): incremental prompt-lookup index.",
            Ngram_methods, NULL, Ngram_init);

/* ------------------------------------------------------------ SuffixTree */

static int Tree_init(NativeObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"max_depth", "max_bytes", NULL};
    int depth;
    long long max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iL", names, &depth, &max_bytes)) return -1;
    if (refuse_reinit(self) < 0) return -1;
    es_stree_config cfg = {depth, max_bytes};
    es_stree *t = NULL;
    es_status st = es_stree_create(&cfg, &t);
    if (st == ES_E_ARG) {
        PyErr_Format(PyExc_ValueError, "need 2 <= max_depth <= %d and max_bytes > 0 "
                     "(got max_depth=%d, max_bytes=%lld)", ES_MAX_DEPTH, depth, max_bytes);
        return -1;
    }
    return native_adopt(self, &TREE_KIND, st, t, NULL, NULL);
}

static es_status tree_begin_v(void *t) { return es_stree_begin(t); }
static es_status tree_end_v(void *t) { return es_stree_end(t); }
static es_status tree_evict_v(void *t) { return es_stree_evict_oldest(t); }

/* begin + extend + end under one lock hold; the first failure is reported,
 * and the sequence is closed whatever happened to the extend. */
static es_status tree_add_v(void *t, const int32_t *tokens, int64_t n) {
    es_status st = es_stree_begin(t);
    if (st != ES_OK) return st;
    st = es_stree_extend(t, tokens, n);
    es_status end = es_stree_end(t);
    return st != ES_OK ? st : end;
}

static PyObject *Tree_begin(NativeObject *self, PyObject *Py_UNUSED(x)) {
    return locked_call(self, tree_begin_v, "SuffixTree.begin");
}
static PyObject *Tree_end(NativeObject *self, PyObject *Py_UNUSED(x)) {
    return locked_call(self, tree_end_v, "SuffixTree.end");
}
static PyObject *Tree_evict(NativeObject *self, PyObject *Py_UNUSED(x)) {
    return locked_call(self, tree_evict_v, "SuffixTree.evict_oldest");
}
static PyObject *Tree_add(NativeObject *self, PyObject *arg) {
    return locked_tokens(self, arg, tree_add_v, "SuffixTree.add");
}

static es_status tree_sequence_v(const void *t, const void *arg, int32_t *buf, int64_t *n) {
    return es_stree_sequence(t, *(const int64_t *)arg, buf, buf ? *n : 0, n);
}

static PyObject *Tree_sequence(NativeObject *self, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    int64_t index = i;
    return locked_export(self, tree_sequence_v, &index, PyExc_IndexError, "sequence index out of range");
}

static int64_t tree_num_sequences_v(const void *t) { return es_stree_num_sequences(t); }
static int64_t tree_num_tokens_v(const void *t) { return es_stree_num_tokens(t); }
static int64_t tree_num_nodes_v(const void *t) { return es_stree_num_nodes(t); }
static int64_t tree_max_depth_v(const void *t) { return es_stree_max_depth(t); }
static const int_getter TREE_SEQS = {tree_num_sequences_v}, TREE_TOKS = {tree_num_tokens_v},
                        TREE_NODES = {tree_num_nodes_v}, TREE_DEPTH = {tree_max_depth_v};

static PyMethodDef Tree_methods[] = {
    COMMON_METHODS,
    CHECK_METHOD,
    {"begin", (PyCFunction)Tree_begin, METH_NOARGS, "Open a new sequence (closing the open one)."},
    {"end", (PyCFunction)Tree_end, METH_NOARGS, "Close the open sequence."},
    {"add", (PyCFunction)Tree_add, METH_O, "add(tokens): begin, extend, end in one call."},
    {"evict_oldest", (PyCFunction)Tree_evict, METH_NOARGS, "Drop the oldest closed sequence."},
    {"sequence", (PyCFunction)Tree_sequence, METH_O,
     "sequence(i) -> bytes: the i-th stored sequence (0 = oldest) as native int32."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Tree_getset[] = {
    {"num_sequences", (getter)native_get_int, NULL, "stored sequences (the open one included)",
     (void *)&TREE_SEQS},
    {"num_tokens", (getter)native_get_int, NULL, "stored tokens", (void *)&TREE_TOKS},
    {"num_nodes", (getter)native_get_int, NULL, "tree nodes, the root included", (void *)&TREE_NODES},
    {"max_depth", (getter)native_get_int, NULL, "suffixes are truncated to this many tokens",
     (void *)&TREE_DEPTH},
    {NULL, NULL, NULL, NULL, NULL}};

NATIVE_TYPE(TreeType, "SuffixTree",
            "SuffixTree(max_depth, max_bytes): depth-bounded suffix tree with counts.",
            Tree_methods, Tree_getset, Tree_init);

/* ---------------------------------------------------------- SuffixCursor */

static int Cursor_init(NativeObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"tree", NULL};
    PyObject *tree;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, &TreeType, &tree)) return -1;
    if (refuse_reinit(self) < 0) return -1;
    NativeObject *to = (NativeObject *)tree;
    if (to->obj == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixTree is not initialised");
        return -1;
    }
    es_cursor *c = NULL;
    lock_acquire(to->lock);
    es_status st = es_cursor_create(to->obj, &c);
    PyThread_release_lock(to->lock);
    /* a cursor reads its tree: every cursor call holds the tree's lock */
    return native_adopt(self, &CURSOR_KIND, st, c, to->lock, tree);
}

static PyObject *Cursor_match_length(NativeObject *self, PyObject *Py_UNUSED(x)) {
    NEED_INIT(self);
    int32_t m = 0;
    lock_acquire(self->lock);
    es_status st = es_cursor_match_length(self->obj, &m);
    PyThread_release_lock(self->lock);
    if (st != ES_OK) return raise_status(st, "SuffixCursor.match_length");
    return PyLong_FromLong(m);
}

static PyObject *Cursor_get_tree(NativeObject *self, void *Py_UNUSED(x)) {
    if (self->owner == NULL) Py_RETURN_NONE;
    Py_INCREF(self->owner);
    return self->owner;
}

static PyMethodDef Cursor_methods[] = {
    COMMON_METHODS,
    {"match_length", (PyCFunction)Cursor_match_length, METH_NOARGS,
     "Longest suffix of the context found in the tree, in tokens."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Cursor_getset[] = {
    {"tree", (getter)Cursor_get_tree, NULL, "the tree this cursor follows", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

NATIVE_TYPE(CursorType, "SuffixCursor",
            "SuffixCursor(tree): follows a context through a tree it does not modify.",
            Cursor_methods, Cursor_getset, Cursor_init);

/* ------------------------------------------------------------ NgramStats */

static int Stats_init(NativeObject *self, PyObject *args, PyObject *kw) {
    return orders_init(self, args, kw, &STATS_KIND, ES_NGSTAT_MAX_N, ngstat_create_v);
}

static es_status stats_begin_v(void *s, const int32_t *t, int64_t n) { return es_ngstat_begin(s, t, n); }
static es_status stats_import_v(void *s, const int32_t *r, int64_t n) {
    if (n % ES_NGSTAT_RECORD != 0) return ES_E_ARG;
    return es_ngstat_import(s, r, n / ES_NGSTAT_RECORD);
}
static es_status stats_decay_v(void *s) { return es_ngstat_decay(s); }

static PyObject *Stats_begin(NativeObject *self, PyObject *arg) {
    return locked_tokens(self, arg, stats_begin_v, "NgramStats.begin");
}
static PyObject *Stats_add_records(NativeObject *self, PyObject *arg) {
    return locked_tokens(self, arg, stats_import_v, "NgramStats.add_records");
}
static PyObject *Stats_decay(NativeObject *self, PyObject *Py_UNUSED(x)) {
    return locked_call(self, stats_decay_v, "NgramStats.decay");
}

static es_status stats_export_v(const void *s, const void *Py_UNUSED(arg), int32_t *buf, int64_t *n) {
    int64_t records = 0;
    es_status st = es_ngstat_export(s, buf, buf ? *n : 0, &records);
    *n = records * ES_NGSTAT_RECORD;
    return st;
}

static PyObject *Stats_records(NativeObject *self, PyObject *Py_UNUSED(x)) {
    return locked_export(self, stats_export_v, NULL, PyExc_ValueError, "NgramStats.records");
}

/* lookup(gram) -> None | (total, best, best_count); count(gram, token) -> int */
static PyObject *Stats_lookup(NativeObject *self, PyObject *args) {
    NEED_INIT(self);
    PyObject *gram;
    int token = -1;
    if (!PyArg_ParseTuple(args, "O|i", &gram, &token)) return NULL;
    tokens_t tb;
    if (tokens_get(gram, &tb) < 0) return NULL;
    if (tb.n < 1 || tb.n > ES_NGSTAT_MAX_N) {
        tokens_release(&tb);
        PyErr_Format(PyExc_ValueError, "an n-gram has 1 to %d tokens (got %zd)", ES_NGSTAT_MAX_N, tb.n);
        return NULL;
    }
    es_ngstat_entry e;
    int found = 0;
    uint32_t count = 0;
    lock_acquire(self->lock);
    es_status st = PyTuple_GET_SIZE(args) > 1
                       ? es_ngstat_count(self->obj, tb.data, (int32_t)tb.n, token, &count)
                       : es_ngstat_lookup(self->obj, tb.data, (int32_t)tb.n, &e, &found);
    PyThread_release_lock(self->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, "NgramStats.lookup");
    if (PyTuple_GET_SIZE(args) > 1) return PyLong_FromUnsignedLong(count);
    if (!found) Py_RETURN_NONE;
    return Py_BuildValue("(kik)", (unsigned long)e.total, (int)e.best, (unsigned long)e.best_count);
}

static PyObject *Stats_top(NativeObject *self, PyObject *args) {
    NEED_INIT(self);
    PyObject *gram;
    int k;
    if (!PyArg_ParseTuple(args, "Oi", &gram, &k)) return NULL;
    if (k < 0 || k > ES_MAX_TREE_CHILDREN) {
        PyErr_Format(PyExc_ValueError, "k must be in [0, %d] (got %d)", ES_MAX_TREE_CHILDREN, k);
        return NULL;
    }
    tokens_t tb;
    if (tokens_get(gram, &tb) < 0) return NULL;
    if (tb.n < 1 || tb.n > ES_NGSTAT_MAX_N) {
        tokens_release(&tb);
        PyErr_Format(PyExc_ValueError, "an n-gram has 1 to %d tokens (got %zd)", ES_NGSTAT_MAX_N, tb.n);
        return NULL;
    }
    int32_t toks[ES_MAX_TREE_CHILDREN];
    uint32_t counts[ES_MAX_TREE_CHILDREN];
    int32_t n = 0;
    uint32_t total = 0;
    lock_acquire(self->lock);
    es_status st = es_ngstat_top(self->obj, tb.data, (int32_t)tb.n, k, toks, counts, &n, &total);
    PyThread_release_lock(self->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, "NgramStats.top");
    PyObject *tt = tuple_of_tokens(toks, n);
    PyObject *ct = tt ? PyTuple_New(n) : NULL;
    for (int32_t i = 0; ct != NULL && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(counts[i]);
        if (v == NULL) Py_CLEAR(ct);
        else PyTuple_SET_ITEM(ct, i, v);
    }
    if (ct == NULL) {
        Py_XDECREF(tt);
        return NULL;
    }
    return Py_BuildValue("(NNk)", tt, ct, (unsigned long)total);
}

static int64_t stats_ngrams_v(const void *s) { return es_ngstat_num_ngrams(s); }
static int64_t stats_pairs_v(const void *s) { return es_ngstat_num_pairs(s); }
static int64_t stats_decays_v(const void *s) { return es_ngstat_decays(s); }
static const int_getter STATS_NGRAMS = {stats_ngrams_v}, STATS_PAIRS = {stats_pairs_v},
                        STATS_DECAYS = {stats_decays_v};

static PyMethodDef Stats_methods[] = {
    COMMON_METHODS,
    CHECK_METHOD,
    {"begin", (PyCFunction)Stats_begin, METH_O,
     "begin(context): start a new sequence continuing context (not counted)."},
    {"top", (PyCFunction)Stats_top, METH_VARARGS,
     "top(gram, k) -> (tokens, counts, total): the k most frequent continuations, most "
     "frequent first (ties: the lowest token); total is the n-gram's samples."},
    {"lookup", (PyCFunction)Stats_lookup, METH_VARARGS,
     "lookup(gram) -> None | (total, best, best_count); lookup(gram, token) -> count."},
    {"records", (PyCFunction)Stats_records, METH_NOARGS,
     "records() -> bytes: every count as RECORD native int32s (order, token, count, gram...)."},
    {"add_records", (PyCFunction)Stats_add_records, METH_O,
     "add_records(int32 buffer): add exported records (all validated first)."},
    {"decay", (PyCFunction)Stats_decay, METH_NOARGS, "Halve every count, forget the zeros."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Stats_getset[] = {
    {"num_ngrams", (getter)native_get_int, NULL, "distinct n-grams counted", (void *)&STATS_NGRAMS},
    {"num_pairs", (getter)native_get_int, NULL, "distinct (n-gram, continuation) counts",
     (void *)&STATS_PAIRS},
    {"decays", (getter)native_get_int, NULL, "decays the byte budget forced", (void *)&STATS_DECAYS},
    {NULL, NULL, NULL, NULL, NULL}};

NATIVE_TYPE(StatsType, "NgramStats",
            "NgramStats(min_n, max_n, max_bytes): continuation counts of n-grams.",
            Stats_methods, Stats_getset, Stats_init);

/* ------------------------------------------------------ module functions */

/* *out = the NativeObject of `type` in obj, or NULL for None; -1 on a type error. */
static int optional_native(PyObject *obj, PyTypeObject *type, const char *what, NativeObject **out) {
    *out = NULL;
    if (obj == Py_None) return 0;
    if (!PyObject_TypeCheck(obj, type)) {
        PyErr_Format(PyExc_TypeError, "%s must be a %s or None", what, type->tp_name);
        return -1;
    }
    *out = (NativeObject *)obj;
    if ((*out)->obj != NULL) return 0;
    PyErr_Format(PyExc_RuntimeError, "%s is not initialised", type->tp_name);
    return -1;
}

static PyObject *py_speculate(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw) {
    static char *names[] = {"request", "cursor", "max_tokens", "factor", "offset", "min_prob", NULL};
    PyObject *req_obj, *cur_obj;
    int max_tokens;
    double factor, offset, min_prob;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiddd", names, &req_obj, &cur_obj, &max_tokens,
                                     &factor, &offset, &min_prob))
        return NULL;
    NativeObject *req, *cur;
    if (optional_native(req_obj, &TreeType, "request", &req) < 0 ||
        optional_native(cur_obj, &CursorType, "cursor", &cur) < 0 ||
        check_k(max_tokens, "max_tokens") < 0)
        return NULL;
    es_spec_params p = {max_tokens, factor, offset, min_prob};
    int32_t toks[ES_MAX_DRAFT];
    double probs[ES_MAX_DRAFT];
    es_draft d = {toks, probs, 0, 0, 0.0, ES_SRC_NONE};
    PyThread_type_lock held[2];
    lock_two(req ? req->lock : NULL, cur ? cur->lock : NULL, held);
    es_status st = es_speculate(req ? req->obj : NULL, cur ? cur->obj : NULL, &p, &d);
    unlock_two(held);
    if (st == ES_E_ARG) {
        PyErr_SetString(PyExc_ValueError,
                        "speculation parameters out of range: need a finite factor >= 0, "
                        "a finite offset and 0 <= min_prob <= 1");
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, "speculate");
    return draft_result(&d);
}

static PyObject *py_speculate_tree(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw) {
    static char *names[] = {"request", "cursor", "max_tokens", "factor", "offset", "min_prob",
                            "max_children", NULL};
    PyObject *req_obj, *cur_obj;
    int max_tokens, max_children;
    double factor, offset, min_prob;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOidddi", names, &req_obj, &cur_obj, &max_tokens,
                                     &factor, &offset, &min_prob, &max_children))
        return NULL;
    NativeObject *req, *cur;
    if (optional_native(req_obj, &TreeType, "request", &req) < 0 ||
        optional_native(cur_obj, &CursorType, "cursor", &cur) < 0 ||
        check_k(max_tokens, "max_tokens") < 0)
        return NULL;
    if (max_children < 1 || max_children > ES_MAX_TREE_CHILDREN) {
        PyErr_Format(PyExc_ValueError, "max_children must be in [1, %d] (got %d)",
                     ES_MAX_TREE_CHILDREN, max_children);
        return NULL;
    }
    es_spec_params p = {max_tokens, factor, offset, min_prob};
    int32_t toks[ES_MAX_DRAFT], parents[ES_MAX_DRAFT];
    double probs[ES_MAX_DRAFT];
    es_tree_draft d = {toks, parents, probs, 0, 0, 0.0, ES_SRC_NONE};
    PyThread_type_lock held[2];
    lock_two(req ? req->lock : NULL, cur ? cur->lock : NULL, held);
    es_status st = es_speculate_tree(req ? req->obj : NULL, cur ? cur->obj : NULL, &p,
                                     max_children, &d);
    unlock_two(held);
    if (st == ES_E_ARG) {
        PyErr_SetString(PyExc_ValueError,
                        "speculation parameters out of range: need a finite factor >= 0, "
                        "a finite offset and 0 <= min_prob <= 1");
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, "speculate_tree");
    PyObject *tt = tuple_of_tokens(d.tokens, d.n);
    PyObject *pa = tt ? tuple_of_tokens(d.parents, d.n) : NULL;
    PyObject *pt = pa ? PyTuple_New(d.n) : NULL;
    for (int32_t i = 0; pt != NULL && i < d.n; i++) {
        PyObject *f = PyFloat_FromDouble(d.probs[i]);
        if (f == NULL) Py_CLEAR(pt);
        else PyTuple_SET_ITEM(pt, i, f);
    }
    if (pt == NULL) {
        Py_XDECREF(tt);
        Py_XDECREF(pa);
        return NULL;
    }
    return Py_BuildValue("(NNNidi)", tt, pa, pt, (int)d.match_len, d.score, (int)d.source);
}

/* Fills out[0..cap) from a sequence of up to cap numbers; the last one given
 * holds for the rest. is_int: read ints into int32_t, else floats into double. */
static int fill_numbers(PyObject *obj, void *out, int cap, int is_int, const char *what) {
    PyObject *seq = PySequence_Fast(obj, "expected a sequence of numbers");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > cap) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s needs 1 to %d values (got %zd)", what, cap, n);
        return -1;
    }
    for (int i = 0; i < cap; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i < n ? i : n - 1);
        if (is_int) {
            long v = PyLong_AsLong(item);
            if (v == -1 && PyErr_Occurred()) break;
            ((int32_t *)out)[i] = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
        } else {
            double v = PyFloat_AsDouble(item);
            if (v == -1.0 && PyErr_Occurred()) break;
            ((double *)out)[i] = v;
        }
    }
    Py_DECREF(seq);
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *py_ngram_params(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw) {
    static char *names[] = {"order_extra", "context_counts", "context_shares", "dynamic_counts",
                            "dynamic_shares", NULL};
    PyObject *extra, *cc, *cs, *dc, *ds;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO", names, &extra, &cc, &cs, &dc, &ds))
        return NULL;
    es_ngstat_params p;
    memset(&p, 0, sizeof p);
    if (fill_numbers(extra, p.order_extra, ES_NGSTAT_MAX_N + 1, 1, "order_extra") < 0 ||
        fill_numbers(cc, p.context.min_count, ES_NGSTAT_POSITIONS, 1, "context_counts") < 0 ||
        fill_numbers(cs, p.context.min_share, ES_NGSTAT_POSITIONS, 0, "context_shares") < 0 ||
        fill_numbers(dc, p.dynamic.min_count, ES_NGSTAT_POSITIONS, 1, "dynamic_counts") < 0 ||
        fill_numbers(ds, p.dynamic.min_share, ES_NGSTAT_POSITIONS, 0, "dynamic_shares") < 0)
        return NULL;
    if (es_ngstat_params_check(&p) != ES_OK) {
        PyErr_Format(PyExc_ValueError, "n-gram draft thresholds out of range: counts in [1, %d], "
                     "order extras in [0, %d], shares in [0, 1]", ES_NGSTAT_COUNT_MAX, ES_NGSTAT_COUNT_MAX);
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)&p, sizeof p);
}

static PyObject *py_ngram_draft(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "ngram_draft(context, dynamic, max_tokens, params)");
        return NULL;
    }
    NativeObject *ctx, *dyn;
    if (optional_native(args[0], &StatsType, "context", &ctx) < 0 ||
        optional_native(args[1], &StatsType, "dynamic", &dyn) < 0)
        return NULL;
    long k = PyLong_AsLong(args[2]);
    if (check_k(k, "max_tokens") < 0) return NULL;
    es_ngstat_params p;
    if (!PyBytes_Check(args[3]) || PyBytes_GET_SIZE(args[3]) != (Py_ssize_t)sizeof p) {
        PyErr_SetString(PyExc_TypeError, "params must come from ngram_params()");
        return NULL;
    }
    memcpy(&p, PyBytes_AS_STRING(args[3]), sizeof p);
    p.max_tokens = (int32_t)k;
    int32_t toks[ES_MAX_DRAFT];
    double probs[ES_MAX_DRAFT];
    es_draft d = {toks, probs, 0, 0, 0.0, ES_SRC_NONE};
    PyThread_type_lock held[2];
    lock_two(ctx ? ctx->lock : NULL, dyn ? dyn->lock : NULL, held);
    es_status st = es_ngstat_draft(ctx ? ctx->obj : NULL, dyn ? dyn->obj : NULL, &p, &d);
    unlock_two(held);
    if (st != ES_OK) return raise_status(st, "ngram_draft");
    return draft_result(&d);
}

static PyObject *py_fail_alloc_after(PyObject *Py_UNUSED(mod), PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    es_debug_fail_alloc_after(n);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"speculate", (PyCFunction)(void (*)(void))py_speculate, METH_VARARGS | METH_KEYWORDS,
     "speculate(request, cursor, max_tokens, factor, offset, min_prob)\n"
     "-> (tokens, probs, match_len, score, source); source 0 none, 1 request, 2 global."},
    {"speculate_tree", (PyCFunction)(void (*)(void))py_speculate_tree, METH_VARARGS | METH_KEYWORDS,
     "speculate_tree(request, cursor, max_tokens, factor, offset, min_prob, max_children)\n"
     "-> (tokens, parents, path_probs, match_len, score, source): the most probable continuations "
     "as a tree, parents before children."},
    {"ngram_params", (PyCFunction)(void (*)(void))py_ngram_params, METH_VARARGS | METH_KEYWORDS,
     "ngram_params(order_extra, context_counts, context_shares, dynamic_counts, dynamic_shares)\n"
     "-> bytes: validated draft thresholds for ngram_draft (the last value of each list holds "
     "for later positions / orders)."},
    {"ngram_draft", (PyCFunction)(void (*)(void))py_ngram_draft, METH_FASTCALL,
     "ngram_draft(context, dynamic, max_tokens, params)\n"
     "-> (tokens, shares, match_len, score, source); source 0 none, 3 context, 4 dynamic."},
    {"_fail_alloc_after", (PyCFunction)py_fail_alloc_after, METH_O,
     "Test hook: make the n-th native allocation from now fail (-1: never)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "edgespec._native",
    "Native proposers: prompt-lookup n-gram index, n-gram statistics and suffix trees.", -1,
    module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    NgramType.tp_as_sequence = &Ngram_as_seq;
    if (PyType_Ready(&NgramType) < 0 || PyType_Ready(&TreeType) < 0 || PyType_Ready(&CursorType) < 0 ||
        PyType_Ready(&StatsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    CapacityError = PyErr_NewExceptionWithDoc(
        "edgespec._native.CapacityError",
        "The object's memory budget (max_bytes) is exhausted.", PyExc_MemoryError, NULL);
    IntegrityError = PyErr_NewExceptionWithDoc(
        "edgespec._native.IntegrityError", "An integrity check failed.", PyExc_RuntimeError, NULL);
    StateError = PyErr_NewExceptionWithDoc(
        "edgespec._native.StateError", "The call does not fit the object's state.",
        PyExc_RuntimeError, NULL);
    if (!CapacityError || !IntegrityError || !StateError ||
        PyModule_AddObjectRef(m, "CapacityError", CapacityError) < 0 ||
        PyModule_AddObjectRef(m, "IntegrityError", IntegrityError) < 0 ||
        PyModule_AddObjectRef(m, "StateError", StateError) < 0 ||
        PyModule_AddObjectRef(m, "NgramIndex", (PyObject *)&NgramType) < 0 ||
        PyModule_AddObjectRef(m, "SuffixTree", (PyObject *)&TreeType) < 0 ||
        PyModule_AddObjectRef(m, "SuffixCursor", (PyObject *)&CursorType) < 0 ||
        PyModule_AddObjectRef(m, "NgramStats", (PyObject *)&StatsType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DRAFT", ES_MAX_DRAFT) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NGRAM", ES_MAX_NGRAM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", ES_MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(m, "NGSTAT_MAX_N", ES_NGSTAT_MAX_N) < 0 ||
        PyModule_AddIntConstant(m, "NGSTAT_POSITIONS", ES_NGSTAT_POSITIONS) < 0 ||
        PyModule_AddIntConstant(m, "NGSTAT_RECORD", ES_NGSTAT_RECORD) < 0 ||
        PyModule_AddIntConstant(m, "NGSTAT_COUNT_MAX", ES_NGSTAT_COUNT_MAX) < 0 ||
        PyModule_AddIntConstant(m, "MAX_TREE_CHILDREN", ES_MAX_TREE_CHILDREN) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
