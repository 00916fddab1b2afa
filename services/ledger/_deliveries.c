/* The ledger's pull-consumer deliveries read from the NATS protocol stream in one C loop.
 *
 * Reading a delivery in Python (a regular expression for its protocol line, str and bytes objects,
 * a nats-py Msg, the stream sequence split out of the ack subject) cost ~28,000 instructions, more
 * than writing its row to Parquet; here it is a few hundred and the objects it must allocate.
 *
 *   read(buf, pos, sids, cls) -> (pos, sid, deliveries, status, nbytes, cut)
 *
 * `buf` holds protocol text from `pos` on. Reads the deliveries, in order, that go to one
 * subscription (the first one's `sid`, which must be a key of the dict `sids`):
 *
 *   MSG <subject> <sid> [reply] <size>\r\n<payload>\r\n
 *   HMSG <subject> <sid> [reply] <header size> <total size>\r\n<headers><payload>\r\n
 *
 * and returns them as instances of `cls`, a NamedTuple (subject: str, reply: str, data: bytes,
 * seq: int, headers: None); `seq` is the stream sequence read from the ack subject (0 if it is not
 * one, see `ack_seq`). Headers are skipped: the short path is for streams whose headers the ledger
 * does not read. A status message (a header block `NATS/1.0 <code> <text>` and no payload, the end
 * of a pull request) ends the run and comes back as `status`, its text. `nbytes`: the payload bytes
 * read; `cut`: True when the run stopped at a delivery whose bytes have not all arrived.
 *
 * It stops, consuming nothing more, at anything else: another command (PING, +OK, ...), another
 * subscription, a line it cannot read. The caller hands those to nats-py's own parser. So this file
 * only reads what `client._read_deliveries` (the same logic in Python, used without a compiler and
 * as the reference in the tests) reads, and nothing it refuses can be lost.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_TOKENS 5   /* HMSG with a reply: subject, sid, reply, header size, total size */
#define MAX_DIGITS 18  /* numbers up to 10**18 - 1: sizes, sids (the protocol's fit in int64) */
#define STATUS "NATS/1.0 "
#define STATUS_LEN 9

/* Decimal digits p[0:n] as a number; -1 if empty, too long or not all digits. */
static long long number(const char *p, Py_ssize_t n, int max_digits) {
    long long v = 0;
    if (n < 1 || n > max_digits) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* Stream sequence in a JetStream ack subject, 0 if `r` is none:
 * `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts>.<pending>` (9 tokens) or,
 * with a domain, `$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<stream seq>...` (11+). */
static unsigned long long ack_seq(const char *r, Py_ssize_t n) {
    Py_ssize_t starts[12], ends[12];
    int tokens = 0;
    Py_ssize_t from = 0;
    if (n < 8 || memcmp(r, "$JS.ACK.", 8) != 0) return 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        if (i == n || r[i] == '.') {
            if (tokens < 12) { starts[tokens] = from; ends[tokens] = i; }
            tokens++;
            from = i + 1;
        }
    }
    int at = tokens == 9 ? 5 : tokens >= 11 ? 7 : -1;
    if (at < 0) return 0;
    const char *p = r + starts[at];
    Py_ssize_t len = ends[at] - starts[at];
    unsigned long long v = 0;
    if (len < 1 || len > 19) return 0;  /* 19 digits: below 2**64 */
    for (Py_ssize_t i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (unsigned long long)(p[i] - '0');
    }
    return v;
}

/* The protocol line at p[0:n] (without its CRLF), split on runs of spaces and tabs; the number of
 * tokens after the command word, or -1 if it has bytes a line may not hold (the other whitespace). */
static int split_line(const char *p, Py_ssize_t n, Py_ssize_t cmd, const char **tok, Py_ssize_t *len) {
    int count = -1;  /* the command word comes first */
    Py_ssize_t i = 0;
    if (n <= cmd || (p[cmd] != ' ' && p[cmd] != '\t')) return -1;
    while (i < n) {
        while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
        if (i == n) return -1;  /* trailing blanks: not a line nats-server writes */
        Py_ssize_t start = i;
        while (i < n && p[i] != ' ' && p[i] != '\t') {
            if (p[i] == '\r' || p[i] == '\n' || p[i] == '\f' || p[i] == '\v') return -1;
            i++;
        }
        if (count >= 0) {
            if (count >= MAX_TOKENS) return -1;
            tok[count] = p + start;
            len[count] = i - start;
        }
        count++;
    }
    return count;
}

