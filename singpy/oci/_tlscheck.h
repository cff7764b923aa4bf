/* singpy.oci._tlscheck's two programs: the interpreter's module (_tlscheck.c: it starts the helper and talks to
 * it) and the helper (_tlscheck_helper.c + _tlscheck_tls.c: OpenSSL, the context and its trust, the exchange).
 * What they share: the messages on the socket pair between them, and the exchange's record (the helper's). */
#ifndef SINGPY_TLSCHECK_H
#define SINGPY_TLSCHECK_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define HELPER_NAME "_tlscheck_helper" /* beside the module's own file */
#define HELPER_CONTROL_FD 3            /* the helper's end of the socket pair */

/* OUT_AGAIN: the connection failed, or the helper could not run: quickhead asks again from the start. */
enum outcome { OUT_OK, OUT_TIMEOUT, OUT_AGAIN, OUT_ERROR, OUT_STOPPED };

/* module -> helper, once: this header (the TCP socket rides along, SCM_RIGHTS), then the five strings back to
 * back (host, request, SSL_CERT_FILE, SSL_CERT_DIR, the certs.d files NUL-joined); later one byte: 'g' (send the
 * request) or 'x' (stop); the end of the stream stops it too. `deadline`: CLOCK_MONOTONIC seconds. */
struct start_message {
    double connect_timeout, read_timeout, deadline;
    uint64_t limit;
    uint32_t sizes[5];
};
#define START_TEXT_MOST (1u << 24) /* each string at most */

/* helper -> module, once, at the end: this header, the message, the answer's head as received. */
struct reply_message {
    int32_t outcome;
    uint32_t message_len;
    uint64_t data_len;
};

static inline double now(void) { /* CLOCK_MONOTONIC seconds: the same clock in both processes */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#ifdef TLSCHECK_HELPER /* the helper's own */
#include <openssl/ssl.h>

typedef struct {
    int fd;      /* the caller's socket (a copy: the helper's) */
    int control; /* the socket pair: 'g', 'x', or its end */
    int go;      /* 'g' read */
    char *host, *cert_file, *cert_dir, *extra_files; /* extra_files: NUL-separated, ends with an empty one */
    char *request;
    size_t request_len, limit;
    double connect_timeout, read_timeout, deadline;
    char message[256];
    char *data;
    size_t data_len;
} Check;

/* A context made as soon as the helper starts (the variables' trust it was started with: cert_file, cert_dir
 * of `why`), before the check it serves is sent: taken if the check's variables are the same. */
typedef struct {
    SSL_CTX *ctx;
    enum outcome outcome;
    Check why; /* why there is no context (its message), and the variables' trust it loaded */
} Prepared;

SSL_CTX *make_context(Check *c);
void prepare(Prepared *prepared);
enum outcome exchange(Check *c, Prepared *ahead);
#endif

#endif
