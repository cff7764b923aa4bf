/* singpy.oci._tlscheck: a cached tag's HEAD request over TLS, on a thread of its own (issue 31).
 *
 * `singpy exec docker://X:TAG` of a cached image asks the registry one thing (singpy.oci.quickhead). Over
 * TLS, through Python's `_ssl`, the launcher's one thread paid ~10 ms of OpenSSL's CPU before it could go
 * on: loading libssl and libcrypto, the first SSL_CTX_new (OpenSSL 3 fetches its algorithms once), the
 * trust store, the handshake (docs/performance.md). Here all of it runs on a POSIX thread that never holds
 * the interpreter's lock, on the other core, while the launcher imports and prepares. libssl is loaded by
 * dlopen on that thread (this module links nothing of OpenSSL: importing it costs no library load); the
 * context is the one `_ssl` makes for PROTOCOL_TLS_CLIENT (its options, ciphers and host flags, TLS 1.2 at
 * least: `settings` shows them, tests/unit/test_tlscheck.py compares them with `ssl`'s) and trusts what
 * singpy.oci.tlsconf.quick_context trusts (the rules are repeated in _tlscheck_tls.c: system_trust and
 * env_trust, host_trust). Its context can be begun earlier still (`prepare`, as soon as the command names an
 * image), with the variables' trust: the check takes it if its own variables are the same.
 *
 * The protocol is quickhead's `_Early`: `start` takes a socket whose connect() is under way, the thread
 * waits for it and does the handshake; the request leaves only after `go` (an image that is not cached is
 * never asked about); `result` waits for the answer's head, as bytes, or raises: TimeoutError (a wait ran
 * out), ConnectionError (the connection failed, or libssl could not be loaded: asked again from the start,
 * through `_ssl`), OSError (anything else: the full client asks and says what is wrong). Every wait is a
 * poll() on the socket and a control pipe, bounded by the caller's limits; the thread blocks every signal
 * (the launcher's handlers run on its main thread) and is always joined before its Check goes away: the
 * launch's unshare() needs a process of one thread.
 */
#include "_tlscheck.h"

static Prepared *ahead; /* the one not handed to a check yet: the interpreter thread's */
static Check *live;     /* the checks whose thread has not been joined yet: the interpreter thread's */

static void joined(Check *c) {
    c->running = 0;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        live = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->next = c->prev = NULL;
}

static void join(Check *c) {
    if (!c->running)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_join(c->thread, NULL);
    Py_END_ALLOW_THREADS
    joined(c);
}