static PyObject *read_deliveries(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    PyObject *sids, *cls;
    if (!PyArg_ParseTuple(args, "y*nO!O!", &view, &pos, &PyDict_Type, &sids, &PyType_Type, &cls)) return NULL;
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!PyType_IsSubtype(type, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "cls must be a NamedTuple");
        return NULL;
    }
    const char *buf = view.buf;
    Py_ssize_t end = view.len;
    long long run_sid = -1, nbytes = 0;
    int cut = 0;
    PyObject *items = PyList_New(0), *status = NULL, *result = NULL;
    if (items == NULL) goto done;
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto done;
    }
    while (pos < end && status == NULL) {
        Py_ssize_t cmd;
        if (buf[pos] == 'M') cmd = 3;
        else if (buf[pos] == 'H') cmd = 4;
        else break;
        if (end - pos < cmd || memcmp(buf + pos, cmd == 3 ? "MSG" : "HMSG", cmd) != 0) break;
        const char *nl = memchr(buf + pos, '\n', end - pos);
        if (nl == NULL || nl == buf + pos || nl[-1] != '\r') break;  /* the line has not all arrived */
        Py_ssize_t line = nl - 1 - (buf + pos);
        const char *tok[MAX_TOKENS];
        Py_ssize_t len[MAX_TOKENS];
        int n = split_line(buf + pos, line, cmd, tok, len);
        int has_reply = n == (cmd == 3 ? 4 : 5);
        if (n != (cmd == 3 ? 3 : 4) && !has_reply) break;
        long long sid = number(tok[1], len[1], MAX_DIGITS);
        long long size = number(tok[n - 1], len[n - 1], MAX_DIGITS);
        long long hsize = cmd == 3 ? 0 : number(tok[n - 2], len[n - 2], MAX_DIGITS);
        if (sid < 0 || size < 0 || hsize < 0 || hsize > size) break;
        if (run_sid < 0) {
            PyObject *key = PyLong_FromLongLong(sid);
            if (key == NULL) goto done;
            int known = PyDict_Contains(sids, key);
            Py_DECREF(key);
            if (known < 0) goto done;
            if (!known) break;  /* another subscription's: nats-py's */
            run_sid = sid;
        } else if (sid != run_sid) {
            break;
        }
        Py_ssize_t start = nl + 1 - buf;
        if (end - start < size + 2) {  /* the rest comes with the next read */
            cut = 1;
            break;
        }
        pos = start + size + 2;
        nbytes += size - hsize;
        if (cmd == 4 && hsize == size && hsize >= STATUS_LEN && memcmp(buf + start, STATUS, STATUS_LEN) == 0) {
            const char *s = buf + start + STATUS_LEN, *e = buf + start + hsize;  /* bytes.strip() */
            while (s < e && (*s == ' ' || (*s >= '\t' && *s <= '\r'))) s++;
            while (e > s && (e[-1] == ' ' || (e[-1] >= '\t' && e[-1] <= '\r'))) e--;
            status = PyUnicode_DecodeUTF8(s, e - s, "replace");
            if (status == NULL) goto done;
            break;
        }
        /* A NamedTuple instance is a tuple of the subclass, allocated as the tuple type would be;
         * each field is made only once the previous one was (an exception stops the rest). */
        PyObject *item = type->tp_alloc(type, 5), *subject = NULL, *reply = NULL, *data = NULL, *seq = NULL;
        if (item == NULL || (subject = PyUnicode_DecodeUTF8(tok[0], len[0], NULL)) == NULL ||
            (reply = has_reply ? PyUnicode_DecodeUTF8(tok[2], len[2], NULL) : PyUnicode_New(0, 0)) == NULL ||
            (data = PyBytes_FromStringAndSize(buf + start + hsize, size - hsize)) == NULL ||
            (seq = PyLong_FromUnsignedLongLong(has_reply ? ack_seq(tok[2], len[2]) : 0)) == NULL) {
            Py_XDECREF(subject), Py_XDECREF(reply), Py_XDECREF(data), Py_XDECREF(item);
            goto done;
        }
        PyTuple_SET_ITEM(item, 0, subject);
        PyTuple_SET_ITEM(item, 1, reply);
        PyTuple_SET_ITEM(item, 2, data);
        PyTuple_SET_ITEM(item, 3, seq);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(item, 4, Py_None);
        int failed = PyList_Append(items, item);
        Py_DECREF(item);
        if (failed) goto done;
    }
    result = Py_BuildValue("nLOOLO", pos, run_sid, items, status ? status : Py_None, nbytes,
                           cut ? Py_True : Py_False);
done:
    Py_XDECREF(items);
    Py_XDECREF(status);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *py_ack_seq(PyObject *self, PyObject *arg) {
    Py_ssize_t n;
    const char *r = PyUnicode_AsUTF8AndSize(arg, &n);
    if (r == NULL) return NULL;
    return PyLong_FromUnsignedLongLong(ack_seq(r, n));
}

static PyMethodDef methods[] = {
    {"read", read_deliveries, METH_VARARGS,
     "read(buf, pos, sids, cls) -> (pos, sid, deliveries, status, nbytes, cut): one subscription's deliveries."},
    {"ack_seq", py_ack_seq, METH_O, "ack_seq(reply) -> the stream sequence in a JetStream ack subject, or 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_deliveries", NULL, -1, methods};

PyMODINIT_FUNC PyInit__deliveries(void) { return PyModule_Create(&module); }
