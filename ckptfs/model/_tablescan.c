/* The plain state_dict pickle as columns, read straight from the pickle's bytes.
 *
 * ckptfs.model.table recognises the commonest checkpoint (a dict or OrderedDict of str keys to plain
 * _rebuild_tensor_v2 calls and plain values) in an unpickled object graph. This module recognises the same
 * form in the pickle itself: a small pickle machine that knows only the opcodes torch.save writes and the
 * globals such a state_dict names (collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch's
 * storage classes), and keeps tensors as rows of C columns instead of Python objects. Anything else --
 * another opcode, another global, a value of another kind where a tensor's argument must be -- declines
 * (returns None) and the caller takes the general path: the safe unpickler, in its probe.
 *
 * What it accepts, it accepts exactly as the general path would (tests/test_table.py checks the two
 * against each other on every fixture and on mutated pickles): an accepted pickle is one the C unpickler
 * also loads without error, to a graph that table.tabulate turns into the same columns.
 *
 * Safety: every read is bounds-checked; nothing is hashed but str/bytes/int/float/None/bool keys and
 * tuples of bounded depth; every structure grows with the pickle's own length and is charged to a
 * budget (the caller's Limits.max_memory); the root state is copied out with a depth limit and a node
 * budget. So a hostile pickle can make it decline, never crash, hang or exhaust memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum kind {
    K_NONE, K_TRUE, K_FALSE, K_INT, K_BIGINT, K_FLOAT, K_STR, K_BYTES, K_TUPLE,
    K_LIST, K_DICT, K_ODICT,  /* containers: x is the container's number (see box) */
    K_GLOBAL,                 /* x: G_ODICT, G_V2 or a storage class's code (>= 0) */
    K_PERSID,                 /* x: where the persistent id's value is kept (the tuple arena) */
    K_TENSOR,                 /* x: the tensor's number (-1: a call the columns cannot hold) */
    K_FWD,                    /* in the arena, while collecting: moved to x */
};
#define G_ODICT (-1)
#define G_V2 (-2)

typedef struct {
    uint64_t kind : 8;
    uint64_t y : 56;  /* a length */
    int64_t x;        /* an int's value, a float's bits, an offset into the pickle, an arena start, a number */
} Val;

/* A set of byte strings (or int64 sequences, as bytes), numbered by first insertion. A slot keeps its item's
 * hash beside the number, so a probe reads the item only when the hashes are equal. */
typedef struct {
    uint64_t hash;
    Py_ssize_t id;        /* number + 1, or 0: free */
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t cap, n;
    const char **base;    /* items are offsets into *base (which may move) */
    Py_ssize_t *off, *len;
    Py_ssize_t items_cap;
} Set;

typedef struct {
    int kind;             /* K_LIST, K_DICT, K_ODICT */
    Val *items;           /* lists: values; dicts: key, value, key, value ... */
    Py_ssize_t n, cap;    /* Vals in items */
    Set strs;             /* dicts: str keys (their UTF-8 in the pickle) -> set number ... */
    Py_ssize_t *str_entry, str_entry_cap;  /* ... -> entry number */
    PyObject *index;      /* dicts: other keys (as Python objects) -> entry number; made on first use */
    Val state;            /* K_ODICT: what BUILD gave it */
    int has_state;
    int arena_refs;       /* an item or the state refers into the arena (the collector must look at them) */
} Container;

typedef struct {
    int64_t offset, numel;
    Py_ssize_t dims;      /* into the dims arena: ndim sizes, then ndim strides */
    int32_t ndim, stype;
    int64_t key, key_len; /* the storage key: offset into the pickle */
    int64_t loc, loc_len; /* its location */
    uint8_t requires_grad;
} Tensor;

typedef struct {
    const unsigned char *data;
    const char *chars;    /* the same, for sets of its bytes */
    Py_ssize_t len, pos;
    int64_t budget;       /* bytes the arenas may still take */
    Val *stack; Py_ssize_t sp, stack_cap;
    Py_ssize_t *marks; Py_ssize_t nmarks, marks_cap;
    /* the memo: which indices are set (memo_len of them), and the values of those a GET reads (the first
     * pass finds them: torch memoizes every object and reads back a few, so most are never kept) */
    uint64_t *memo_set, *memo_read;
    uint32_t *memo_rank;  /* per 64 indices: how many read ones come before */
    Val *memo;            /* by rank among the read indices */
    Py_ssize_t memo_bits, memo_len, memo_kept;
    /* tuple items and persistent ids; a copying collector keeps it to what is still reachable (a tensor's
     * argument tuples are garbage once its call is read), so it stays small whatever the pickle's size */
    Val *arena; Py_ssize_t arena_n, arena_cap;
    /* containers are numbered when made and get a Container only when something is put in them (an empty
     * OrderedDict per tensor, its backward hooks, costs nothing): box_keys/box_vals map number -> Container */
    Container *boxes; Py_ssize_t nboxes, boxes_cap;
    int64_t *box_keys; int32_t *box_vals; Py_ssize_t box_cap;
    int64_t next_box;
    Tensor *tensors; Py_ssize_t ntensors, tensors_cap;
    int64_t *dims; Py_ssize_t ndims_used, dims_cap;
    PyObject *globals;    /* bytes b"module\nname" -> int code */
    Py_ssize_t max_ndim;
} VM;

/* --- growable arrays, charged to the budget ------------------------------------------------------------ */

static int grow(VM *vm, void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap)
        return 0;
    Py_ssize_t cap2 = *cap ? *cap : 16;
    while (cap2 < need) {
        if (cap2 > PY_SSIZE_T_MAX / 4 / (Py_ssize_t)item)
            return -1;
        cap2 *= 2;
    }
    int64_t more = (int64_t)(cap2 - *cap) * (int64_t)item;
    if (more > vm->budget)
        return -1;
    void *p = PyMem_Realloc(*buf, (size_t)cap2 * item);
    if (p == NULL)
        return -1;
    vm->budget -= more;
    *buf = p;
    *cap = cap2;
    return 0;
}

#define GROW(vm, arr, cap, need) grow((vm), (void **)&(arr), &(cap), (need), sizeof(*(arr)))

static inline int push(VM *vm, Val v) {
    if (vm->sp >= vm->stack_cap && GROW(vm, vm->stack, vm->stack_cap, vm->sp + 1) < 0)
        return -1;
    vm->stack[vm->sp++] = v;
    return 0;
}

static inline Val mk(int kind, int64_t x, int64_t y) {
    Val v;
    v.kind = (uint64_t)kind;
    v.y = (uint64_t)y;
    v.x = x;
    return v;
}

/* --- sets of byte strings ----------------------------------------------------------------------------- */

/* A fast 64-bit hash of a byte string, eight bytes at a time (a multiply-rotate round per word, murmur3's
 * finaliser). The pickle chooses the keys, so collisions can be made on purpose: set_add declines past a
 * fixed number of probes instead of slowing down. */
static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    const uint64_t k1 = 0x9E3779B185EBCA87ULL, k2 = 0xC2B2AE3D27D4EB4FULL;
    uint64_t h = k2 ^ ((uint64_t)n * k1);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w *= k2;
        w = (w << 31) | (w >> 33);
        h ^= w * k1;
        h = ((h << 27) | (h >> 37)) * k1 + 0x52DCE729;
        p += 8;
        n -= 8;
    }
    if (n > 0) {
        uint64_t w = 0;
        memcpy(&w, p, (size_t)n);
        w *= k2;
        w = (w << 31) | (w >> 33);
        h ^= w * k1;
    }
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 33;
    return h;
}

