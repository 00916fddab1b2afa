/* Token ids and logprobs read straight from msgpack into machine values, for swarmrl.schemas.fastcodec.
 *
 * They are most of what the ledger decodes. Decoding them into Python ints and floats, and packing
 * those into arrays again, costs 25-35 ns a number; reading them here costs ~3.
 *
 *   split(payload, fields) -> (reduced payload, packed values), or None
 *
 * `payload` is a msgpack map; `fields` a tuple of (name: bytes, kind: int). Kinds INTS (0) and
 * FLOATS (1): the field's value, an array of numbers, is read into int64 or float64 bytes (native
 * order). The result is the payload with those values replaced by nil, so that msgspec decodes the
 * rest without walking the numbers again, and a tuple of the packed values (None where a field is
 * absent). A payload with none of the fields comes back as it is. Kind PLAIN (2): the value stays,
 * but only if it is plain data (no msgpack bin or ext, string keys only: what a free-form field of
 * the codec admits), which the walk over it checks on the way, instead of Python afterwards.
 *
 * None means "not surely what the model accepts": an element of another type, an int beyond int64
 * anywhere in the payload (so the caller knows every int of a record it decodes fits a ledger
 * column), a float that is not finite, a numbers field given twice, a plain field that is not, bytes
 * after the map, broken msgpack. The caller then takes the general path (msgspec lists, then the codec),
 * which decides and names the fault.
 * So this file only ever says yes to arrays that the general path accepts with the same values:
 * int fields to msgspec ints in [-2**63, 2**63); float fields to msgpack floats (float 32 widened
 * exactly) and to ints of at most 2**53 in magnitude (exact in a float64, as pydantic's float() of
 * them is). Everything else in the payload is copied as it is, for msgspec to judge.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t be(const unsigned char *p, int n) { /* big-endian, n in 1, 2, 4, 8 */
    switch (n) {
    case 1: return p[0];
    case 2: { uint16_t v; memcpy(&v, p, 2); return __builtin_bswap16(v); }
    case 4: { uint32_t v; memcpy(&v, p, 4); return __builtin_bswap32(v); }
    default: { uint64_t v; memcpy(&v, p, 8); return __builtin_bswap64(v); }
    }
}

/* The array's element count and where its elements start; -1 if `p` is no array. */
static Py_ssize_t header(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos) {
    if (n >= 1 && (p[0] & 0xf0) == 0x90) { *pos = 1; return p[0] & 0x0f; }
    if (n >= 3 && p[0] == 0xdc) { *pos = 3; return (Py_ssize_t)be(p + 1, 2); }
    if (n >= 5 && p[0] == 0xdd) { *pos = 5; return (Py_ssize_t)be(p + 1, 4); }
    return -1;
}

/* One msgpack int at p[*pos]: 1 and its value, or 0 (not an int, beyond int64, or cut short). */
static int read_int(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, int64_t *out) {
    Py_ssize_t i = *pos;
    unsigned char m = p[i];
    int width;
    if (m <= 0x7f) { *out = m; *pos = i + 1; return 1; }
    if (m >= 0xe0) { *out = (int8_t)m; *pos = i + 1; return 1; }
    switch (m) {
    case 0xcc: case 0xd0: width = 1; break;
    case 0xcd: case 0xd1: width = 2; break;
    case 0xce: case 0xd2: width = 4; break;
    case 0xcf: case 0xd3: width = 8; break;
    default: return 0;
    }
    if (n - i - 1 < width) return 0;
    uint64_t u = be(p + i + 1, width);
    if (m >= 0xd0) { /* signed: sign-extend from `width` bytes */
        int shift = 64 - 8 * width;
        *out = (int64_t)(u << shift) >> shift;
    } else {
        if (u > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)u;
    }
    *pos = i + 1 + width;
    return 1;
}

/* The array at p[*pos] as packed bytes (a new reference), Py_None (borrowed: not plainly numbers),
 * or NULL (out of memory). *pos moves past the array. */
