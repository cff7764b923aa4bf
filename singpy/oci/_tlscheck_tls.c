/* singpy.oci._tlscheck's helper, its TLS: the context made and trusted as `_ssl`'s would be, the exchange
 * driven on the non-blocking socket with every wait bounded (see _tlscheck.c and _tlscheck_helper.c). */
#define _GNU_SOURCE /* strchrnul */
#define TLSCHECK_HELPER
#include "_tlscheck.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

static enum outcome say(Check *c, enum outcome outcome, const char *what) {
    unsigned long code = ERR_get_error();
    char reason[160] = "";
    if (code != 0)
        ERR_error_string_n(code, reason, sizeof reason);
    snprintf(c->message, sizeof c->message, "%s%s%s", what, reason[0] ? ": " : "", reason);
    return outcome;
}

/* Wait until `fd` is ready for `events` (fd < 0: until the caller says go): at most `most` seconds and never
 * past the deadline. The caller's 'g' on the control socket is remembered (c->go); anything else stops. */
static enum outcome wait_for(Check *c, int fd, short events, double most, const char *slow) {
    double started = now();
    for (;;) {
        double left = c->deadline - now(), waited = now() - started;
        if (left <= 0) {
            snprintf(c->message, sizeof c->message, "the answer took longer than SINGPY_PULL_DOCUMENT_TIMEOUT");
            return OUT_TIMEOUT;
        }
        if (waited >= most) {
            snprintf(c->message, sizeof c->message, "%s", slow);
            return OUT_TIMEOUT;
        }
        double wait = left < most - waited ? left : most - waited;
        wait = wait < 3600 ? wait : 3600; /* poll's milliseconds are an int: longer waits are taken in turns */
        struct pollfd fds[2] = {{c->control, c->go ? 0 : POLLIN, 0}, {fd, events, 0}};
        int ready = poll(fds, fd < 0 ? 1 : 2, (int)(wait * 1000) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            return say(c, OUT_ERROR, "poll");
        if (fds[0].revents) {
            char byte = 0;
            if (read(c->control, &byte, 1) != 1 || byte != 'g')
                return snprintf(c->message, sizeof c->message, "stopped"), OUT_STOPPED;
            c->go = 1;
        }
        if (fd < 0 ? c->go : fds[1].revents != 0)
            return OUT_OK;
    }
}

static enum outcome connected(Check *c) {
    enum outcome out = wait_for(c, c->fd, POLLOUT, c->connect_timeout, "the connection timed out");
    if (out != OUT_OK)
        return out;
    int error = 0;
    socklen_t size = sizeof error;
    struct sockaddr_storage peer;
    socklen_t peer_size = sizeof peer;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0 || error != 0 ||
        getpeername(c->fd, (struct sockaddr *)&peer, &peer_size) != 0) { /* ENOTCONN: a connect that failed */
        snprintf(c->message, sizeof c->message, "connect: %s", strerror(error ? error : errno));
        return OUT_AGAIN;
    }
    return OUT_OK;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* singpy.oci.tlsconf.trust(system_dir_only=True) over quicktls.trust_env, in two parts. This one: the system
 * store's hashed directory, else its bundle file, else OpenSSL's defaults. */
static int system_trust(Check *c, SSL_CTX *ctx) {
    const char *system_file = X509_get_default_cert_file();
    const char *system_dir = X509_get_default_cert_dir();
    int have_file = is_file(system_file), have_dir = is_dir(system_dir);
    if (have_file || have_dir) {
        if (!SSL_CTX_load_verify_locations(ctx, have_dir ? NULL : system_file, have_dir ? system_dir : NULL))
            return say(c, OUT_ERROR, "the system's CA certificates"), 0;
    } else if (!SSL_CTX_set_default_verify_paths(ctx)) {
        return say(c, OUT_ERROR, "OpenSSL's default CA certificates"), 0;
    }
    return 1;
}

/* And this one: SSL_CERT_FILE unless it is the system's bundle (its directory, loaded above, holds the same),
 * every directory of SSL_CERT_DIR (c's copies of them: a prepared context loads them ahead too), then the
 * registry's certs.d files (host_trust). A file that can't be loaded: an error. */
static int env_trust(Check *c, SSL_CTX *ctx) {
    if (c->cert_file[0]) {
        char mine[PATH_MAX], system[PATH_MAX];
        int same = is_dir(X509_get_default_cert_dir()) && realpath(c->cert_file, mine) &&
                   realpath(X509_get_default_cert_file(), system) && !strcmp(mine, system);
        if (!same && !SSL_CTX_load_verify_locations(ctx, c->cert_file, NULL))
            return say(c, OUT_ERROR, "SSL_CERT_FILE"), 0;
    }
    /* Colon-separated; an entry that is not a directory is skipped. Each is copied out: the string is never
     * written (a prepared context's is compared whole with the check's: exchange). */
    for (const char *dir = c->cert_dir; *dir;) {
        const char *end = strchrnul(dir, ':');
        char one[PATH_MAX] = ""; /* one too long for a path is no directory: skipped */
        if (end - dir < (ptrdiff_t)sizeof one) {
            memcpy(one, dir, (size_t)(end - dir));
            one[end - dir] = '\0';
        }
        if (one[0] && is_dir(one) && !SSL_CTX_load_verify_locations(ctx, NULL, one))
            return say(c, OUT_ERROR, "SSL_CERT_DIR"), 0;
        dir = *end ? end + 1 : end;
    }
    return 1;
}

static int host_trust(Check *c, SSL_CTX *ctx) {
    for (char *file = c->extra_files; *file; file += strlen(file) + 1)
        if (!SSL_CTX_load_verify_locations(ctx, file, NULL))
            return say(c, OUT_ERROR, "a certs.d file"), 0;
    return 1;
}

SSL_CTX *make_context(Check *c) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return say(c, OUT_ERROR, "SSL_CTX_new"), NULL;
    SSL_CTX_set_options(ctx, OPTIONS);
    X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
    if ((strcmp(PY_CIPHERS, SSL_DEFAULT_CIPHER_LIST) != 0 && !SSL_CTX_set_cipher_list(ctx, PY_CIPHERS)) ||
        !SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL) ||
        !X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_TRUSTED_FIRST)) {
        SSL_CTX_free(ctx);
        return say(c, OUT_ERROR, "the TLS context"), NULL;
    }
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL); /* CERT_REQUIRED */
    return ctx;
}