/* Probes one lookup may take (at most half the slots are used: real keys take one or two). */
#define MAX_PROBES 64

static int set_grow(VM *vm, Set *s) {
    Py_ssize_t cap = s->cap ? s->cap * 2 : 64;
    Slot *slots = PyMem_Calloc((size_t)cap, sizeof(Slot));
    if (slots == NULL || (vm->budget -= cap * (Py_ssize_t)sizeof(Slot)) < 0) {
        PyMem_Free(slots);
        return -1;
    }
    for (Py_ssize_t i = 0; i < s->cap; i++) {
        if (!s->slots[i].id)
            continue;
        Py_ssize_t j = (Py_ssize_t)(s->slots[i].hash & (uint64_t)(cap - 1));
        for (int probes = 0; slots[j].id; probes++) {
            if (probes == 4 * MAX_PROBES) {  /* a run of colliding keys: declined, as in set_add */
                PyMem_Free(slots);
                return -1;
            }
            j = (j + 1) & (cap - 1);
        }
        slots[j] = s->slots[i];
    }
    PyMem_Free(s->slots);
    s->slots = slots;
    s->cap = cap;
    return 0;
}

/* The number of the item at (*base + off, len): an existing one, or a new one (*fresh = 1); -1 when out of
 * memory or past MAX_PROBES. */
static Py_ssize_t set_add(VM *vm, Set *s, Py_ssize_t off, Py_ssize_t len, int *fresh) {
    if ((s->n + 1) * 2 > s->cap && set_grow(vm, s) < 0)
        return -1;
    const char *p = *s->base + off;
    uint64_t h = hash_bytes(p, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(s->cap - 1));
    for (int probes = 0; s->slots[j].id; probes++) {
        Py_ssize_t id = s->slots[j].id - 1;
        if (s->slots[j].hash == h && s->len[id] == len && memcmp(*s->base + s->off[id], p, (size_t)len) == 0) {
            *fresh = 0;
            return id;
        }
        if (probes == MAX_PROBES)
            return -1;  /* keys made to collide: left to the general path (Python's randomised hash) */
        j = (j + 1) & (s->cap - 1);
    }
    Py_ssize_t cap = s->items_cap;
    if (GROW(vm, s->off, cap, s->n + 1) < 0)
        return -1;
    cap = s->items_cap;
    if (GROW(vm, s->len, cap, s->n + 1) < 0)
        return -1;
    s->items_cap = cap;
    s->off[s->n] = off;
    s->len[s->n] = len;
    s->slots[j].hash = h;
    s->slots[j].id = s->n + 1;
    *fresh = 1;
    return s->n++;
}

static void set_free(Set *s) {
    PyMem_Free(s->slots);
    PyMem_Free(s->off);
    PyMem_Free(s->len);
}

/* --- reading the pickle ------------------------------------------------------------------------------- */

static const unsigned char *take(VM *vm, Py_ssize_t n) {
    if (n < 0 || n > vm->len - vm->pos)
        return NULL;
    const unsigned char *p = vm->data + vm->pos;
    vm->pos += n;
    return p;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* UTF-8 as CPython decodes it with "surrogatepass": encoded surrogates (ED A0..BF xx) are accepted. */
static int utf8_ok(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i - 1 < more)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
        i += 1 + more;
    }
    return 1;
}

static PyObject *str_of(VM *vm, Val v) {
    return PyUnicode_DecodeUTF8((const char *)vm->data + v.x, (Py_ssize_t)v.y, "surrogatepass");
}

static int same_bytes(VM *vm, Val v, const char *s) {
    size_t n = strlen(s);
    return (size_t)v.y == n && memcmp(vm->data + v.x, s, n) == 0;
}

/* --- Python objects of plain values (keys, leaves, the root's state) ------------------------------------ */

static Container *box(VM *vm, Val v, int make);

typedef struct {
    Py_ssize_t nodes;     /* still allowed */
    PyObject *odict_cls;
} Copy;

static PyObject *leaf(VM *vm, Val v) {
    switch (v.kind) {
    case K_NONE: Py_RETURN_NONE;
    case K_TRUE: Py_RETURN_TRUE;
    case K_FALSE: Py_RETURN_FALSE;
    case K_INT: return PyLong_FromLongLong(v.x);
    case K_FLOAT: {
        double d;
        memcpy(&d, &v.x, sizeof d);
        return PyFloat_FromDouble(d);
    }
    case K_STR: return str_of(vm, v);
    case K_BYTES: return PyBytes_FromStringAndSize((const char *)vm->data + v.x, (Py_ssize_t)v.y);
    default: return NULL;  /* not a leaf: no exception set */
    }
}

/* A fresh Python copy of plain data, as table._unplain(table._plain(obj)) makes it: tuples, lists, dicts,
 * OrderedDicts (with their state) and leaves, at most 64 levels deep. NULL (no exception) to decline. */