static PyObject *read_numbers(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, int floats) {
    Py_ssize_t at = *pos, start;
    Py_ssize_t count = header(p + at, n - at, &start);
    at += start;
    /* Every element takes at least a byte: a count beyond the bytes left is a lie, not an allocation. */
    if (count < 0 || count > n - at) return Py_None;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count * 8);
    if (out == NULL) return NULL;
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (at >= n) goto none;
        unsigned char m = p[at];
        if (floats && (m == 0xcb || m == 0xca)) {
            int width = m == 0xcb ? 8 : 4;
            if (n - at - 1 < width) goto none;
            uint64_t u = be(p + at + 1, width);
            double d;
            if (width == 8) {
                memcpy(&d, &u, 8);
            } else {
                uint32_t u32 = (uint32_t)u;
                float f;
                memcpy(&f, &u32, 4);
                d = f;
            }
            if (!isfinite(d)) goto none;
            memcpy(dst + 8 * k, &d, 8);
            at += 1 + width;
            continue;
        }
        int64_t v;
        if (m <= 0x7f) { /* the common token ids first: fixint, uint 8, uint 16 */
            v = m;
            at += 1;
        } else if (m == 0xcd && n - at >= 3) {
            v = (int64_t)p[at + 1] << 8 | p[at + 2];
            at += 3;
        } else if (m == 0xcc && n - at >= 2) {
            v = p[at + 1];
            at += 2;
        } else if (!read_int(p, n, &at, &v)) {
            goto none;
        }
        if (floats) {
            if (v > (INT64_C(1) << 53) || v < -(INT64_C(1) << 53)) goto none;
            double d = (double)v;
            memcpy(dst + 8 * k, &d, 8);
        } else {
            memcpy(dst + 8 * k, &v, 8);
        }
    }
    *pos = at;
    return out;
none:
    Py_DECREF(out);
    return Py_None;
}

enum { INTS, FLOATS, PLAIN };

/* Moves *pos past the value at p[*pos]; 0 if it is broken, cut short or nested deeper than 64, holds
 * an int beyond int64 (a uint 64 of 2**63 or more), or, `plain`, holds bin or ext values or a map key
 * that is not a string. */
static int skip(const unsigned char *p, Py_ssize_t n, Py_ssize_t *pos, int depth, int plain) {
    Py_ssize_t at = *pos;
    if (at >= n || depth > 64) return 0;
    unsigned char m = p[at++];
    if (m == 0xcf && at < n && p[at] >= 0x80) return 0; /* big-endian: the top bit first */
    /* bin 8/16/32, ext 8/16/32, fixext 1..16 */
    if (plain && ((m >= 0xc4 && m <= 0xc9) || (m >= 0xd4 && m <= 0xd8))) return 0;
    int map = (m >= 0x80 && m <= 0x8f) || m == 0xde || m == 0xdf;
    uint64_t len = 0, items = 0; /* bytes of payload after the header; or elements (maps: 2 a pair) */
    if (m <= 0x7f || m >= 0xe0 || m == 0xc0 || m == 0xc2 || m == 0xc3) len = 0;
    else if (m <= 0x8f) items = 2 * (uint64_t)(m & 0x0f);
    else if (m <= 0x9f) items = m & 0x0f;
    else if (m <= 0xbf) len = m & 0x1f;
    else {
        static const signed char width[] = { /* 0xc4..0xdf: bytes of the length field, -1 fixed size */
            1, 2, 4, 1, 2, 4, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 2, 4, 2, 4, 2, 4,
        };
        static const unsigned char fixed[] = { /* 0xca..0xd8: payload bytes (fixext: type byte included) */
            4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 3, 5, 9, 17,
        };
        if (m == 0xc1) return 0;
        int w = width[m - 0xc4];
        if (w < 0) {
            len = fixed[m - 0xca];
        } else {
            if (n - at < w) return 0;
            uint64_t size = be(p + at, w);
            at += w;
            if (m >= 0xdc && m <= 0xdd) items = size;
            else if (m >= 0xde) items = 2 * size;
            else len = size + (m >= 0xc7 && m <= 0xc9); /* ext: its type byte */
        }
    }
    if (len > (uint64_t)(n - at)) return 0;
    at += (Py_ssize_t)len;
    if (items > (uint64_t)(n - at)) return 0; /* at least a byte each */
    for (uint64_t k = 0; k < items; k++) {
        if (plain && map && k % 2 == 0 && at < n && !((p[at] >= 0xa0 && p[at] <= 0xbf) || (p[at] >= 0xd9 && p[at] <= 0xdb)))
            return 0; /* a key that is not a string */
        if (!skip(p, n, &at, depth + 1, plain)) return 0;
    }
    *pos = at;
    return 1;
}

