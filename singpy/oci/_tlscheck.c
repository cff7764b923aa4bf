/* singpy.oci._tlscheck: a cached tag's HEAD request over TLS, in a helper process (issue 31).
 *
 * `singpy exec docker://X:TAG` of a cached image asks the registry one thing (singpy.oci.quickhead). Over
 * TLS, through Python's `_ssl`, the launcher paid ~10 ms of OpenSSL's CPU before it could go on: loading
 * libssl and libcrypto, the first SSL_CTX_new (OpenSSL 3 fetches its algorithms once), the trust store, the
 * handshake (docs/performance.md). Here all of it runs in `_tlscheck_helper` (_tlscheck_helper.c, beside
 * this module's file), on the other core while the launcher imports and prepares; this module links nothing
 * of OpenSSL. The helper's context is the one `_ssl` makes for PROTOCOL_TLS_CLIENT (its options, ciphers and
 * host flags, TLS 1.2 at least: `_tlscheck_helper settings` shows them, tests/unit/test_tlscheck.py compares
 * them with `ssl`'s) and trusts what singpy.oci.tlsconf.quick_context trusts (the rules are repeated in
 * _tlscheck_tls.c: system_trust, env_trust, host_trust). It can be started earlier still (`prepare`, as soon
 * as the command names an image), with the variables' trust: the check takes its context if its own
 * variables are the same.
 *
 * The protocol is quickhead's `_Early`: `start` takes a socket whose connect() is under way, hands it to the
 * helper, which waits for it and does the handshake; the request leaves only after `go` (an image that is not
 * cached is never asked about); `result` waits for the answer's head, as bytes, or raises: TimeoutError (a
 * wait ran out), ConnectionError (the connection failed, or the helper could not run: asked again from the
 * start, through `_ssl`), OSError (anything else: the full client asks and says what is wrong). Every wait is
 * bounded by the caller's limits, the helper's and this module's, and ended by a signal whose Python handler
 * raises (Ctrl-C's KeyboardInterrupt, as in `_ssl`'s waits). A helper is killed and reaped when its
 * answer is read, its check closed or its context released, and at the interpreter's exit: none is left to
 * the container's program as a child it never made.
 */
#define _GNU_SOURCE /* dladdr */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_tlscheck.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define GRACE 1.0 /* seconds past the check's deadline for the helper's answer (its own waits end at it) */

typedef struct {
    pid_t pid;   /* 0: none */
    int control; /* this end of the socket pair, or -1 */
} Helper;

typedef struct check {
    PyObject_HEAD
    Helper helper;
    struct check *next, *prev; /* the checks whose helper still runs (`live`) */
    double deadline;           /* CLOCK_MONOTONIC seconds */
    int answered;              /* the outcome is known: result() says it again */
    enum outcome outcome;
    char message[256];
    char *data;
    size_t data_len, limit;
} Check;

static char helper_path[PATH_MAX]; /* "" where the module's directory has no helper */
static Helper ahead = {0, -1};     /* started by `prepare`, not handed to a check yet */
static Check *live;

static void unlink_live(Check *c) {
    if (c->prev != NULL)
        c->prev->next = c->next;
    else if (live == c)
        live = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->next = c->prev = NULL;
}

/* The helper killed (unless it is gone already: a pid is never signalled once it may be another's) and reaped;
 * bounded, whatever it was doing. */