static PyObject *copy_out(VM *vm, Val v, int depth, Copy *c) {
    if (depth > 64 || --c->nodes < 0)
        return NULL;
    PyObject *o = leaf(vm, v);
    if (o != NULL || PyErr_Occurred())
        return o;
    if (v.kind == K_TUPLE) {
        PyObject *t = PyTuple_New((Py_ssize_t)v.y);
        if (t == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < (Py_ssize_t)v.y; i++) {
            PyObject *item = copy_out(vm, vm->arena[v.x + i], depth + 1, c);
            if (item == NULL) {
                Py_DECREF(t);
                return NULL;
            }
            PyTuple_SET_ITEM(t, i, item);
        }
        return t;
    }
    if (v.kind == K_LIST || v.kind == K_DICT || v.kind == K_ODICT) {
        Container empty;
        Container *b = box(vm, v, 0);
        if (b == NULL) {  /* never changed */
            memset(&empty, 0, sizeof empty);
            empty.kind = (int)v.kind;
            b = &empty;
        }
        if (b->kind == K_LIST) {
            PyObject *l = PyList_New(b->n);
            if (l == NULL)
                return NULL;
            for (Py_ssize_t i = 0; i < b->n; i++) {
                PyObject *item = copy_out(vm, b->items[i], depth + 1, c);
                if (item == NULL) {
                    Py_DECREF(l);
                    return NULL;
                }
                PyList_SET_ITEM(l, i, item);
            }
            return l;
        }
        if (b->kind == K_ODICT && c->odict_cls == NULL)
            return NULL;  /* (in a dict key: unhashable anyway) */
        PyObject *d = b->kind == K_ODICT ? PyObject_CallNoArgs(c->odict_cls) : PyDict_New();
        if (d == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i + 1 < b->n; i += 2) {
            PyObject *k = copy_out(vm, b->items[i], depth + 1, c);
            PyObject *x = k ? copy_out(vm, b->items[i + 1], depth + 1, c) : NULL;
            if (x == NULL || PyDict_SetItem(d, k, x) < 0) {
                Py_XDECREF(k);
                Py_XDECREF(x);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(x);
        }
        if (b->kind == K_ODICT) {
            PyObject *st = b->has_state ? copy_out(vm, b->state, depth + 1, c) : Py_NewRef(Py_None);
            if (st == NULL || PyObject_SetAttrString(d, "state", st) < 0) {
                Py_XDECREF(st);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(st);
        }
        return d;
    }
    return NULL;  /* a tensor, a global, a persistent id: not plain data */
}

/* A dict key as the Python object the dict hashes: str, bytes, int, float, bool, None, or a tuple of those
 * (bounded by copy_out's depth and a small node budget). NULL (no exception) for anything else. */
static PyObject *key_object(VM *vm, Val v) {
    if (v.kind == K_TUPLE) {
        Copy c = {4096, NULL};
        return copy_out(vm, v, 0, &c);
    }
    return leaf(vm, v);
}

/* --- containers --------------------------------------------------------------------------------------- */

static int new_box(VM *vm, int kind, Val *out) {
    *out = mk(kind, vm->next_box++, 0);
    return 0;
}

static Py_ssize_t box_slot(VM *vm, int64_t id) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ULL;
    return (Py_ssize_t)(h >> 32) & (vm->box_cap - 1);
}

/* Container ``v`` (a K_LIST, K_DICT or K_ODICT value), made now if ``make``; NULL when it was never changed
 * (so it is empty, without state) or cannot be made. The pointer is good until the next container is made. */
static Container *box(VM *vm, Val v, int make) {
    if (vm->box_cap) {
        for (Py_ssize_t j = box_slot(vm, v.x);; j = (j + 1) & (vm->box_cap - 1)) {
            if (vm->box_vals[j] < 0)
                break;
            if (vm->box_keys[j] == v.x)
                return &vm->boxes[vm->box_vals[j]];
        }
    }
    if (!make || vm->nboxes >= INT32_MAX)
        return NULL;
    if ((vm->nboxes + 1) * 2 > vm->box_cap) {  /* rehash into twice the slots */
        Py_ssize_t cap = vm->box_cap ? vm->box_cap * 2 : 16;
        int64_t *keys = PyMem_Malloc((size_t)cap * sizeof(int64_t));
        int32_t *vals = PyMem_Malloc((size_t)cap * sizeof(int32_t));
        if (keys == NULL || vals == NULL || (vm->budget -= cap * 12) < 0) {
            PyMem_Free(keys);
            PyMem_Free(vals);
            return NULL;
        }
        memset(vals, 0xff, (size_t)cap * sizeof(int32_t));
        Py_ssize_t old = vm->box_cap;
        int64_t *okeys = vm->box_keys;
        int32_t *ovals = vm->box_vals;
        vm->box_keys = keys;
        vm->box_vals = vals;
        vm->box_cap = cap;
        for (Py_ssize_t i = 0; i < old; i++) {
            if (ovals[i] < 0)
                continue;
            Py_ssize_t j = box_slot(vm, okeys[i]);
            while (vals[j] >= 0)
                j = (j + 1) & (cap - 1);
            keys[j] = okeys[i];
            vals[j] = ovals[i];
        }
        PyMem_Free(okeys);
        PyMem_Free(ovals);
    }
    if (GROW(vm, vm->boxes, vm->boxes_cap, vm->nboxes + 1) < 0)
        return NULL;
    Container *b = &vm->boxes[vm->nboxes];
    memset(b, 0, sizeof *b);
    b->kind = (int)v.kind;
    b->strs.base = &vm->chars;
    Py_ssize_t j = box_slot(vm, v.x);
    while (vm->box_vals[j] >= 0)
        j = (j + 1) & (vm->box_cap - 1);
    vm->box_keys[j] = v.x;
    vm->box_vals[j] = (int32_t)vm->nboxes;
    return &vm->boxes[vm->nboxes++];
}

static int in_arena(Val v) {
    return (v.kind == K_TUPLE && v.y > 0) || v.kind == K_PERSID;
}

static int box_add(VM *vm, Container *b, Val v) {
    if (GROW(vm, b->items, b->cap, b->n + 1) < 0)
        return -1;
    b->items[b->n++] = v;
    b->arena_refs |= in_arena(v);
    return 0;
}

/* d[k] = v with Python's dict semantics: a key already there keeps its place (and its first key object). str
 * keys are told apart by their bytes (UTF-8 is canonical), other keys by a Python dict of their objects (a str
 * never equals another type's key). */
static int dict_set(VM *vm, Val target, Val k, Val v) {
    if (target.kind != K_DICT && target.kind != K_ODICT)
        return -1;
    Container *b = box(vm, target, 1);
    if (b == NULL)
        return -1;
    Py_ssize_t at;
    if (k.kind == K_STR) {
        int fresh;
        Py_ssize_t id = set_add(vm, &b->strs, (Py_ssize_t)k.x, (Py_ssize_t)k.y, &fresh);
        if (id < 0)
            return -1;
        if (!fresh) {
            at = b->str_entry[id];
            goto replace;
        }
        if (GROW(vm, b->str_entry, b->str_entry_cap, id + 1) < 0)
            return -1;
        b->str_entry[id] = b->n / 2;
    } else {
        PyObject *key = key_object(vm, k);
        if (key == NULL)
            return -1;
        if (b->index == NULL && (b->index = PyDict_New()) == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *found = PyDict_GetItemWithError(b->index, key);  /* borrowed */
        if (found != NULL) {
            Py_DECREF(key);
            at = PyLong_AsSsize_t(found);
            goto replace;
        }
        PyObject *num = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(b->n / 2);  /* (unhashable: no num) */
        int bad = num == NULL || PyDict_SetItem(b->index, key, num) < 0;
        Py_XDECREF(num);
        Py_DECREF(key);
        if (bad || (vm->budget -= 128) < 0)
            return -1;
    }
    return box_add(vm, b, k) < 0 || box_add(vm, b, v) < 0 ? -1 : 0;
replace:
    b->items[at * 2 + 1] = v;
    b->arena_refs |= in_arena(v);
    return 0;
}

/* --- tensors ------------------------------------------------------------------------------------------- */

static int int_tuple(VM *vm, Val t, Py_ssize_t *n) {
    if (t.kind != K_TUPLE)
        return 0;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)t.y; i++)
        if (vm->arena[t.x + i].kind != K_INT)
            return 0;
    *n = (Py_ssize_t)t.y;
    return 1;
}

/* The arguments of a plain tensor: 6 (or 7, the last None), a storage's persistent id, an int offset, size
 * and stride tuples of ints of one rank (at most max_ndim). */
static int plain_tensor_args(VM *vm, Val args) {
    if (args.kind != K_TUPLE || (args.y != 6 && args.y != 7))
        return 0;
    Val *a = &vm->arena[args.x];
    if ((args.y == 7 && a[6].kind != K_NONE) || a[0].kind != K_PERSID)
        return 0;
    Val pid = vm->arena[a[0].x];
    if (pid.kind != K_TUPLE || pid.y != 5)
        return 0;
    Val *p = &vm->arena[pid.x];
    if (p[0].kind != K_STR || !same_bytes(vm, p[0], "storage") || p[1].kind != K_GLOBAL || p[1].x < 0
        || p[2].kind != K_STR || p[3].kind != K_STR || p[4].kind != K_INT || p[4].x < 0)
        return 0;
    Py_ssize_t nd, ns;
    return a[1].kind == K_INT && int_tuple(vm, a[2], &nd) && int_tuple(vm, a[3], &ns) && nd == ns
           && nd <= vm->max_ndim;
}

/* _rebuild_tensor_v2(('storage', StorageClass, key, location, numel), offset, size, stride, requires_grad,
 * backward_hooks[, None]) as a row of the tensor columns. A call with other arguments is a tensor the
 * columns cannot hold (x = -1): the scan declines only if it is one of the root's values (as table.tabulate
 * does: one overwritten by a later value of the same key does not count). -1 when out of memory. */