/* One TLS call driven to completion on the non-blocking socket: `step` returns what SSL_connect, SSL_write
 * or SSL_read return; its wants are waited for, `most` seconds for the whole call, as `_ssl` bounds one call
 * (a peer that sends its handshake a few bytes at a time does not get `most` again for each). *done is that
 * call's positive result, 0 for a clean end. */
static enum outcome drive(Check *c, SSL *ssl, int (*step)(Check *, SSL *), double most, const char *slow, int *done) {
    double until = now() + most;
    for (;;) {
        ERR_clear_error();
        int result = step(c, ssl);
        if (result > 0) {
            *done = result;
            return OUT_OK;
        }
        int error = SSL_get_error(ssl, result);
        enum outcome out;
        if (error == SSL_ERROR_WANT_READ)
            out = wait_for(c, c->fd, POLLIN, until - now(), slow);
        else if (error == SSL_ERROR_WANT_WRITE)
            out = wait_for(c, c->fd, POLLOUT, until - now(), slow);
        else if (error == SSL_ERROR_ZERO_RETURN) {
            *done = 0;
            return OUT_OK;
        } else {
            long verified = SSL_get_verify_result(ssl);
            if (verified != X509_V_OK)
                return snprintf(c->message, sizeof c->message, "certificate verify failed: %s",
                                X509_verify_cert_error_string(verified)), OUT_ERROR;
            return say(c, OUT_ERROR, error == SSL_ERROR_SYSCALL ? "TLS: the connection ended" : "TLS");
        }
        if (out != OUT_OK)
            return out;
    }
}

static int handshake_step(Check *c, SSL *ssl) { return SSL_connect(ssl); }

static int write_step(Check *c, SSL *ssl) { return SSL_write(ssl, c->request, (int)c->request_len); }

static int read_step(Check *c, SSL *ssl) {
    return SSL_read(ssl, c->data + c->data_len, (int)(c->limit + 4096 - c->data_len));
}

