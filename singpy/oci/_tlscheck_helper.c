/* singpy.oci._tlscheck's helper: a cached tag's HEAD request over TLS, in a process of its own (issue 31).
 *
 *     _tlscheck_helper check CERT_FILE CERT_DIR PARENT_PID    started by _tlscheck.c, the socket pair on fd 3
 *     _tlscheck_helper settings                               its context's settings (tests/unit/test_tlscheck.py)
 *
 * At once it loads OpenSSL and makes its context with the system's trust and that of the variables given (the
 * launcher's SSL_CERT_FILE and SSL_CERT_DIR); then it waits for the check (start_message, the TCP socket with
 * it), does the handshake, sends the request on the launcher's 'g', and answers with what came (reply_message).
 * Why a process and not a thread of the launcher: the same work on a thread slowed the launcher's own imports
 * by ~4 ms (both threads of one address space on a 2-core VM), in a process of its own by ~0.5 ms
 * (docs/performance.md). It dies with the launcher (PR_SET_PDEATHSIG), stops at the end of the socket pair,
 * and takes none of the terminal's signals: the launcher decides, and kills it when it is done with it. */
#define _GNU_SOURCE
#define TLSCHECK_HELPER
#include "_tlscheck.h"

#include <errno.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

/* All `size` bytes read from or written to `fd` (blocking: the module bounds its own waits, and kills this
 * program when it is done with it): 1, or 0 where the stream ended or failed first. */
static int move_all(int fd, void *buffer, size_t size, int writing) {
    for (char *at = buffer; size > 0;) {
        ssize_t done = writing ? write(fd, at, size) : read(fd, at, size);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            return 0;
        at += done;
        size -= (size_t)done;
    }
    return 1;
}

/* The check as the module sends it: 0 where the stream ends first (released) or the message is not one. */
static int receive(Check *c) {
    struct start_message head;
    union {
        char space[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct iovec part = {&head, sizeof head};
    struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = control.space,
                             .msg_controllen = sizeof control.space};
    ssize_t got;
    do
        got = recvmsg(HELPER_CONTROL_FD, &message, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    struct cmsghdr *rights = got > 0 ? CMSG_FIRSTHDR(&message) : NULL;
    if (rights == NULL || message.msg_flags & MSG_CTRUNC || rights->cmsg_level != SOL_SOCKET ||
        rights->cmsg_type != SCM_RIGHTS || rights->cmsg_len != CMSG_LEN(sizeof(int)))
        return 0;
    memcpy(&c->fd, CMSG_DATA(rights), sizeof(int));
    if ((size_t)got < sizeof head && !move_all(HELPER_CONTROL_FD, (char *)&head + got, sizeof head - (size_t)got, 0))
        return 0;
    char **fields[5] = {&c->host, &c->request, &c->cert_file, &c->cert_dir, &c->extra_files};
    for (int i = 0; i < 5; i++) {
        if (head.sizes[i] > START_TEXT_MOST || (*fields[i] = malloc(head.sizes[i] + 2)) == NULL ||
            !move_all(HELPER_CONTROL_FD, *fields[i], head.sizes[i], 0))
            return 0;
        (*fields[i])[head.sizes[i]] = (*fields[i])[head.sizes[i] + 1] = '\0'; /* extra_files ends with an empty one */
    }
    /* Not an empty name, nor one that begins with a dot (OpenSSL would take ".example" for any name under it):
     * `_ssl` accepts neither (its server_hostname rule) */
    if (strlen(c->host) != head.sizes[0] || !c->host[0] || c->host[0] == '.' || head.limit == 0 ||
        head.limit > START_TEXT_MOST)
        return 0;
    c->request_len = head.sizes[1];
    c->limit = head.limit;
    c->connect_timeout = head.connect_timeout;
    c->read_timeout = head.read_timeout;
    c->deadline = head.deadline;
    return (c->data = malloc(c->limit + 4096)) != NULL;
}

static void reply(Check *c, enum outcome out) {
    size_t data_len = out == OUT_OK ? c->data_len : 0;
    struct reply_message head = {.outcome = out, .message_len = (uint32_t)strlen(c->message), .data_len = data_len};
    if (move_all(HELPER_CONTROL_FD, &head, sizeof head, 1) &&
        move_all(HELPER_CONTROL_FD, c->message, head.message_len, 1))
        move_all(HELPER_CONTROL_FD, c->data, data_len, 1);
}

/* What the context is made with, a line each (tests/unit/test_tlscheck.py compares it with `ssl`'s). */
static int settings(void) {
    Check scratch = {.message = ""};
    SSL_CTX *ctx = make_context(&scratch);
    if (ctx == NULL) {
        fprintf(stderr, "%s\n", scratch.message);
        return 1;
    }
    X509_VERIFY_PARAM *param = SSL_CTX_get0_param(ctx);
    printf("options %lu\nminimum_version %ld\nverify_flags %lu\nhostflags %u\nciphers ",
           (unsigned long)SSL_CTX_get_options(ctx), SSL_CTX_get_min_proto_version(ctx),
           (unsigned long)X509_VERIFY_PARAM_get_flags(param), X509_VERIFY_PARAM_get_hostflags(param));
    STACK_OF(SSL_CIPHER) *ciphers = SSL_CTX_get_ciphers(ctx);
    for (int i = 0; i < sk_SSL_CIPHER_num(ciphers); i++)
        printf("%s%s", i ? ":" : "", SSL_CIPHER_get_name(sk_SSL_CIPHER_value(ciphers, i)));
    printf("\n");
    SSL_CTX_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "settings"))
        return settings();
    if (argc != 5 || strcmp(argv[1], "check")) {
        fprintf(stderr, "usage: %s check CERT_FILE CERT_DIR PARENT_PID | settings  (started by singpy)\n", argv[0]);
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)strtol(argv[4], NULL, 10))
        return 1; /* the launcher is gone already */
    const int ignored[] = {SIGINT, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof ignored / sizeof *ignored; i++)
        signal(ignored[i], SIG_IGN);
    Prepared ahead = {.why = {.cert_file = argv[2], .cert_dir = argv[3], .message = ""}};
    prepare(&ahead);
    Check c = {.fd = -1, .control = HELPER_CONTROL_FD, .message = ""};
    if (!receive(&c))
        return 0; /* released: the launcher needs no check */
    reply(&c, exchange(&c, &ahead));
    return 0;
}