static int make_tensor(VM *vm, Val args, Val *out) {
    *out = mk(K_TENSOR, -1, 0);
    if (!plain_tensor_args(vm, args))
        return 0;
    Val *a = &vm->arena[args.x];
    Val *p = &vm->arena[vm->arena[a[0].x].x];
    Py_ssize_t nd = (Py_ssize_t)a[2].y;
    if (GROW(vm, vm->tensors, vm->tensors_cap, vm->ntensors + 1) < 0
        || GROW(vm, vm->dims, vm->dims_cap, vm->ndims_used + 2 * nd) < 0)
        return -1;
    Tensor *t = &vm->tensors[vm->ntensors];
    t->offset = a[1].x;
    t->numel = p[4].x;
    t->dims = vm->ndims_used;
    t->ndim = (int32_t)nd;
    t->stype = (int32_t)p[1].x;
    t->key = p[2].x;
    t->key_len = p[2].y;
    t->loc = p[3].x;
    t->loc_len = p[3].y;
    t->requires_grad = a[4].kind == K_TRUE;
    for (Py_ssize_t i = 0; i < nd; i++) {
        vm->dims[vm->ndims_used + i] = vm->arena[a[2].x + i].x;
        vm->dims[vm->ndims_used + nd + i] = vm->arena[a[3].x + i].x;
    }
    vm->ndims_used += 2 * nd;
    *out = mk(K_TENSOR, vm->ntensors++, 0);
    return 0;
}

/* --- the arena's collector ---------------------------------------------------------------------------- */

/* Move what ``v`` refers to (a tuple's items, a persistent id's value) to ``to`` unless it was moved already;
 * point ``v`` at the new place. The first slot of a moved range says where it went (K_FWD). */
static void forward(VM *vm, Val *v, Val *to, Py_ssize_t *top) {
    if (!in_arena(*v))
        return;
    Val *old = &vm->arena[v->x];
    if (old->kind == K_FWD) {
        v->x = old->x;
        return;
    }
    Py_ssize_t n = v->kind == K_PERSID ? 1 : (Py_ssize_t)v->y;
    memcpy(to + *top, old, (size_t)n * sizeof(Val));
    *old = mk(K_FWD, *top, 0);
    v->x = *top;
    *top += n;
}

/* Copy what is reachable from the stack, the memo and the containers to a new arena (Cheney's algorithm:
 * what is copied is then scanned in turn). -1 when out of memory. */
static int collect(VM *vm) {
    if ((vm->budget -= vm->arena_cap * (int64_t)sizeof(Val)) < 0)
        return -1;
    Val *to = PyMem_Malloc((size_t)vm->arena_cap * sizeof(Val));
    if (to == NULL)
        return -1;
    Py_ssize_t top = 0;
    for (Py_ssize_t i = 0; i < vm->sp; i++)
        forward(vm, &vm->stack[i], to, &top);
    for (Py_ssize_t i = 0; i < vm->memo_kept; i++)
        forward(vm, &vm->memo[i], to, &top);
    for (Py_ssize_t b = 0; b < vm->nboxes; b++) {
        Container *c = &vm->boxes[b];
        if (!c->arena_refs)
            continue;
        for (Py_ssize_t i = 0; i < c->n; i++)
            forward(vm, &c->items[i], to, &top);
        if (c->has_state)
            forward(vm, &c->state, to, &top);
    }
    for (Py_ssize_t i = 0; i < top; i++)
        forward(vm, &to[i], to, &top);
    PyMem_Free(vm->arena);
    vm->budget += vm->arena_cap * (int64_t)sizeof(Val);  /* (the old arena's share, freed) */
    vm->arena = to;
    vm->arena_n = top;
    return 0;
}

/* Room for ``n`` more arena slots: collected first, and grown when what survives fills half of it. */
static int arena_reserve(VM *vm, Py_ssize_t n) {
    if (vm->arena_n + n <= vm->arena_cap)
        return 0;
    if (collect(vm) < 0)
        return -1;
    if (vm->arena_n + n > vm->arena_cap / 2)
        return GROW(vm, vm->arena, vm->arena_cap, 2 * (vm->arena_n + n));
    return 0;
}

/* --- the machine ------------------------------------------------------------------------------------- */

/* The stack's fence: nothing below the last mark may be popped or used (the C unpickler's rule). */
static Py_ssize_t fence(VM *vm) {
    return vm->nmarks ? vm->marks[vm->nmarks - 1] : 0;
}

static int pop(VM *vm, Val *v) {
    if (vm->sp <= fence(vm))
        return -1;
    *v = vm->stack[--vm->sp];
    return 0;
}

static int pop_mark(VM *vm, Py_ssize_t *start) {
    if (vm->nmarks == 0)
        return -1;
    *start = vm->marks[--vm->nmarks];
    return 0;
}

#define BIT(map, i) (((map)[(i) >> 6] >> ((i) & 63)) & 1)

/* Mark memo index ``idx`` set (counting it in memo_len); -1 past the indices a pickle may use: torch numbers
 * them densely, and an index far beyond those set so far would make the C unpickler allocate a huge memo. */
static int memo_mark(VM *vm, uint64_t *set, Py_ssize_t *len, uint64_t idx) {
    if (idx > (uint64_t)*len + 1024 || (Py_ssize_t)idx >= vm->memo_bits)
        return -1;
    if (!BIT(set, idx)) {
        set[idx >> 6] |= (uint64_t)1 << (idx & 63);
        (*len)++;
    }
    return 0;
}

static int memo_put(VM *vm, uint64_t idx) {
    if (vm->sp <= fence(vm) || memo_mark(vm, vm->memo_set, &vm->memo_len, idx) < 0)
        return -1;
    if (BIT(vm->memo_read, idx)) {
        uint64_t below = vm->memo_read[idx >> 6] & (((uint64_t)1 << (idx & 63)) - 1);
        vm->memo[vm->memo_rank[idx >> 6] + (uint32_t)__builtin_popcountll(below)] = vm->stack[vm->sp - 1];
    }
    return 0;
}

static int memo_get(VM *vm, uint64_t idx) {
    if (idx >= (uint64_t)vm->memo_bits || !BIT(vm->memo_set, idx) || !BIT(vm->memo_read, idx))
        return -1;
    uint64_t below = vm->memo_read[idx >> 6] & (((uint64_t)1 << (idx & 63)) - 1);
    return push(vm, vm->memo[vm->memo_rank[idx >> 6] + (uint32_t)__builtin_popcountll(below)]);
}

static int tuple_from(VM *vm, Py_ssize_t start) {
    Py_ssize_t n = vm->sp - start;
    if (arena_reserve(vm, n) < 0)  /* (the items are still on the stack: the collector keeps them) */
        return -1;
    memcpy(vm->arena + vm->arena_n, vm->stack + start, (size_t)n * sizeof(Val));
    Val t = mk(K_TUPLE, vm->arena_n, n);
    vm->arena_n += n;
    vm->sp = start;
    return push(vm, t);
}

static int global(VM *vm, const unsigned char *mod, Py_ssize_t nmod, const unsigned char *name, Py_ssize_t nname) {
    PyObject *k = PyBytes_FromStringAndSize(NULL, nmod + 1 + nname);
    if (k == NULL)
        return -1;
    char *s = PyBytes_AS_STRING(k);
    memcpy(s, mod, (size_t)nmod);
    s[nmod] = '\n';
    memcpy(s + nmod + 1, name, (size_t)nname);
    PyObject *code = PyDict_GetItemWithError(vm->globals, k);  /* borrowed */
    Py_DECREF(k);
    if (code == NULL)
        return -1;
    long c = PyLong_AsLong(code);
    if (c == -1 && PyErr_Occurred())
        return -1;
    return push(vm, mk(K_GLOBAL, c, 0));
}

