/* edgespec._native: the thin CPython binding over the native proposers.
 *
 * Token inputs are validated here (1-D, int32, contiguous buffers go through
 * zero-copy; lists and tuples of ints are copied with range checks); the C
 * library re-checks ranges and reports status codes, which become exceptions.
 * Calls on large inputs release the GIL; each object carries a lock so that a
 * call without the GIL never races another call on the same object. */
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

/* ------------------------------------------------------------ NgramIndex */

typedef struct {
    PyObject_HEAD
    es_ngram *ix;
    PyThread_type_lock lock;
} NgramObject;

static int Ngram_init(NgramObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"min_n", "max_n", "max_bytes", NULL};
    int min_n, max_n;
    long long max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiL", names, &min_n, &max_n, &max_bytes)) return -1;
    if (self->ix != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "NgramIndex is already initialised");
        return -1;
    }
    es_ngram_config cfg = {min_n, max_n, max_bytes};
    es_status st = es_ngram_create(&cfg, &self->ix);
    if (st == ES_E_ARG) {
        PyErr_Format(PyExc_ValueError, "need 1 <= min_n <= max_n <= %d and max_bytes > 0 "
                     "(got min_n=%d, max_n=%d, max_bytes=%lld)", ES_MAX_NGRAM, min_n, max_n, max_bytes);
        return -1;
    }
    if (st != ES_OK) return raise_status(st, "NgramIndex"), -1;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Ngram_dealloc(NgramObject *self) {
    es_ngram_destroy(self->ix);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NEED_INIT(obj, field, name)                                          \
    if ((obj)->field == NULL) {                                              \
        PyErr_SetString(PyExc_RuntimeError, name " is not initialised");     \
        return NULL;                                                         \
    }

static PyObject *Ngram_extend(NgramObject *self, PyObject *arg) {
    NEED_INIT(self, ix, "NgramIndex");
    tokens_t tb;
    if (tokens_get(arg, &tb) < 0) return NULL;
    es_status st;
    lock_acquire(self->lock);
    if (tb.n >= GIL_RELEASE_TOKENS) {
        Py_BEGIN_ALLOW_THREADS
        st = es_ngram_extend(self->ix, tb.data, tb.n);
        Py_END_ALLOW_THREADS
    } else {
        st = es_ngram_extend(self->ix, tb.data, tb.n);
    }
    PyThread_release_lock(self->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, "NgramIndex.extend");
    Py_RETURN_NONE;
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

static PyObject *Ngram_propose(NgramObject *self, PyObject *arg) {
    NEED_INIT(self, ix, "NgramIndex");
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (k < 0 || k > ES_MAX_DRAFT) {
        PyErr_Format(PyExc_ValueError, "k must be in [0, %d] (got %ld)", ES_MAX_DRAFT, k);
        return NULL;
    }
    int32_t out[ES_MAX_DRAFT];
    int32_t n = 0, match = 0;
    lock_acquire(self->lock);
    es_status st = es_ngram_propose(self->ix, (int32_t)k, out, &n, &match);
    PyThread_release_lock(self->lock);
    if (st != ES_OK) return raise_status(st, "NgramIndex.propose");
    PyObject *tup = tuple_of_tokens(out, n);
    if (tup == NULL) return NULL;
    return Py_BuildValue("(Ni)", tup, (int)match);
}

static Py_ssize_t Ngram_len(NgramObject *self) {
    if (self->ix == NULL) return 0;
    lock_acquire(self->lock);
    Py_ssize_t n = (Py_ssize_t)es_ngram_length(self->ix);
    PyThread_release_lock(self->lock);
    return n;
}

static PyObject *Ngram_memory(NgramObject *self, PyObject *Py_UNUSED(ignored)) {
    NEED_INIT(self, ix, "NgramIndex");
    lock_acquire(self->lock);
    size_t b = es_ngram_memory(self->ix);
    PyThread_release_lock(self->lock);
    return PyLong_FromSize_t(b);
}

static PyObject *Ngram_check(NgramObject *self, PyObject *args, PyObject *kw) {
    NEED_INIT(self, ix, "NgramIndex");
    static char *names[] = {"deep", NULL};
    int deep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, &deep)) return NULL;
    char msg[256] = "";
    es_status st;
    lock_acquire(self->lock);
    Py_BEGIN_ALLOW_THREADS
    st = es_ngram_check(self->ix, deep, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    PyThread_release_lock(self->lock);
    if (st == ES_E_CORRUPT) {
        PyErr_Format(IntegrityError, "NgramIndex: %s", msg);
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, "NgramIndex.check");
    Py_RETURN_NONE;
}

static PyMethodDef Ngram_methods[] = {
    {"extend", (PyCFunction)Ngram_extend, METH_O, "extend(tokens): append tokens to the stream."},
    {"propose", (PyCFunction)Ngram_propose, METH_O,
     "propose(k) -> (tokens, match_n): up to k tokens continuing the stream."},
    {"memory_usage", (PyCFunction)Ngram_memory, METH_NOARGS, "Bytes held by the index."},
    {"check", (PyCFunction)(void (*)(void))Ngram_check, METH_VARARGS | METH_KEYWORDS,
     "check(deep=False): raise IntegrityError if an invariant does not hold."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods Ngram_as_seq = {.sq_length = (lenfunc)Ngram_len};

static PyTypeObject NgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edgespec._native.NgramIndex",
    .tp_basicsize = sizeof(NgramObject),
    .tp_dealloc = (destructor)Ngram_dealloc,
    .tp_as_sequence = &Ngram_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NgramIndex(min_n, max_n, max_bytes): incremental prompt-lookup index.",
    .tp_methods = Ngram_methods,
    .tp_init = (initproc)Ngram_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------ SuffixTree */

typedef struct {
    PyObject_HEAD
    es_stree *t;
    PyThread_type_lock lock;
} TreeObject;

static int Tree_init(TreeObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"max_depth", "max_bytes", NULL};
    int depth;
    long long max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iL", names, &depth, &max_bytes)) return -1;
    if (self->t != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixTree is already initialised");
        return -1;
    }
    es_stree_config cfg = {depth, max_bytes};
    es_status st = es_stree_create(&cfg, &self->t);
    if (st == ES_E_ARG) {
        PyErr_Format(PyExc_ValueError, "need 2 <= max_depth <= %d and max_bytes > 0 "
                     "(got max_depth=%d, max_bytes=%lld)", ES_MAX_DEPTH, depth, max_bytes);
        return -1;
    }
    if (st != ES_OK) return raise_status(st, "SuffixTree"), -1;
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Tree_dealloc(TreeObject *self) {
    es_stree_destroy(self->t);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Tree_simple(TreeObject *self, es_status (*fn)(es_stree *), const char *what) {
    NEED_INIT(self, t, "SuffixTree");
    lock_acquire(self->lock);
    es_status st = fn(self->t);
    PyThread_release_lock(self->lock);
    if (st != ES_OK) return raise_status(st, what);
    Py_RETURN_NONE;
}

static PyObject *Tree_begin(TreeObject *self, PyObject *Py_UNUSED(x)) {
    return Tree_simple(self, es_stree_begin, "SuffixTree.begin");
}
static PyObject *Tree_end(TreeObject *self, PyObject *Py_UNUSED(x)) {
    return Tree_simple(self, es_stree_end, "SuffixTree.end");
}
static PyObject *Tree_evict(TreeObject *self, PyObject *Py_UNUSED(x)) {
    return Tree_simple(self, es_stree_evict_oldest, "SuffixTree.evict_oldest");
}

/* extend (add = 0) or begin + extend + end (add = 1) under one lock hold */
static PyObject *Tree_append(TreeObject *self, PyObject *arg, int add, const char *what) {
    NEED_INIT(self, t, "SuffixTree");
    tokens_t tb;
    if (tokens_get(arg, &tb) < 0) return NULL;
    es_status st = ES_OK;
    lock_acquire(self->lock);
    if (add) st = es_stree_begin(self->t);
    if (st == ES_OK) {
        if (tb.n >= GIL_RELEASE_TOKENS) {
            Py_BEGIN_ALLOW_THREADS
            st = es_stree_extend(self->t, tb.data, tb.n);
            Py_END_ALLOW_THREADS
        } else {
            st = es_stree_extend(self->t, tb.data, tb.n);
        }
        if (add) es_stree_end(self->t);
    }
    PyThread_release_lock(self->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, what);
    Py_RETURN_NONE;
}

static PyObject *Tree_extend(TreeObject *self, PyObject *arg) {
    return Tree_append(self, arg, 0, "SuffixTree.extend");
}
static PyObject *Tree_add(TreeObject *self, PyObject *arg) {
    return Tree_append(self, arg, 1, "SuffixTree.add");
}

static PyObject *Tree_sequence(TreeObject *self, PyObject *arg) {
    NEED_INIT(self, t, "SuffixTree");
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    lock_acquire(self->lock);
    int64_t len = 0;
    es_status st = es_stree_sequence(self->t, i, NULL, 0, &len);
    PyObject *out = NULL;
    if (st == ES_OK) {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len * 4);
        if (out != NULL) st = es_stree_sequence(self->t, i, (int32_t *)PyBytes_AS_STRING(out), len, &len);
    }
    PyThread_release_lock(self->lock);
    if (st != ES_OK) {
        Py_XDECREF(out);
        if (st == ES_E_ARG) {
            PyErr_Format(PyExc_IndexError, "sequence index %zd out of range", i);
            return NULL;
        }
        return raise_status(st, "SuffixTree.sequence");
    }
    return out;
}

static PyObject *Tree_memory(TreeObject *self, PyObject *Py_UNUSED(x)) {
    NEED_INIT(self, t, "SuffixTree");
    lock_acquire(self->lock);
    size_t b = es_stree_memory(self->t);
    PyThread_release_lock(self->lock);
    return PyLong_FromSize_t(b);
}

static PyObject *Tree_check(TreeObject *self, PyObject *args, PyObject *kw) {
    NEED_INIT(self, t, "SuffixTree");
    static char *names[] = {"deep", NULL};
    int deep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", names, &deep)) return NULL;
    char msg[256] = "";
    es_status st;
    lock_acquire(self->lock);
    Py_BEGIN_ALLOW_THREADS
    st = es_stree_check(self->t, deep, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    PyThread_release_lock(self->lock);
    if (st == ES_E_CORRUPT) {
        PyErr_Format(IntegrityError, "SuffixTree: %s", msg);
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, "SuffixTree.check");
    Py_RETURN_NONE;
}

static PyObject *Tree_get_int(TreeObject *self, void *which) {
    NEED_INIT(self, t, "SuffixTree");
    lock_acquire(self->lock);
    int64_t v;
    switch ((int)(intptr_t)which) {
    case 0: v = es_stree_num_sequences(self->t); break;
    case 1: v = es_stree_num_tokens(self->t); break;
    case 2: v = es_stree_num_nodes(self->t); break;
    default: v = es_stree_max_depth(self->t); break;
    }
    PyThread_release_lock(self->lock);
    return PyLong_FromLongLong(v);
}

static PyMethodDef Tree_methods[] = {
    {"begin", (PyCFunction)Tree_begin, METH_NOARGS, "Open a new sequence (closing the open one)."},
    {"extend", (PyCFunction)Tree_extend, METH_O, "extend(tokens): append to the open sequence."},
    {"end", (PyCFunction)Tree_end, METH_NOARGS, "Close the open sequence."},
    {"add", (PyCFunction)Tree_add, METH_O, "add(tokens): begin, extend, end in one call."},
    {"evict_oldest", (PyCFunction)Tree_evict, METH_NOARGS, "Drop the oldest closed sequence."},
    {"sequence", (PyCFunction)Tree_sequence, METH_O,
     "sequence(i) -> bytes: the i-th stored sequence (0 = oldest) as native int32."},
    {"memory_usage", (PyCFunction)Tree_memory, METH_NOARGS, "Bytes held by the tree."},
    {"check", (PyCFunction)(void (*)(void))Tree_check, METH_VARARGS | METH_KEYWORDS,
     "check(deep=False): raise IntegrityError if an invariant does not hold."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Tree_getset[] = {
    {"num_sequences", (getter)Tree_get_int, NULL, "stored sequences (the open one included)", (void *)0},
    {"num_tokens", (getter)Tree_get_int, NULL, "stored tokens", (void *)1},
    {"num_nodes", (getter)Tree_get_int, NULL, "tree nodes, the root included", (void *)2},
    {"max_depth", (getter)Tree_get_int, NULL, "suffixes are truncated to this many tokens", (void *)3},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edgespec._native.SuffixTree",
    .tp_basicsize = sizeof(TreeObject),
    .tp_dealloc = (destructor)Tree_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SuffixTree(max_depth, max_bytes): depth-bounded suffix tree with counts.",
    .tp_methods = Tree_methods,
    .tp_getset = Tree_getset,
    .tp_init = (initproc)Tree_init,
    .tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------- SuffixCursor */

typedef struct {
    PyObject_HEAD
    es_cursor *c;
    TreeObject *tree;  /* strong reference: the tree outlives the cursor */
} CursorObject;

static int Cursor_init(CursorObject *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"tree", NULL};
    PyObject *tree;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!", names, &TreeType, &tree)) return -1;
    if (self->c != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixCursor is already initialised");
        return -1;
    }
    TreeObject *to = (TreeObject *)tree;
    if (to->t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SuffixTree is not initialised");
        return -1;
    }
    lock_acquire(to->lock);
    es_status st = es_cursor_create(to->t, &self->c);
    PyThread_release_lock(to->lock);
    if (st != ES_OK) return raise_status(st, "SuffixCursor"), -1;
    Py_INCREF(tree);
    self->tree = to;
    return 0;
}

static void Cursor_dealloc(CursorObject *self) {
    es_cursor_destroy(self->c);
    Py_XDECREF(self->tree);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A cursor reads its tree: every cursor call holds the tree's lock. */
static PyObject *Cursor_extend(CursorObject *self, PyObject *arg) {
    NEED_INIT(self, c, "SuffixCursor");
    tokens_t tb;
    if (tokens_get(arg, &tb) < 0) return NULL;
    lock_acquire(self->tree->lock);
    es_status st = es_cursor_extend(self->c, tb.data, tb.n);
    PyThread_release_lock(self->tree->lock);
    tokens_release(&tb);
    if (st != ES_OK) return raise_status(st, "SuffixCursor.extend");
    Py_RETURN_NONE;
}

static PyObject *Cursor_match_length(CursorObject *self, PyObject *Py_UNUSED(x)) {
    NEED_INIT(self, c, "SuffixCursor");
    int32_t m = 0;
    lock_acquire(self->tree->lock);
    es_status st = es_cursor_match_length(self->c, &m);
    PyThread_release_lock(self->tree->lock);
    if (st != ES_OK) return raise_status(st, "SuffixCursor.match_length");
    return PyLong_FromLong(m);
}

static PyObject *Cursor_memory(CursorObject *self, PyObject *Py_UNUSED(x)) {
    NEED_INIT(self, c, "SuffixCursor");
    return PyLong_FromSize_t(es_cursor_memory(self->c));
}

static PyObject *Cursor_get_tree(CursorObject *self, void *Py_UNUSED(x)) {
    if (self->tree == NULL) Py_RETURN_NONE;
    Py_INCREF(self->tree);
    return (PyObject *)self->tree;
}

static PyMethodDef Cursor_methods[] = {
    {"extend", (PyCFunction)Cursor_extend, METH_O, "extend(tokens): append to the followed context."},
    {"match_length", (PyCFunction)Cursor_match_length, METH_NOARGS,
     "Longest suffix of the context found in the tree, in tokens."},
    {"memory_usage", (PyCFunction)Cursor_memory, METH_NOARGS, "Bytes held by the cursor."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Cursor_getset[] = {
    {"tree", (getter)Cursor_get_tree, NULL, "the tree this cursor follows", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject CursorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edgespec._native.SuffixCursor",
    .tp_basicsize = sizeof(CursorObject),
    .tp_dealloc = (destructor)Cursor_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SuffixCursor(tree): follows a context through a tree it does not modify.",
    .tp_methods = Cursor_methods,
    .tp_getset = Cursor_getset,
    .tp_init = (initproc)Cursor_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------- speculate */

static PyObject *py_speculate(PyObject *Py_UNUSED(mod), PyObject *args, PyObject *kw) {
    static char *names[] = {"request", "cursor", "max_tokens", "factor", "offset", "min_prob", NULL};
    PyObject *req_obj, *cur_obj;
    int max_tokens;
    double factor, offset, min_prob;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOiddd", names, &req_obj, &cur_obj, &max_tokens,
                                     &factor, &offset, &min_prob))
        return NULL;
    TreeObject *req = NULL;
    CursorObject *cur = NULL;
    if (req_obj != Py_None) {
        if (!PyObject_TypeCheck(req_obj, &TreeType)) {
            PyErr_SetString(PyExc_TypeError, "request must be a SuffixTree or None");
            return NULL;
        }
        req = (TreeObject *)req_obj;
        NEED_INIT(req, t, "SuffixTree");
    }
    if (cur_obj != Py_None) {
        if (!PyObject_TypeCheck(cur_obj, &CursorType)) {
            PyErr_SetString(PyExc_TypeError, "cursor must be a SuffixCursor or None");
            return NULL;
        }
        cur = (CursorObject *)cur_obj;
        NEED_INIT(cur, c, "SuffixCursor");
    }
    if (max_tokens < 0 || max_tokens > ES_MAX_DRAFT) {
        PyErr_Format(PyExc_ValueError, "max_tokens must be in [0, %d] (got %d)", ES_MAX_DRAFT, max_tokens);
        return NULL;
    }
    es_spec_params p = {max_tokens, factor, offset, min_prob};
    int32_t toks[ES_MAX_DRAFT];
    double probs[ES_MAX_DRAFT];
    es_draft d = {toks, probs, 0, 0, 0.0, ES_SRC_NONE};
    /* lock both trees in address order so two callers cannot deadlock */
    PyThread_type_lock a = req ? req->lock : NULL;
    PyThread_type_lock b = cur ? cur->tree->lock : NULL;
    if (a == b) b = NULL;
    if (a && b && (uintptr_t)a > (uintptr_t)b) {
        PyThread_type_lock x = a;
        a = b;
        b = x;
    }
    if (a) lock_acquire(a);
    if (b) lock_acquire(b);
    es_status st = es_speculate(req ? req->t : NULL, cur ? cur->c : NULL, &p, &d);
    if (b) PyThread_release_lock(b);
    if (a) PyThread_release_lock(a);
    if (st == ES_E_ARG) {
        PyErr_SetString(PyExc_ValueError,
                        "speculation parameters out of range: need a finite factor >= 0, "
                        "a finite offset and 0 <= min_prob <= 1");
        return NULL;
    }
    if (st != ES_OK) return raise_status(st, "speculate");
    PyObject *tt = tuple_of_tokens(toks, d.n);
    if (tt == NULL) return NULL;
    PyObject *pt = PyTuple_New(d.n);
    if (pt == NULL) {
        Py_DECREF(tt);
        return NULL;
    }
    for (int32_t i = 0; i < d.n; i++) {
        PyObject *f = PyFloat_FromDouble(probs[i]);
        if (f == NULL) {
            Py_DECREF(tt);
            Py_DECREF(pt);
            return NULL;
        }
        PyTuple_SET_ITEM(pt, i, f);
    }
    return Py_BuildValue("(NNidi)", tt, pt, (int)d.match_len, d.score, (int)d.source);
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
    {"_fail_alloc_after", (PyCFunction)py_fail_alloc_after, METH_O,
     "Test hook: make the n-th native allocation from now fail (-1: never)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "edgespec._native",
    "Native proposers: prompt-lookup n-gram index and suffix trees.", -1, module_methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&NgramType) < 0 || PyType_Ready(&TreeType) < 0 || PyType_Ready(&CursorType) < 0)
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
        PyModule_AddIntConstant(m, "MAX_DRAFT", ES_MAX_DRAFT) < 0 ||
        PyModule_AddIntConstant(m, "MAX_NGRAM", ES_MAX_NGRAM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH", ES_MAX_DEPTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