static PyObject *check_go(Check *c, PyObject *unused) {
    if (c->running && write(c->control[1], "g", 1) != 1)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *check_result(Check *c, PyObject *unused) {
    join(c);
    switch (c->outcome) {
    case OUT_OK:
        return PyBytes_FromStringAndSize(c->data, (Py_ssize_t)c->data_len);
    case OUT_TIMEOUT:
        return PyErr_Format(PyExc_TimeoutError, "%s", c->message);
    case OUT_AGAIN:
        return PyErr_Format(PyExc_ConnectionError, "%s", c->message);
    default:
        return PyErr_Format(PyExc_OSError, "%s", c->message);
    }
}

/* Tell the thread to stop: its every wait polls the control pipe (which holds one byte at most before). */
static void stop(Check *c) {
    if (c->running) {
        ssize_t written = write(c->control[1], "x", 1);
        (void)written;
    }
}

static PyObject *check_close(Check *c, PyObject *unused) {
    stop(c);
    join(c);
    Py_RETURN_NONE;
}

static void check_dealloc(Check *c) {
    stop(c);
    if (c->running) {
        pthread_join(c->thread, NULL); /* bounded: stopped above, and it never takes the interpreter's lock */
        joined(c);
    }
    for (int i = 0; i < 2; i++)
        if (c->control[i] >= 0)
            close(c->control[i]);
    free(c->host);
    free(c->cert_file);
    free(c->cert_dir);
    free(c->extra_files);
    free(c->request);
    free(c->data);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef check_methods[] = {
    {"go", (PyCFunction)check_go, METH_NOARGS, "go(): send the request once the handshake is done."},
    {"result", (PyCFunction)check_result, METH_NOARGS, "result(): the answer's head (bytes), once it came."},
    {"close", (PyCFunction)check_close, METH_NOARGS, "close(): stop the exchange and wait for its thread."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "singpy.oci._tlscheck.Check",
    .tp_basicsize = sizeof(Check),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One HEAD request over TLS, on its own thread (see the module's doc).",
    .tp_dealloc = (destructor)check_dealloc,
    .tp_methods = check_methods,
};

static char *copy(const char *text, size_t size) {
    char *out = malloc(size + 1);
    if (out != NULL) {
        memcpy(out, text, size);
        out[size] = '\0';
    }
    return out;
}

/* start(fd, host, request, cert_file, cert_dir, extra_files, connect_timeout, read_timeout, seconds_left,
 * limit): the thread started on socket `fd` (non-blocking, its connect() under way; the caller keeps it open
 * until result() or close() returned). Strings as bytes; extra_files NUL-joined. */
static PyObject *tls_start(PyObject *module, PyObject *args) {
    const char *fields[5];
    Py_ssize_t sizes[5];
    int fd;
    double connect_timeout, read_timeout, left;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "iy#y#y#y#y#dddn:start", &fd, &fields[0], &sizes[0], &fields[1], &sizes[1],
                          &fields[2], &sizes[2], &fields[3], &sizes[3], &fields[4], &sizes[4], &connect_timeout,
                          &read_timeout, &left, &limit))
        return NULL;
    if (limit <= 0 || limit > (1 << 24) || sizes[1] > INT_MAX)
        return PyErr_Format(PyExc_ValueError, "start: a limit or request out of range");
    Check *c = PyObject_New(Check, &CheckType);
    if (c == NULL)
        return NULL;
    c->running = c->go = 0;
    c->ahead = NULL;
    c->next = c->prev = NULL;
    c->control[0] = c->control[1] = -1;
    c->fd = fd;
    c->request_len = (size_t)sizes[1];
    c->limit = (size_t)limit;
    c->connect_timeout = connect_timeout;
    c->read_timeout = read_timeout;
    c->deadline = now() + left;
    c->outcome = OUT_ERROR;
    c->message[0] = '\0';
    c->data_len = 0;
    c->host = copy(fields[0], sizes[0]);
    c->request = copy(fields[1], sizes[1]);
    c->cert_file = copy(fields[2], sizes[2]);
    c->cert_dir = copy(fields[3], sizes[3]);
    c->extra_files = malloc(sizes[4] + 2); /* NUL-joined, then an empty one to end the list */
    if (c->extra_files != NULL) {
        memcpy(c->extra_files, fields[4], sizes[4]);
        c->extra_files[sizes[4]] = c->extra_files[sizes[4] + 1] = '\0';
    }
    c->data = malloc(c->limit + 4096);
    if (!c->host || !c->request || !c->cert_file || !c->cert_dir || !c->extra_files || !c->data) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    if (strlen(c->host) != (size_t)sizes[0] || pipe2(c->control, O_CLOEXEC) != 0) {
        Py_DECREF(c);
        return PyErr_Format(PyExc_ValueError, "start: a host with a NUL, or no pipe");
    }
    c->ahead = ahead;
    int error = spawn(&c->thread, run, c);
    if (error != 0) {
        c->ahead = NULL;
        Py_DECREF(c);
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    c->running = 1;
    c->prev = NULL;
    c->next = live;
    if (live != NULL)
        live->prev = c;
    live = c;
    ahead = NULL; /* the check's now */
    return (PyObject *)c;
}

/* prepare(cert_file=b"", cert_dir=b""): a context made ahead, on a thread of its own (see Prepared), for the
 * next check to start: the system's trust and that of SSL_CERT_FILE and SSL_CERT_DIR as given (the check's
 * own if they are the same, else the check makes a context of its own). */
static PyObject *tls_prepare(PyObject *module, PyObject *args) {
    const char *file = "", *dir = "";
    Py_ssize_t file_size = 0, dir_size = 0;
    if (!PyArg_ParseTuple(args, "|y#y#:prepare", &file, &file_size, &dir, &dir_size))
        return NULL;
    if (ahead != NULL)
        Py_RETURN_NONE;
    Prepared *prepared = calloc(1, sizeof *prepared);
    if (prepared == NULL)
        return PyErr_NoMemory();
    prepared->why.cert_file = copy(file, file_size);
    prepared->why.cert_dir = copy(dir, dir_size);
    int error = prepared->why.cert_file && prepared->why.cert_dir ? spawn(&prepared->thread, prepare_run, prepared)
                                                                  : ENOMEM;
    if (error != 0) {
        free(prepared->why.cert_file);
        free(prepared->why.cert_dir);
        free(prepared);
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    ahead = prepared;
    Py_RETURN_NONE;
}

/* release(): the context prepared and not handed to a check, its thread joined and the context freed. */
static PyObject *tls_release(PyObject *module, PyObject *unused) {
    if (ahead == NULL)
        Py_RETURN_NONE;
    Prepared *prepared = ahead;
    ahead = NULL;
    Check scratch;
    enum outcome out;
    SSL_CTX *ctx;
    Py_BEGIN_ALLOW_THREADS
    ctx = take(prepared, &scratch, &out);
    Py_END_ALLOW_THREADS
    if (ctx != NULL)
        ssl_api.SSL_CTX_free(ctx);
    Py_RETURN_NONE;
}

/* pending(): whether a context prepared ahead waits for a check (or for `release`). */
static PyObject *tls_pending(PyObject *module, PyObject *unused) { return PyBool_FromLong(ahead != NULL); }

/* settings(): what the thread's context is made with (for tests/unit/test_tlscheck.py, which compares it with
 * `ssl.SSLContext(PROTOCOL_TLS_CLIENT)`): options, minimum version, verify flags, host flags, cipher names. */
static PyObject *tls_settings(PyObject *module, PyObject *unused) {
    pthread_once(&api_once, load_api);
    if (api_error[0])
        return PyErr_Format(PyExc_OSError, "%s", api_error);
    Check scratch = {.message = ""};
    SSL_CTX *ctx = make_context(&scratch);
    if (ctx == NULL)
        return PyErr_Format(PyExc_OSError, "%s", scratch.message);
    X509_VERIFY_PARAM *param = ssl_api.SSL_CTX_get0_param(ctx);
    const OPENSSL_STACK *ciphers = (const OPENSSL_STACK *)ssl_api.SSL_CTX_get_ciphers(ctx);
    PyObject *names = PyList_New(0);
    for (int i = 0; names != NULL && i < ssl_api.OPENSSL_sk_num(ciphers); i++) {
        PyObject *name = PyUnicode_FromString(ssl_api.SSL_CIPHER_get_name(ssl_api.OPENSSL_sk_value(ciphers, i)));
        if (name == NULL || PyList_Append(names, name) != 0)
            Py_CLEAR(names);
        Py_XDECREF(name);
    }
    PyObject *out = names == NULL ? NULL : Py_BuildValue(
        "{s:k,s:l,s:k,s:I,s:N}", "options", (unsigned long)ssl_api.SSL_CTX_get_options(ctx), "minimum_version",
        ssl_api.SSL_CTX_ctrl(ctx, SSL_CTRL_GET_MIN_PROTO_VERSION, 0, NULL), "verify_flags",
        (unsigned long)ssl_api.X509_VERIFY_PARAM_get_flags(param), "hostflags",
        ssl_api.X509_VERIFY_PARAM_get_hostflags(param), "ciphers", names);
    ssl_api.SSL_CTX_free(ctx);
    return out;
}

static PyMethodDef methods[] = {
    {"start", tls_start, METH_VARARGS, "start(...): a Check, its thread started (see the module's doc)."},
    {"prepare", tls_prepare, METH_VARARGS, "prepare(cert_file, cert_dir): the next check's context begun on a thread."},
    {"release", tls_release, METH_NOARGS, "release(): the context prepared and not used, its thread joined."},
    {"pending", tls_pending, METH_NOARGS, "pending(): whether a prepared context waits for a check or release."},
    {"settings", tls_settings, METH_NOARGS, "settings(): the context's settings, as a dict."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tlscheck", "A cached tag's HEAD request over TLS, on a thread (singpy.oci.quickhead).",
    -1, methods,
};

/* At the interpreter's exit (Py_AtExit: after its objects, before the C library's exit handlers), every
 * thread of this module stopped and joined: OpenSSL's own exit handler frees what a thread still in
 * SSL_CTX_new would use (a run ended by an error right after `prepare` crashed so, now and then). */
static void finish_threads(void) {
    while (live != NULL) {
        Check *c = live;
        stop(c);
        pthread_join(c->thread, NULL);
        joined(c);
    }
    if (ahead != NULL) {
        Check scratch;
        enum outcome out;
        SSL_CTX *ctx = take(ahead, &scratch, &out);
        ahead = NULL;
        if (ctx != NULL)
            ssl_api.SSL_CTX_free(ctx);
    }
}

/* In a forked child the threads are not there (they stay the parent's): nothing to stop, join or free, and
 * the control pipes, shared with the parent's threads, must not be written. */
static void forked_child(void) {
    for (Check *c = live; c != NULL; c = c->next)
        c->running = 0;
    live = NULL;
    ahead = NULL;
}

PyMODINIT_FUNC PyInit__tlscheck(void) {
    if (PyType_Ready(&CheckType) < 0)
        return NULL;
    if (Py_AtExit(finish_threads) != 0 || pthread_atfork(NULL, NULL, forked_child) != 0)
        return PyErr_Format(PyExc_ImportError, "_tlscheck: can't register its exit and fork handlers");
    return PyModule_Create(&module);
}
