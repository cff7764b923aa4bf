/* singpy.oci._tlscheck's two halves: the thread's side (_tlscheck_tls.c: OpenSSL, the context and its trust,
 * the exchange) and the interpreter's (_tlscheck.c: the module, the Check objects). What they share. */
#ifndef SINGPY_TLSCHECK_H
#define SINGPY_TLSCHECK_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)
#define LIBSSL "libssl.so." STRINGIFY(OPENSSL_SHLIB_VERSION) /* the soname _ssl links against */
/* _ssl's own defaults for PROTOCOL_TLS_CLIENT (CPython 3.11): its cipher string, which setup.py reads from the
 * interpreter it builds for (_ssl._DEFAULT_CIPHERS). _ssl sets it on every context unless it is OpenSSL's own
 * default list (a CPython built --with-ssl-default-suites=openssl, as Debian's: the configuration's applies). */
#ifndef PY_CIPHERS
#error "setup.py defines PY_CIPHERS: _ssl._DEFAULT_CIPHERS"
#endif
#ifndef SSL_OP_IGNORE_UNEXPECTED_EOF
#define SSL_OP_IGNORE_UNEXPECTED_EOF 0
#endif
#define OPTIONS                                                                                              \
    ((SSL_OP_ALL & ~SSL_OP_DONT_INSERT_EMPTY_FRAGMENTS) | SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 |                \
     SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_SINGLE_DH_USE | SSL_OP_SINGLE_ECDH_USE | \
     SSL_OP_IGNORE_UNEXPECTED_EOF)
/* The minimum is TLS 1.2 here; _ssl leaves it to OpenSSL's configuration (Debian's: TLS 1.2). */

/* OpenSSL's functions, found by dlsym; each declared with the type its header gives it. */
#define API(X)                                                                                               \
    X(TLS_client_method) X(SSL_CTX_new) X(SSL_CTX_free) X(SSL_CTX_set_options) X(SSL_CTX_set_cipher_list)    \
    X(SSL_CTX_ctrl) X(SSL_CTX_set_verify) X(SSL_CTX_get0_param) X(SSL_CTX_load_verify_locations)              \
    X(SSL_CTX_set_default_verify_paths) X(SSL_new) X(SSL_free) X(SSL_set_fd) X(SSL_ctrl) X(SSL_get0_param)    \
    X(SSL_connect) X(SSL_get_error) X(SSL_write) X(SSL_read) X(SSL_get_verify_result)                         \
    X(SSL_get0_peer_certificate) X(X509_VERIFY_PARAM_set_flags) X(X509_VERIFY_PARAM_set_hostflags)            \
    X(X509_VERIFY_PARAM_set1_host) X(X509_VERIFY_PARAM_set1_ip_asc) X(X509_get_default_cert_file)             \
    X(X509_get_default_cert_dir) X(X509_verify_cert_error_string) X(ERR_get_error) X(ERR_error_string_n)      \
    X(ERR_clear_error) X(SSL_CTX_get_options) X(X509_VERIFY_PARAM_get_flags) X(X509_VERIFY_PARAM_get_hostflags)   \
    X(SSL_CTX_get_ciphers) X(OPENSSL_sk_num) X(OPENSSL_sk_value) X(SSL_CIPHER_get_name)
#define DECLARE(name) __typeof__(&name) name;
struct ssl_api { API(DECLARE) };
extern struct ssl_api ssl_api;
extern pthread_once_t api_once;
extern char api_error[160];
void load_api(void);

/* OUT_AGAIN: the connection failed, or libssl can't be loaded: quickhead asks again from the start. */
enum outcome { OUT_OK, OUT_TIMEOUT, OUT_AGAIN, OUT_ERROR, OUT_STOPPED };

typedef struct check {
    PyObject_HEAD
    pthread_t thread;
    int running;                 /* started and not joined yet: then on the list of live checks */
    struct check *next, *prev;   /* that list (_tlscheck.c: `live`) */
    int fd;                      /* the caller's socket: it stays open until the thread is joined */
    int control[2];              /* the caller writes 'g' (send the request) or 'x' (stop) */
    int go;                      /* the thread read 'g' */
    void *ahead;                 /* a Prepared context handed to it, or NULL: its own is made on its thread */
    char *host, *cert_file, *cert_dir, *extra_files; /* extra_files: NUL-separated, ends with an empty one */
    char *request;
    size_t request_len, limit;
    double connect_timeout, read_timeout, deadline; /* deadline: CLOCK_MONOTONIC seconds */
    enum outcome outcome;
    char message[256];
    char *data;
    size_t data_len;
} Check;

/* A context made ahead, on a thread of its own (`prepare`), from as soon as the command line says that a
 * check over TLS may come: by the time the check starts, the launcher is a few milliseconds further and so
 * is OpenSSL's set-up. Its fields are the preparing thread's until that thread is joined: by the check it is
 * handed to (`start`, which then frees it), else by `release`; but `why`'s cert_file and cert_dir, set before
 * the thread starts and only read by it. */
typedef struct {
    pthread_t thread;
    SSL_CTX *ctx;
    enum outcome outcome;
    Check why; /* why there is no context (its message), and the variables' trust it loads (cert_file, cert_dir) */
} Prepared;

double now(void);
SSL_CTX *make_context(Check *c);
void *prepare_run(void *argument); /* a Prepared's thread */
SSL_CTX *take(Prepared *prepared, Check *c, enum outcome *out);
void *run(void *argument); /* a Check's thread */
int spawn(pthread_t *thread, void *(*function)(void *), void *argument);

#endif