static const unsigned char *line(VM *vm, Py_ssize_t *n) {
    const unsigned char *start = vm->data + vm->pos;
    const unsigned char *nl = memchr(start, '\n', (size_t)(vm->len - vm->pos));
    if (nl == NULL)
        return NULL;
    *n = nl - start;
    vm->pos += *n + 1;
    return start;
}

/* The first pass: which memo indices a GET reads (memo_read, memo_rank, and room for their values). It
 * walks the opcodes as run() does, without their meaning; -1 for an opcode run() would decline. */
static int first_pass(VM *vm) {
    Py_ssize_t words = vm->memo_bits / 64 + 1, len = 0;
    vm->memo_set = PyMem_Calloc((size_t)words, sizeof(uint64_t));
    vm->memo_read = PyMem_Calloc((size_t)words, sizeof(uint64_t));
    vm->memo_rank = PyMem_Malloc((size_t)words * sizeof(uint32_t));
    if (!vm->memo_set || !vm->memo_read || !vm->memo_rank || (vm->budget -= words * 20) < 0)
        return -1;
    const unsigned char *p;
    Py_ssize_t n;
    for (;;) {
        if ((p = take(vm, 1)) == NULL)
            return -1;
        switch (*p) {
        case '.':
            goto counted;
        case '(': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case ')': case 't':
        case 0x85: case 0x86: case 0x87: case ']': case 'l': case 'a': case 'e': case '}': case 'd': case 's':
        case 'u': case 0x93: case 'Q': case 'R': case 'b':
            break;
        case 0x80: case 'K': if (!take(vm, 1)) return -1; break;
        case 'M': if (!take(vm, 2)) return -1; break;
        case 'J': if (!take(vm, 4)) return -1; break;
        case 0x95: case 'G': if (!take(vm, 8)) return -1; break;
        case 0x8a: if ((p = take(vm, 1)) == NULL || !take(vm, p[0])) return -1; break;
        case 'X': case 'B': case 0x8c: case 'C': case 0x8d: case 0x8e: {
            int width = (*p == 0x8c || *p == 'C') ? 1 : (*p == 'X' || *p == 'B') ? 4 : 8;
            const unsigned char *q = take(vm, width);
            if (q == NULL)
                return -1;
            uint64_t sz = le(q, width);
            if (sz > (uint64_t)(vm->len - vm->pos))
                return -1;
            vm->pos += (Py_ssize_t)sz;
            break;
        }
        case 'q': if ((p = take(vm, 1)) == NULL || memo_mark(vm, vm->memo_set, &len, p[0]) < 0) return -1; break;
        case 'r': if ((p = take(vm, 4)) == NULL || memo_mark(vm, vm->memo_set, &len, le(p, 4)) < 0) return -1; break;
        case 0x94: if (memo_mark(vm, vm->memo_set, &len, (uint64_t)len) < 0) return -1; break;
        case 'h': case 'j': {
            if ((p = take(vm, *p == 'h' ? 1 : 4)) == NULL)
                return -1;
            uint64_t idx = le(p, p[-1] == 'h' ? 1 : 4);
            if (idx >= (uint64_t)vm->memo_bits)
                return -1;
            vm->memo_read[idx >> 6] |= (uint64_t)1 << (idx & 63);
            break;
        }
        case 'c':
            if (!line(vm, &n) || !line(vm, &n))
                return -1;
            break;
        default:
            return -1;
        }
    }
counted:;
    uint32_t total = 0;
    for (Py_ssize_t w = 0; w < words; w++) {
        vm->memo_rank[w] = total;
        total += (uint32_t)__builtin_popcountll(vm->memo_read[w]);
    }
    memset(vm->memo_set, 0, (size_t)words * sizeof(uint64_t));  /* run() marks them again */
    vm->pos = 0;
    if ((vm->budget -= (int64_t)total * (int64_t)sizeof(Val)) < 0)
        return -1;
    vm->memo = PyMem_Calloc((size_t)total + 1, sizeof(Val));
    vm->memo_kept = total;
    return vm->memo == NULL ? -1 : 0;
}