static void end_helper(Helper *h) {
    if (h->pid > 0) {
        siginfo_t info = {0};
        if (waitid(P_PID, (id_t)h->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0) { /* still ours */
            if (info.si_pid == 0)
                kill(h->pid, SIGKILL);
            while (waitpid(h->pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        h->pid = 0;
    }
    if (h->control >= 0) {
        close(h->control);
        h->control = -1;
    }
}

/* The helper started (`check CERT_FILE CERT_DIR PID`, the socket pair's other end as its fd 3, its standard
 * descriptors on /dev/null, no signal blocked); 0 or an errno. */
static int spawn_helper(const char *cert_file, const char *cert_dir, Helper *out) {
    if (!helper_path[0])
        return ENOENT;
    if (getuid() != geteuid() || getgid() != getegid())
        return EPERM; /* singpy.cli.main refuses to run so; the console script may call `prepare` before it does */
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
        return errno;
    if (pair[0] <= 2 || pair[1] <= 2) { /* a standard descriptor the caller closed (main opens them later) */
        close(pair[0]);
        close(pair[1]);
        return EBADF;
    }
    if (pair[1] == HELPER_CONTROL_FD) { /* a dup2 onto itself would leave its close-on-exec flag */
        int moved = fcntl(pair[1], F_DUPFD_CLOEXEC, HELPER_CONTROL_FD + 1);
        close(pair[1]);
        if (moved < 0) {
            int error = errno;
            close(pair[0]);
            return error;
        }
        pair[1] = moved;
    }
    char parent[24];
    snprintf(parent, sizeof parent, "%ld", (long)getpid());
    char *argv[] = {helper_path, "check", (char *)cert_file, (char *)cert_dir, parent, NULL};
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    sigset_t none;
    sigemptyset(&none);
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pair[1], HELPER_CONTROL_FD);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
    posix_spawn_file_actions_addclosefrom_np(&actions, HELPER_CONTROL_FD + 1); /* nothing else of the launcher's */
#endif
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    pid_t pid = 0;
    int error = posix_spawn(&pid, helper_path, &actions, &attributes, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    close(pair[1]);
    if (error != 0) { /* no child: *out stays none */
        close(pair[0]);
        return error;
    }
    *out = (Helper){pid, pair[0]};
    if (fcntl(pair[0], F_SETFL, O_NONBLOCK) != 0) {
        error = errno;
        end_helper(out);
        return error;
    }
    return 0;
}

/* A signal interrupted a wait: Python's handlers run now, as `_ssl`'s waits run them (Ctrl-C's
 * KeyboardInterrupt ends the wait at once, not at its limit). Called with or without the interpreter's lock.
 * 1 if a handler raised: its exception is left set, for the function that returns to Python. */
static int handler_raised(void) {
    PyGILState_STATE state = PyGILState_Ensure();
    int raised = PyErr_CheckSignals() < 0;
    PyGILState_Release(state);
    return raised;
}

/* Wait until the control socket is ready for `events`, at most until `deadline`: 1; 0 when it ran out; -1
 * when a signal's handler raised (handler_raised). */
static int ready(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - now();
        if (left <= 0)
            return 0;
        struct pollfd one = {fd, events, 0};
        int got = poll(&one, 1, (int)(left < 3600 ? left * 1000 : 3600 * 1000) + 1);
        if (got > 0 || (got < 0 && errno != EINTR))
            return 1; /* ready, or the read or write that follows says what is wrong */
        if (got < 0 && handler_raised()) /* EINTR (errno is the handlers' now) */
            return -1;
    }
}

/* `size` bytes to or from the helper before `deadline`: 1; 0 (the stream ended, an error, out of time); -1
 * (a signal's handler raised). */
static int transfer(int fd, char *buffer, size_t size, double deadline, int sending) {
    while (size > 0) {
        int got = ready(fd, sending ? POLLOUT : POLLIN, deadline);
        if (got <= 0)
            return got;
        ssize_t done = sending ? send(fd, buffer, size, MSG_NOSIGNAL) : read(fd, buffer, size);
        if (done < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (done <= 0)
            return 0;
        buffer += done;
        size -= (size_t)done;
    }
    return 1;
}

static int answer(Check *c, enum outcome outcome, const char *message) {
    c->outcome = outcome;
    snprintf(c->message, sizeof c->message, "%s", message);
    return 0;
}

/* A transfer that did not complete (`got` from `transfer`: 0 or -1): stopped by a signal's handler, or `why`. */
static int cut_short(Check *c, int got, const char *why) {
    return got < 0 ? answer(c, OUT_STOPPED, "interrupted") : answer(c, OUT_AGAIN, why);
}

/* The check sent to its helper: the header with the socket, then the strings. */
static int send_check(Check *c, int fd, const char *fields[5], const Py_ssize_t sizes[5], double connect_timeout,
                      double read_timeout) {
    struct start_message head = {connect_timeout, read_timeout, c->deadline, c->limit, {0}};
    for (int i = 0; i < 5; i++)
        head.sizes[i] = (uint32_t)sizes[i];
    union {
        char space[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct iovec part = {&head, sizeof head};
    struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.space,
                             .msg_controllen = sizeof control.space};
    struct cmsghdr *rights = CMSG_FIRSTHDR(&message);
    rights->cmsg_level = SOL_SOCKET;
    rights->cmsg_type = SCM_RIGHTS;
    rights->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(rights), &fd, sizeof fd);
    ssize_t sent;
    do /* the socket pair's buffer is empty: the header goes whole, or the helper is gone */
        sent = sendmsg(c->helper.control, &message, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof head)
        return answer(c, OUT_AGAIN, "the TLS check's helper is gone");
    for (int i = 0; i < 5; i++) {
        int got = transfer(c->helper.control, (char *)fields[i], (size_t)sizes[i], c->deadline + GRACE, 1);
        if (got <= 0)
            return cut_short(c, got, "the TLS check's helper is gone");
    }
    return 1;
}

/* The helper's answer (reply_message), read into `c`; bounded by the deadline and its grace, ended by a signal
 * whose handler raised (OUT_STOPPED, the exception left set). */
static void read_answer(Check *c) {
    struct reply_message head;
    double deadline = c->deadline + GRACE;
    int got = transfer(c->helper.control, (char *)&head, sizeof head, deadline, 0);
    if (got <= 0) {
        if (got == 0 && now() >= deadline) /* the helper stuck past its own deadline */
            answer(c, OUT_TIMEOUT, "the answer took longer than SINGPY_PULL_DOCUMENT_TIMEOUT");
        else
            cut_short(c, got, "the TLS check's helper ended without an answer");
        return;
    }
    if (head.outcome < OUT_OK || head.outcome > OUT_STOPPED || head.message_len >= sizeof c->message ||
        head.data_len > c->limit + 4096 || (head.data_len && head.outcome != OUT_OK)) {
        answer(c, OUT_AGAIN, "the TLS check's helper answered out of turn");
        return;
    }
    char message[sizeof c->message] = "";
    c->data = head.data_len ? malloc(head.data_len) : NULL;
    if ((head.data_len && c->data == NULL) ||
        (got = transfer(c->helper.control, message, head.message_len, deadline, 0)) <= 0 ||
        (got = transfer(c->helper.control, c->data, head.data_len, deadline, 0)) <= 0) {
        cut_short(c, got, "the TLS check's helper ended without an answer");
        return;
    }
    c->data_len = head.data_len;
    answer(c, (enum outcome)head.outcome, message);
}

/* Done with the check's helper: killed, reaped, off the live list. */
static void finish(Check *c) {
    end_helper(&c->helper);
    unlink_live(c);
}

/* A helper that has answered already (a refused connection) may be gone: its answer is still there to read. */
static PyObject *check_go(Check *c, PyObject *unused) {
    if (!c->answered) {
        ssize_t sent = send(c->helper.control, "g", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)sent;
    }
    Py_RETURN_NONE;
}

static PyObject *check_result(Check *c, PyObject *unused) {
    if (!c->answered) {
        Py_BEGIN_ALLOW_THREADS
        read_answer(c);
        Py_END_ALLOW_THREADS
        c->answered = 1;
        finish(c);
        if (PyErr_Occurred()) /* a signal's handler raised while it waited: its exception, the helper gone */
            return NULL;
    }
    switch (c->outcome) {
    case OUT_OK:
        return PyBytes_FromStringAndSize(c->data ? c->data : "", (Py_ssize_t)c->data_len);
    case OUT_TIMEOUT:
        return PyErr_Format(PyExc_TimeoutError, "%s", c->message);
    case OUT_AGAIN:
        return PyErr_Format(PyExc_ConnectionError, "%s", c->message);
    default:
        return PyErr_Format(PyExc_OSError, "%s", c->message);
    }
}

static PyObject *check_close(Check *c, PyObject *unused) {
    if (!c->answered) {
        c->answered = 1;
        answer(c, OUT_STOPPED, "stopped");
    }
    finish(c);
    Py_RETURN_NONE;
}

static void check_dealloc(Check *c) {
    finish(c);
    free(c->data);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef check_methods[] = {
    {"go", (PyCFunction)check_go, METH_NOARGS, "go(): send the request once the handshake is done."},
    {"result", (PyCFunction)check_result, METH_NOARGS, "result(): the answer's head (bytes), once it came."},
    {"close", (PyCFunction)check_close, METH_NOARGS, "close(): stop the exchange: its helper killed and reaped."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CheckType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "singpy.oci._tlscheck.Check",
    .tp_basicsize = sizeof(Check),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One HEAD request over TLS, made by a helper process (see the module's doc).",
    .tp_dealloc = (destructor)check_dealloc,
    .tp_methods = check_methods,
};

static int text(const char *field, Py_ssize_t size) { return size <= START_TEXT_MOST && strlen(field) == (size_t)size; }

/* start(fd, host, request, cert_file, cert_dir, extra_files, connect_timeout, read_timeout, seconds_left,
 * limit): the check handed to a helper (the one `prepare` started, else a new one) with a copy of socket `fd`
 * (non-blocking, its connect() under way). Strings as bytes; extra_files NUL-joined. */
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
    if (limit <= 0 || limit > START_TEXT_MOST || sizes[1] > START_TEXT_MOST || sizes[4] > START_TEXT_MOST ||
        !text(fields[0], sizes[0]) || !text(fields[2], sizes[2]) || !text(fields[3], sizes[3]))
        return PyErr_Format(PyExc_ValueError, "start: a limit or request out of range, or a name with a NUL");
    Helper helper = ahead;
    ahead = (Helper){0, -1};
    int error = helper.pid ? 0 : spawn_helper(fields[2], fields[3], &helper);
    if (error != 0) {
        errno = error;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Check *c = PyObject_New(Check, &CheckType);
    if (c == NULL) {
        end_helper(&helper);
        return NULL;
    }
    c->helper = helper;
    c->prev = NULL;
    c->next = live;
    if (live != NULL)
        live->prev = c;
    live = c;
    c->deadline = now() + left;
    c->answered = 0;
    c->outcome = OUT_ERROR;
    c->message[0] = '\0';
    c->data = NULL;
    c->data_len = 0;
    c->limit = (size_t)limit;
    if (!send_check(c, fd, fields, sizes, connect_timeout, read_timeout)) {
        c->answered = 1; /* result() says why: asked again from the start */
        finish(c);
        if (PyErr_Occurred()) { /* a signal's handler raised: its exception */
            Py_DECREF(c);
            return NULL;
        }
    }
    return (PyObject *)c;
}

/* prepare(cert_file=b"", cert_dir=b""): the next check's helper started now (see _tlscheck_helper.c), its
 * context made with the system's trust and that of SSL_CERT_FILE and SSL_CERT_DIR as given (the check's own if
 * they are the same, else the helper makes one for the check). Where it can't start, the check starts one. */
static PyObject *tls_prepare(PyObject *module, PyObject *args) {
    const char *file = "", *dir = "";
    Py_ssize_t file_size = 0, dir_size = 0;
    if (!PyArg_ParseTuple(args, "|y#y#:prepare", &file, &file_size, &dir, &dir_size))
        return NULL;
    if (!text(file, file_size) || !text(dir, dir_size))
        return PyErr_Format(PyExc_ValueError, "prepare: a name with a NUL");
    if (ahead.pid == 0)
        spawn_helper(file, dir, &ahead);
    Py_RETURN_NONE;
}

/* release(): the helper `prepare` started and no check took, killed and reaped. */
static PyObject *tls_release(PyObject *module, PyObject *unused) {
    end_helper(&ahead);
    Py_RETURN_NONE;
}

/* pending(): whether a helper started ahead waits for a check (or for `release`). */
static PyObject *tls_pending(PyObject *module, PyObject *unused) { return PyBool_FromLong(ahead.pid != 0); }

/* helper(): the helper program's path, or None where it was not built. */
static PyObject *tls_helper(PyObject *module, PyObject *unused) {
    if (!helper_path[0])
        Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(helper_path);
}

static PyMethodDef methods[] = {
    {"start", tls_start, METH_VARARGS, "start(...): a Check, handed to its helper (see the module's doc)."},
    {"prepare", tls_prepare, METH_VARARGS, "prepare(cert_file, cert_dir): the next check's helper started now."},
    {"release", tls_release, METH_NOARGS, "release(): the helper started ahead and not used, killed and reaped."},
    {"pending", tls_pending, METH_NOARGS, "pending(): whether a helper started ahead waits for a check or release."},
    {"helper", tls_helper, METH_NOARGS, "helper(): the helper program's path, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_tlscheck", "A cached tag's HEAD request over TLS, in a helper (singpy.oci.quickhead).",
    -1, methods,
};

/* At the interpreter's exit (Py_AtExit), every helper still running killed and reaped. */
static void finish_helpers(void) {
    while (live != NULL)
        finish(live);
    end_helper(&ahead);
}

/* In a forked child the helpers are not its children: forgotten (never signalled, never waited for), their
 * control sockets closed in the child only. */
static void forked_child(void) {
    for (Check *c = live; c != NULL; c = c->next) {
        if (c->helper.control >= 0)
            close(c->helper.control);
        c->helper = (Helper){0, -1};
        if (!c->answered) {
            c->answered = 1;
            answer(c, OUT_STOPPED, "stopped");
        }
    }
    live = NULL;
    if (ahead.control >= 0)
        close(ahead.control);
    ahead = (Helper){0, -1};
}

/* The helper's path: beside this module's own file (dladdr), if it is there to run. */
static void find_helper(void) {
    Dl_info info;
    char *slash;
    if (dladdr((void *)find_helper, &info) == 0 || info.dli_fname == NULL ||
        (slash = strrchr(info.dli_fname, '/')) == NULL ||
        (size_t)(slash - info.dli_fname) + sizeof "/" HELPER_NAME > sizeof helper_path)
        return;
    snprintf(helper_path, sizeof helper_path, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, HELPER_NAME);
    if (access(helper_path, X_OK) != 0)
        helper_path[0] = '\0';
}

PyMODINIT_FUNC PyInit__tlscheck(void) {
    if (PyType_Ready(&CheckType) < 0)
        return NULL;
    if (Py_AtExit(finish_helpers) != 0 || pthread_atfork(NULL, NULL, forked_child) != 0)
        return PyErr_Format(PyExc_ImportError, "_tlscheck: can't register its exit and fork handlers");
    find_helper();
    return PyModule_Create(&module);
}