static PyObject *split(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data, *fields;
    if (!PyArg_ParseTuple(args, "OO!", &data, &PyTuple_Type, &fields)) return NULL;
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    const char *names[16];
    Py_ssize_t lens[16];
    long kinds[16];
    if (nf > 16) return PyErr_Format(PyExc_ValueError, "split reads at most 16 fields, not %zd", nf);
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *f = PyTuple_GET_ITEM(fields, i);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(f, 0)) ||
            !PyLong_Check(PyTuple_GET_ITEM(f, 1)))
            return PyErr_Format(PyExc_TypeError, "split: fields are (name: bytes, kind: int) pairs");
        names[i] = PyBytes_AS_STRING(PyTuple_GET_ITEM(f, 0));
        lens[i] = PyBytes_GET_SIZE(PyTuple_GET_ITEM(f, 0));
        kinds[i] = PyLong_AsLong(PyTuple_GET_ITEM(f, 1));
        if (kinds[i] < INTS || kinds[i] > PLAIN)
            return PyErr_Format(PyExc_ValueError, "split: kind %ld is none of 0 (ints), 1 (floats), 2 (plain)", kinds[i]);
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len, pos = 0, w = 0;
    PyObject *values = PyTuple_New(nf), *out = NULL, *result = NULL;
    if (values == NULL) goto done;
    for (Py_ssize_t i = 0; i < nf; i++) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(values, i, Py_None);
    }
    Py_ssize_t count;
    if (n >= 1 && (p[0] & 0xf0) == 0x80) { count = p[0] & 0x0f; pos = 1; }
    else if (n >= 3 && p[0] == 0xde) { count = (Py_ssize_t)be(p + 1, 2); pos = 3; }
    else if (n >= 5 && p[0] == 0xdf) { count = (Py_ssize_t)be(p + 1, 4); pos = 5; }
    else goto none;
    char *dst = NULL; /* the reduced payload, made at the first field read: most records of a union
                         (begin, env, ...) have none, and come back as they are */
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t key = pos, klen = -1, kstart = 0;
        if (pos >= n) goto none;
        unsigned char m = p[pos];
        if (m >= 0xa0 && m <= 0xbf) { klen = m & 0x1f; kstart = pos + 1; }
        else if (m == 0xd9 && n - pos >= 2) { klen = p[pos + 1]; kstart = pos + 2; }
        else if (m == 0xda && n - pos >= 3) { klen = (Py_ssize_t)be(p + pos + 1, 2); kstart = pos + 3; }
        if (!skip(p, n, &pos, 0, 0)) goto none;
        Py_ssize_t i = 0;
        for (; klen >= 0 && i < nf; i++)
            if (lens[i] == klen && memcmp(p + kstart, names[i], klen) == 0) break;
        if (klen < 0 || i == nf || kinds[i] == PLAIN) { /* copied as it is, for msgspec to judge */
            Py_ssize_t start = key;
            if (!skip(p, n, &pos, 0, klen >= 0 && i < nf)) goto none;
            if (dst != NULL) {
                memcpy(dst + w, p + start, pos - start);
                w += pos - start;
            }
            continue;
        }
        if (PyTuple_GET_ITEM(values, i) != Py_None) goto none; /* given twice */
        if (dst == NULL) { /* a replaced value shrinks to one byte: never longer than the payload */
            out = PyBytes_FromStringAndSize(NULL, n);
            if (out == NULL) goto done;
            dst = PyBytes_AS_STRING(out);
            memcpy(dst, p, key);
            w = key;
        }
        PyObject *packed = read_numbers(p, n, &pos, kinds[i] == FLOATS);
        if (packed == NULL) goto done;
        if (packed == Py_None) goto none;
        Py_DECREF(Py_None);
        PyTuple_SET_ITEM(values, i, packed);
        memcpy(dst + w, p + key, kstart + klen - key);
        w += kstart + klen - key;
        dst[w++] = (char)0xc0; /* nil in its place */
    }
    if (pos != n) goto none;
    if (out == NULL) {
        result = PyTuple_Pack(2, data, values);
        goto done;
    }
    if (_PyBytes_Resize(&out, w) < 0) goto done;
    result = PyTuple_Pack(2, out, values);
    goto done;
none:
    result = Py_None;
    Py_INCREF(Py_None);
done:
    Py_XDECREF(out);
    Py_XDECREF(values);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS, "split(payload, ((name, is_float), ...)) -> (reduced payload, packed values), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_numbers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__numbers(void) { return PyModule_Create(&module); }