/* Run to STOP; the root value in *root. -1 to decline. */
static int run(VM *vm, Val *root) {
    for (;;) {
        const unsigned char *p = take(vm, 1);
        if (p == NULL)
            return -1;
        Val v, w, k;
        Py_ssize_t start, n;
        switch (*p) {
        case 0x80: /* PROTO */
            if ((p = take(vm, 1)) == NULL || *p > 5)
                return -1;
            break;
        case 0x95: { /* FRAME: the frame must be there (the C unpickler reads it whole) */
            if ((p = take(vm, 8)) == NULL)
                return -1;
            uint64_t flen = le(p, 8);
            if (flen > (uint64_t)(vm->len - vm->pos))
                return -1;
            break;
        }
        case '.': /* STOP */
            if (vm->sp <= fence(vm))
                return -1;
            *root = vm->stack[vm->sp - 1];
            return 0;
        case '(': /* MARK */
            if (GROW(vm, vm->marks, vm->marks_cap, vm->nmarks + 1) < 0)
                return -1;
            vm->marks[vm->nmarks++] = vm->sp;
            break;
        case '0': /* POP */
            if (vm->nmarks && vm->marks[vm->nmarks - 1] == vm->sp)
                vm->nmarks--;  /* CPython: POP of a mark with nothing above it drops the mark */
            else if (pop(vm, &v) < 0)
                return -1;
            break;
        case '1': /* POP_MARK */
            if (pop_mark(vm, &start) < 0)
                return -1;
            vm->sp = start;
            break;
        case '2': /* DUP */
            if (pop(vm, &v) < 0 || push(vm, v) < 0 || push(vm, v) < 0)
                return -1;
            break;
        case 'N': if (push(vm, mk(K_NONE, 0, 0)) < 0) return -1; break;
        case 0x88: if (push(vm, mk(K_TRUE, 0, 0)) < 0) return -1; break;
        case 0x89: if (push(vm, mk(K_FALSE, 0, 0)) < 0) return -1; break;
        case 'K': /* BININT1 */
            if ((p = take(vm, 1)) == NULL || push(vm, mk(K_INT, p[0], 0)) < 0)
                return -1;
            break;
        case 'M': /* BININT2 */
            if ((p = take(vm, 2)) == NULL || push(vm, mk(K_INT, (int64_t)le(p, 2), 0)) < 0)
                return -1;
            break;
        case 'J': /* BININT */
            if ((p = take(vm, 4)) == NULL || push(vm, mk(K_INT, (int32_t)(uint32_t)le(p, 4), 0)) < 0)
                return -1;
            break;
        case 0x8a: { /* LONG1 */
            if ((p = take(vm, 1)) == NULL)
                return -1;
            n = p[0];
            if ((p = take(vm, n)) == NULL)
                return -1;
            if (n > 8) {  /* an int64 written long (sign bytes after 8), or wider: kept as bytes, not a tensor field */
                int fits = 1;
                unsigned char sign = (p[7] & 0x80) ? 0xff : 0x00;
                for (Py_ssize_t i = 8; i < n; i++)
                    fits &= p[i] == sign;
                if (!fits) {
                    if (push(vm, mk(K_BIGINT, p - vm->data, n)) < 0)
                        return -1;
                    break;
                }
                n = 8;
            }
            uint64_t u = le(p, (int)n);
            if (n > 0 && n < 8 && (p[n - 1] & 0x80))
                u |= ~(uint64_t)0 << (8 * n);  /* sign-extend */
            if (push(vm, mk(K_INT, (int64_t)u, 0)) < 0)
                return -1;
            break;
        }
        case 'G': { /* BINFLOAT: big-endian */
            if ((p = take(vm, 8)) == NULL)
                return -1;
            uint64_t bits = 0;
            for (int i = 0; i < 8; i++)
                bits = (bits << 8) | p[i];
            if (push(vm, mk(K_FLOAT, (int64_t)bits, 0)) < 0)
                return -1;
            break;
        }
        case 'X': case 0x8c: case 0x8d: /* BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 */
        case 'B': case 'C': case 0x8e: { /* BINBYTES, SHORT_BINBYTES, BINBYTES8 */
            int width = (*p == 0x8c || *p == 'C') ? 1 : (*p == 'X' || *p == 'B') ? 4 : 8;
            int is_str = *p == 'X' || *p == 0x8c || *p == 0x8d;
            const unsigned char *q = take(vm, width);
            if (q == NULL)
                return -1;
            uint64_t len = le(q, width);
            if (len > (uint64_t)(vm->len - vm->pos))
                return -1;
            q = take(vm, (Py_ssize_t)len);
            if (is_str && !utf8_ok(q, (Py_ssize_t)len))
                return -1;  /* the C unpickler would fail */
            if (push(vm, mk(is_str ? K_STR : K_BYTES, q - vm->data, (int64_t)len)) < 0)
                return -1;
            break;
        }
        case ')': if (push(vm, mk(K_TUPLE, 0, 0)) < 0) return -1; break;
        case 't': /* TUPLE */
            if (pop_mark(vm, &start) < 0 || tuple_from(vm, start) < 0)
                return -1;
            break;
        case 0x85: case 0x86: case 0x87: /* TUPLE1..3 */
            n = *p - 0x84;
            if (vm->sp - n < fence(vm) || tuple_from(vm, vm->sp - n) < 0)
                return -1;
            break;
        case ']': /* EMPTY_LIST */
            if (new_box(vm, K_LIST, &v) < 0 || push(vm, v) < 0)
                return -1;
            break;
        case 'l': /* LIST */
            if (pop_mark(vm, &start) < 0 || new_box(vm, K_LIST, &v) < 0)
                return -1;
            if (vm->sp > start) {
                Container *b = box(vm, v, 1);
                for (Py_ssize_t i = start; i < vm->sp; i++)
                    if (b == NULL || box_add(vm, b, vm->stack[i]) < 0)
                        return -1;
            }
            vm->sp = start;
            if (push(vm, v) < 0)
                return -1;
            break;
        case 'a': /* APPEND */
            if (pop(vm, &v) < 0 || vm->sp <= fence(vm))
                return -1;
            w = vm->stack[vm->sp - 1];
            if (w.kind != K_LIST) {
                return -1;
            } else {
                Container *b = box(vm, w, 1);
                if (b == NULL || box_add(vm, b, v) < 0)
                    return -1;
            }
            break;
        case 'e': /* APPENDS */
            if (pop_mark(vm, &start) < 0 || start <= fence(vm))
                return -1;
            w = vm->stack[start - 1];
            if (w.kind != K_LIST)
                return -1;
            if (vm->sp > start) {
                Container *b = box(vm, w, 1);
                for (Py_ssize_t i = start; i < vm->sp; i++)
                    if (b == NULL || box_add(vm, b, vm->stack[i]) < 0)
                        return -1;
            }
            vm->sp = start;
            break;
        case '}': /* EMPTY_DICT */
            if (new_box(vm, K_DICT, &v) < 0 || push(vm, v) < 0)
                return -1;
            break;
        case 'd': /* DICT */
            if (pop_mark(vm, &start) < 0 || ((vm->sp - start) & 1) || new_box(vm, K_DICT, &v) < 0)
                return -1;
            for (Py_ssize_t i = start; i < vm->sp; i += 2)
                if (dict_set(vm, v, vm->stack[i], vm->stack[i + 1]) < 0)
                    return -1;
            vm->sp = start;
            if (push(vm, v) < 0)
                return -1;
            break;
        case 's': /* SETITEM */
            if (pop(vm, &v) < 0 || pop(vm, &k) < 0 || vm->sp <= fence(vm) || dict_set(vm, vm->stack[vm->sp - 1], k, v) < 0)
                return -1;
            break;
        case 'u': /* SETITEMS */
            if (pop_mark(vm, &start) < 0 || start <= fence(vm) || ((vm->sp - start) & 1))
                return -1;
            for (Py_ssize_t i = start; i < vm->sp; i += 2)
                if (dict_set(vm, vm->stack[start - 1], vm->stack[i], vm->stack[i + 1]) < 0)
                    return -1;
            vm->sp = start;
            break;
        case 'q': /* BINPUT */
            if ((p = take(vm, 1)) == NULL || memo_put(vm, p[0]) < 0)
                return -1;
            break;
        case 'r': /* LONG_BINPUT */
            if ((p = take(vm, 4)) == NULL || memo_put(vm, le(p, 4)) < 0)
                return -1;
            break;
        case 0x94: /* MEMOIZE */
            if (memo_put(vm, (uint64_t)vm->memo_len) < 0)
                return -1;
            break;
        case 'h': /* BINGET */
            if ((p = take(vm, 1)) == NULL || memo_get(vm, p[0]) < 0)
                return -1;
            break;
        case 'j': /* LONG_BINGET */
            if ((p = take(vm, 4)) == NULL || memo_get(vm, le(p, 4)) < 0)
                return -1;
            break;
        case 'c': { /* GLOBAL */
            Py_ssize_t nmod, nname;
            const unsigned char *mod = line(vm, &nmod);
            const unsigned char *name = mod ? line(vm, &nname) : NULL;
            if (name == NULL || global(vm, mod, nmod, name, nname) < 0)
                return -1;
            break;
        }
        case 0x93: /* STACK_GLOBAL */
            if (pop(vm, &w) < 0 || pop(vm, &v) < 0 || v.kind != K_STR || w.kind != K_STR
                || global(vm, vm->data + v.x, (Py_ssize_t)v.y, vm->data + w.x, (Py_ssize_t)w.y) < 0)
                return -1;
            break;
        case 'Q': /* BINPERSID */
            if (arena_reserve(vm, 1) < 0 || pop(vm, &v) < 0)  /* (reserved while v is still on the stack) */
                return -1;
            vm->arena[vm->arena_n] = v;
            if (push(vm, mk(K_PERSID, vm->arena_n++, 0)) < 0)
                return -1;
            break;
        case 'R': /* REDUCE */
            if (pop(vm, &v) < 0 || pop(vm, &w) < 0 || w.kind != K_GLOBAL)
                return -1;
            if (w.x == G_ODICT) {
                if (v.kind != K_TUPLE || v.y != 0 || new_box(vm, K_ODICT, &k) < 0 || push(vm, k) < 0)
                    return -1;
            } else if (w.x == G_V2) {
                if (make_tensor(vm, v, &k) < 0 || push(vm, k) < 0)
                    return -1;
            } else
                return -1;
            break;
        case 'b': /* BUILD: an OrderedDict keeps its state (PickledOrderedDict.__setstate__) */
            if (pop(vm, &v) < 0 || vm->sp <= fence(vm))
                return -1;
            w = vm->stack[vm->sp - 1];
            if (w.kind != K_ODICT) {
                return -1;
            } else {
                Container *b = box(vm, w, 1);
                if (b == NULL)
                    return -1;
                b->state = v;
                b->has_state = 1;
                b->arena_refs |= in_arena(v);
            }
            break;
        default:
            return -1;
        }
    }
}

