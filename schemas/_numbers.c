/* msgpack arrays of numbers -> packed machine values, for swarmrl.schemas.fastcodec.
 *
 * Token ids and logprobs are most of what the ledger decodes. Decoding them into Python ints and
 * floats and packing those into arrays again costs ~35 ns a number; reading them straight from the
 * msgpack bytes costs ~2. Two functions, each taking one msgpack array (a buffer: `msgspec.Raw`):
 *
 *   ints(raw)   -> bytes of int64 values (native order), or None
 *   floats(raw) -> bytes of finite float64 values (native order), or None
 *
 * None means "not surely what the model accepts": an element of another type, an int beyond int64,
 * a float that is not finite, bytes after the array. The caller then takes the general path (msgspec
 * lists, then the codec), which decides and names the fault. So this file only ever says yes to
 * arrays that the general path accepts with the same values: ints(raw) to msgpack ints in
 * [-2**63, 2**63), floats(raw) to msgpack floats (float 32 widened exactly) and to ints of at most
 * 2**53 in magnitude (exact in a float64, as pydantic's float() of them is).
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

static PyObject *decode(PyObject *arg, int floats) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = view.buf;
    Py_ssize_t n = view.len, pos = 0;
    Py_ssize_t count = header(p, n, &pos);
    PyObject *out = NULL;
    /* Every element takes at least a byte: a count beyond the bytes left is a lie, not an allocation. */
    if (count < 0 || count > n - pos) goto none;
    out = PyBytes_FromStringAndSize(NULL, count * 8);
    if (out == NULL) { PyBuffer_Release(&view); return NULL; }
    char *dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        if (pos >= n) goto none;
        unsigned char m = p[pos];
        if (floats && (m == 0xcb || m == 0xca)) {
            int width = m == 0xcb ? 8 : 4;
            if (n - pos - 1 < width) goto none;
            uint64_t u = be(p + pos + 1, width);
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
            pos += 1 + width;
            continue;
        }
        int64_t v;
        if (!read_int(p, n, &pos, &v)) goto none;
        if (floats) {
            if (v > (INT64_C(1) << 53) || v < -(INT64_C(1) << 53)) goto none;
            double d = (double)v;
            memcpy(dst + 8 * k, &d, 8);
        } else {
            memcpy(dst + 8 * k, &v, 8);
        }
    }
    if (pos != n) goto none;
    PyBuffer_Release(&view);
    return out;
none:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *ints(PyObject *self, PyObject *arg) { return decode(arg, 0); }
static PyObject *floats(PyObject *self, PyObject *arg) { return decode(arg, 1); }

static PyMethodDef methods[] = {
    {"ints", ints, METH_O, "ints(raw) -> int64 bytes of a msgpack array of ints, or None."},
    {"floats", floats, METH_O, "floats(raw) -> finite float64 bytes of a msgpack array of numbers, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_numbers", NULL, -1, methods};

PyMODINIT_FUNC PyInit__numbers(void) { return PyModule_Create(&module); }