/* The request once the caller says go; then the answer until the end of its head, its end, or past the
 * limit: quickhead reads what came (a head cut short, or too long, is the full client's). */
static enum outcome ask(Check *c, SSL *ssl) {
    enum outcome out = c->go ? OUT_OK : wait_for(c, -1, 0, 1e9, ""); /* a go may have come already */
    int done = 0;
    if (out == OUT_OK)
        out = drive(c, ssl, write_step, c->read_timeout, "no data within the read timeout", &done);
    while (out == OUT_OK && !memmem(c->data, c->data_len, "\r\n\r\n", 4) && c->data_len <= c->limit) {
        out = drive(c, ssl, read_step, c->read_timeout, "no data within the read timeout", &done);
        if (out != OUT_OK || done == 0)
            break;
        c->data_len += (size_t)done;
    }
    return out;
}

/* The context with the system's trust; NULL, *out saying why, where it can't be. */
static SSL_CTX *system_context(Check *c, enum outcome *out) {
    *out = OUT_ERROR;
    SSL_CTX *ctx = make_context(c);
    if (ctx != NULL && !system_trust(c, ctx)) {
        SSL_CTX_free(ctx);
        ctx = NULL;
    }
    return ctx;
}

/* The context made ahead: the system's trust and the variables' (SSL_CERT_FILE, SSL_CERT_DIR as the helper was
 * started with, in prepared->why). */
void prepare(Prepared *prepared) {
    SSL_CTX *ctx = system_context(&prepared->why, &prepared->outcome);
    if (ctx != NULL && !env_trust(&prepared->why, ctx)) {
        SSL_CTX_free(ctx);
        ctx = NULL;
    }
    prepared->ctx = ctx;
}

static int same_text(const char *one, const char *other) { return one && other && !strcmp(one, other); }

/* The exchange of check `c`, with the context made ahead if its variables are the check's (`ahead`'s context
 * is taken: freed here, used or not). */
enum outcome exchange(Check *c, Prepared *ahead) {
    enum outcome out;
    SSL_CTX *ctx;
    /* the variables' trust loaded already: a prepared context made from the same ones */
    int env_trusted = same_text(ahead->why.cert_file, c->cert_file) && same_text(ahead->why.cert_dir, c->cert_dir);
    ctx = ahead->ctx;
    out = ahead->outcome;
    snprintf(c->message, sizeof c->message, "%s", ahead->why.message);
    ahead->ctx = NULL;
    if (!env_trusted) { /* made for other variables: it may trust what this check must not */
        if (ctx != NULL)
            SSL_CTX_free(ctx);
        ctx = system_context(c, &out);
    }
    if (ctx == NULL)
        return out;
    SSL *ssl = NULL;
    out = OUT_ERROR;
    if (!(env_trusted || env_trust(c, ctx)) || !host_trust(c, ctx) || (out = connected(c)) != OUT_OK)
        goto end;
    out = OUT_ERROR;
    if ((ssl = SSL_new(ctx)) == NULL || !SSL_set_fd(ssl, c->fd)) {
        say(c, OUT_ERROR, "SSL_new");
        goto end;
    }
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (X509_VERIFY_PARAM_set1_ip_asc(param, c->host) != 1) { /* a name, not an address: _ssl's way */
        ERR_clear_error();
        if (!SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, c->host) ||
            !X509_VERIFY_PARAM_set1_host(param, c->host, 0)) {
            say(c, OUT_ERROR, "the host name");
            goto end;
        }
    }
    int done = 0;
    out = drive(c, ssl, handshake_step, c->connect_timeout, "the connection timed out", &done);
    if (out == OUT_OK && (done == 0 || SSL_get_verify_result(ssl) != X509_V_OK ||
                          SSL_get0_peer_certificate(ssl) == NULL)) {
        snprintf(c->message, sizeof c->message, "the handshake ended unverified");
        out = OUT_ERROR;
    }
    if (out == OUT_OK)
        out = ask(c, ssl);
end:
    if (ssl != NULL)
        SSL_free(ssl); /* the socket stays the caller's: SSL_set_fd's BIO does not close it */
    SSL_CTX_free(ctx);
    return out;
}