/* --- columns -------------------------------------------------------------------------------------------- */

/* Bytes of n int64s / uint16s. */
static PyObject *i64_bytes(const int64_t *v, Py_ssize_t n) {
    return PyBytes_FromStringAndSize((const char *)v, n * (Py_ssize_t)sizeof(int64_t));
}

static int decimal_key(const char *s, Py_ssize_t n, int64_t *out) {
    if (n < 1 || n >= 19 || (s[0] == '0' && n > 1))
        return 0;
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 1;
}

/* The columns of the root dict (see table.TensorTable), or NULL (no exception) to decline. */
static PyObject *columns(VM *vm, Val root, PyObject *dtype_codes, PyObject *prefix, PyObject *odict_cls) {
    Container *b = box(vm, root, 0);
    if (b == NULL)
        return NULL;  /* an empty dict: no tensors */
    Py_ssize_t rows = b->n / 2, nt = 0;
    PyObject *result = NULL, *keys = NULL, *leaves = NULL, *state = NULL, *shapes = NULL, *st_keys = NULL;
    PyObject *locations = NULL, *stypes = NULL;
    int64_t *storage = NULL, *offset = NULL, *shape = NULL, *stride = NULL, *tensor_of = NULL, *st_numel = NULL;
    int64_t *st_dtype = NULL, *decimals = NULL;
    uint16_t *st_type = NULL, *st_location = NULL;
    unsigned char *rg = NULL;
    int32_t *type_of = NULL;
    Py_ssize_t *row_tensor = NULL;
    char *keybuf = NULL;
    Py_ssize_t keybuf_n = 0, keybuf_cap = 0;
    const char *data_base = (const char *)vm->data;
    const char *dims_base = NULL;
    Set keyset = {0}, locset = {0}, shapeset = {0};
    keyset.base = (const char **)&keybuf;
    locset.base = &data_base;
    shapeset.base = &dims_base;
    Py_ssize_t nstypes = PyList_GET_SIZE(dtype_codes);
    const char *pre = NULL;
    Py_ssize_t npre = 0;
    int all_decimal = 1;

    if (prefix != Py_None) {
        pre = PyBytes_AS_STRING(prefix);
        npre = PyBytes_GET_SIZE(prefix);
        all_decimal = npre == 0;
    }
    keys = PyList_New(rows);
    leaves = PyList_New(0);
    row_tensor = PyMem_Calloc((size_t)rows + 1, sizeof(Py_ssize_t));
    if (keys == NULL || leaves == NULL || row_tensor == NULL)
        goto done;
    /* rows: every key a str; every value a tensor or a leaf */
    for (Py_ssize_t r = 0; r < rows; r++) {
        Val kv = b->items[2 * r], vv = b->items[2 * r + 1];
        if (kv.kind != K_STR)
            goto done;
        PyObject *key = str_of(vm, kv);
        if (key == NULL)
            goto done;
        PyList_SET_ITEM(keys, r, key);
        if (vv.kind == K_TENSOR) {
            if (vv.x < 0)
                goto done;  /* a tensor the columns cannot hold */
            row_tensor[r] = vv.x + 1;
            nt++;
            continue;
        }
        if (vv.kind == K_BIGINT || vv.kind > K_BYTES)
            goto done;
        PyObject *x = leaf(vm, vv);
        PyObject *pair = x ? Py_BuildValue("(nN)", r, x) : NULL;
        if (pair == NULL || PyList_Append(leaves, pair) < 0) {
            Py_XDECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
    }
    if (nt == 0 || (vm->budget -= nt * 64) < 0)
        goto done;  /* (a dict without tensors is left to the general path, as table.tabulate leaves it) */
    storage = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    offset = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    shape = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    stride = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    tensor_of = PyMem_Malloc(((size_t)rows + 1) * sizeof(int64_t));
    st_numel = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    st_dtype = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    decimals = PyMem_Malloc(((size_t)nt + 1) * sizeof(int64_t));
    st_type = PyMem_Malloc(((size_t)nt + 1) * sizeof(uint16_t));
    st_location = PyMem_Malloc(((size_t)nt + 1) * sizeof(uint16_t));
    rg = PyMem_Malloc((size_t)nt + 1);
    type_of = PyMem_Malloc(((size_t)nstypes + 1) * sizeof(int32_t));
    if (!storage || !offset || !shape || !stride || !tensor_of || !st_numel || !st_dtype || !decimals || !st_type
        || !st_location || !rg || !type_of)
        goto done;
    for (Py_ssize_t i = 0; i < nstypes; i++)
        type_of[i] = -1;
    stypes = PyList_New(0);
    locations = PyList_New(0);
    if (stypes == NULL || locations == NULL)
        goto done;
    /* storages numbered by first reference; types and locations by first appearance over all tensors */
    Py_ssize_t t = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        tensor_of[r] = row_tensor[r] ? t : -1;
        if (!row_tensor[r])
            continue;
        Tensor *x = &vm->tensors[row_tensor[r] - 1];
        if (x->stype >= nstypes)
            goto done;
        if (type_of[x->stype] < 0) {
            type_of[x->stype] = (int32_t)PyList_GET_SIZE(stypes);
            PyObject *code = PyLong_FromLong(x->stype);
            if (code == NULL || PyList_Append(stypes, code) < 0) {
                Py_XDECREF(code);
                goto done;
            }
            Py_DECREF(code);
            if (PyList_GET_SIZE(stypes) > 65535)
                goto done;
        }
        int fresh;
        Py_ssize_t loc = set_add(vm, &locset, (Py_ssize_t)x->loc, (Py_ssize_t)x->loc_len, &fresh);
        if (loc < 0)
            goto done;
        if (fresh) {
            PyObject *s = PyUnicode_DecodeUTF8(data_base + x->loc, (Py_ssize_t)x->loc_len, "surrogatepass");
            if (s == NULL || PyList_Append(locations, s) < 0) {
                Py_XDECREF(s);
                goto done;
            }
            Py_DECREF(s);
            if (PyList_GET_SIZE(locations) > 65535)
                goto done;
        }
        /* the storage key, with the prefix put before it */
        Py_ssize_t need = keybuf_n + npre + (Py_ssize_t)x->key_len;
        if (GROW(vm, keybuf, keybuf_cap, need) < 0)
            goto done;
        if (npre)
            memcpy(keybuf + keybuf_n, pre, (size_t)npre);
        memcpy(keybuf + keybuf_n + npre, data_base + x->key, (size_t)x->key_len);
        Py_ssize_t s = set_add(vm, &keyset, keybuf_n, npre + (Py_ssize_t)x->key_len, &fresh);
        if (s < 0)
            goto done;
        PyObject *dt = PyList_GET_ITEM(dtype_codes, x->stype);
        int64_t dcode = PyLong_AsLongLong(dt);
        if (fresh) {
            keybuf_n = need;
            st_numel[s] = x->numel;
            st_dtype[s] = dcode;
            st_type[s] = (uint16_t)type_of[x->stype];
            st_location[s] = (uint16_t)loc;
            if (all_decimal && !decimal_key(data_base + x->key, (Py_ssize_t)x->key_len, &decimals[s]))
                all_decimal = 0;
        } else if (st_numel[s] != x->numel || st_dtype[s] != dcode)
            goto done;  /* one storage, two sizes or dtypes: not plain */
        storage[t] = s;
        offset[t] = x->offset;
        rg[t] = x->requires_grad;
        t++;
    }
    /* shapes: every size, then every stride, numbered by first appearance */
    shapes = PyList_New(0);
    if (shapes == NULL)
        goto done;
    dims_base = (const char *)vm->dims;
    for (int pass = 0; pass < 2; pass++) {
        Py_ssize_t u = 0;
        for (Py_ssize_t r = 0; r < rows; r++) {
            if (!row_tensor[r])
                continue;
            Tensor *x = &vm->tensors[row_tensor[r] - 1];
            Py_ssize_t at = (x->dims + (pass ? x->ndim : 0)) * (Py_ssize_t)sizeof(int64_t);
            int fresh;
            Py_ssize_t id = set_add(vm, &shapeset, at, x->ndim * (Py_ssize_t)sizeof(int64_t), &fresh);
            if (id < 0)
                goto done;
            if (fresh) {
                PyObject *tup = PyTuple_New(x->ndim);
                if (tup == NULL)
                    goto done;
                for (Py_ssize_t i = 0; i < x->ndim; i++) {
                    PyObject *d = PyLong_FromLongLong(vm->dims[x->dims + (pass ? x->ndim : 0) + i]);
                    if (d == NULL) {
                        Py_DECREF(tup);
                        goto done;
                    }
                    PyTuple_SET_ITEM(tup, i, d);
                }
                int bad = PyList_Append(shapes, tup);
                Py_DECREF(tup);
                if (bad)
                    goto done;
            }
            (pass ? stride : shape)[u++] = id;
        }
    }
    Py_ssize_t nst = keyset.n;
    if (all_decimal)
        st_keys = i64_bytes(decimals, nst);
    else {
        st_keys = PyList_New(nst);
        for (Py_ssize_t i = 0; st_keys && i < nst; i++) {
            PyObject *s = PyUnicode_DecodeUTF8(keybuf + keyset.off[i], keyset.len[i], "surrogatepass");
            if (s == NULL)
                goto done;
            PyList_SET_ITEM(st_keys, i, s);
        }
    }
    if (st_keys == NULL)
        goto done;
    if (root.kind == K_ODICT && b->has_state) {
        Copy c = {1 << 20, odict_cls};
        state = copy_out(vm, b->state, 0, &c);
        if (state == NULL)
            goto done;
    } else
        state = Py_NewRef(Py_None);
    {
        PyObject *u16_type = PyBytes_FromStringAndSize((const char *)st_type, nst * 2);
        PyObject *u16_loc = PyBytes_FromStringAndSize((const char *)st_location, nst * 2);
        PyObject *numel = i64_bytes(st_numel, nst);
        PyObject *tof = PyList_GET_SIZE(leaves) ? i64_bytes(tensor_of, rows) : Py_NewRef(Py_None);
        result = Py_BuildValue("(NOOONNNNNNONNNNOO)", keys, root.kind == K_ODICT ? Py_True : Py_False, state, leaves,
                               tof, i64_bytes(storage, nt), i64_bytes(offset, nt), i64_bytes(shape, nt),
                               i64_bytes(stride, nt), PyBytes_FromStringAndSize((const char *)rg, nt), shapes,
                               st_keys, numel, u16_type, u16_loc, stypes, locations);
        keys = NULL;  /* stolen (N), even on failure */
        st_keys = NULL;
    }
done:
    if (result == NULL)
        PyErr_Clear();
    Py_XDECREF(keys);
    Py_XDECREF(leaves);
    Py_XDECREF(state);
    Py_XDECREF(shapes);
    Py_XDECREF(st_keys);
    Py_XDECREF(locations);
    Py_XDECREF(stypes);
    PyMem_Free(storage); PyMem_Free(offset); PyMem_Free(shape); PyMem_Free(stride); PyMem_Free(tensor_of);
    PyMem_Free(st_numel); PyMem_Free(st_dtype); PyMem_Free(decimals); PyMem_Free(st_type);
    PyMem_Free(st_location); PyMem_Free(rg); PyMem_Free(type_of); PyMem_Free(row_tensor); PyMem_Free(keybuf);
    set_free(&keyset);
    set_free(&locset);
    set_free(&shapeset);
    return result;
}

static void vm_free(VM *vm) {
    for (Py_ssize_t i = 0; i < vm->nboxes; i++) {
        PyMem_Free(vm->boxes[i].items);
        PyMem_Free(vm->boxes[i].str_entry);
        set_free(&vm->boxes[i].strs);
        Py_XDECREF(vm->boxes[i].index);
    }
    PyMem_Free(vm->stack); PyMem_Free(vm->marks); PyMem_Free(vm->memo); PyMem_Free(vm->memo_set);
    PyMem_Free(vm->memo_read); PyMem_Free(vm->memo_rank); PyMem_Free(vm->arena); PyMem_Free(vm->boxes);
    PyMem_Free(vm->box_keys); PyMem_Free(vm->box_vals); PyMem_Free(vm->tensors); PyMem_Free(vm->dims);
}

PyDoc_STRVAR(scan_doc,
"scan(pickle, globals, dtype_codes, budget, max_ndim, prefix, odict_class[, arena]) -> tuple | None\n\n"
"The columns of a plain flat state_dict pickle, or None when the pickle is not of that form (see\n"
"ckptfs.model.table.scan, which calls this).");

static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer buf;
    PyObject *globals, *dtype_codes, *prefix, *odict_cls;
    long long budget;
    Py_ssize_t max_ndim, arena0 = 1 << 14;
    if (!PyArg_ParseTuple(args, "y*O!O!LnOO|n", &buf, &PyDict_Type, &globals, &PyList_Type, &dtype_codes, &budget,
                          &max_ndim, &prefix, &odict_cls, &arena0))
        return NULL;
    if (arena0 < 1)
        arena0 = 1;
    if (buf.len > (Py_ssize_t)(UINT32_MAX / 2)) {  /* (memo ranks are 32-bit) */
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    if (prefix != Py_None && !PyBytes_Check(prefix)) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError, "prefix: bytes or None");
        return NULL;
    }
    VM vm;
    memset(&vm, 0, sizeof vm);
    vm.data = buf.buf;
    vm.chars = buf.buf;
    vm.len = buf.len;
    vm.budget = budget;
    vm.globals = globals;
    vm.max_ndim = max_ndim;
    vm.memo_bits = buf.len + 1280;  /* memo indices stay under (puts so far) + 1024 (memo_mark) */
    if (GROW(&vm, vm.arena, vm.arena_cap, arena0) < 0 || GROW(&vm, vm.stack, vm.stack_cap, 256) < 0) {
        vm_free(&vm);
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    Val root;
    PyObject *out = NULL;
    if (first_pass(&vm) == 0 && run(&vm, &root) == 0 && (root.kind == K_DICT || root.kind == K_ODICT))
        out = columns(&vm, root, dtype_codes, prefix, odict_cls);
    PyErr_Clear();  /* declining is not an error */
    vm_free(&vm);
    PyBuffer_Release(&buf);
    if (out == NULL)
        Py_RETURN_NONE;
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ckptfs.model._tablescan",
    "A plain state_dict pickle read as columns, in C (see ckptfs.model.table.scan).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__tablescan(void) {
    return PyModule_Create(&module);
}
