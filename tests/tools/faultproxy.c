/*
 * faultproxy: a TCP proxy between NATS clients and a nats-server that injects
 * the faults the tests need (lost PubAcks, stalls, cuts), so that "the ack was
 * lost but the message was stored" can be produced on demand against a real
 * server. Single-threaded, poll(2), plain POSIX sockets.
 *
 *   faultproxy --listen 127.0.0.1:0 --upstream 127.0.0.1:PORT
 *              [--mode MODE] [--control-file PATH]
 *
 * On start it prints two lines on stdout and flushes:
 *   PORT=NNNN       the port clients connect to
 *   CONTROL=NNNN    the control port (127.0.0.1)
 *
 * MODE (at start, or switched at run time):
 *   pass               forward bytes unchanged both ways
 *   drop-first-puback  drop the next server->client message that is a
 *                      JetStream PubAck (payload starts with {"stream": and
 *                      contains "seq":), then revert to pass
 *   withhold-acks      drop every PubAck
 *   cut-after N        forward N more server->client bytes, then close every
 *                      connection (both sides) and revert to pass
 *   pause              stop forwarding both ways; bytes wait in the buffers
 *                      and sockets until another mode is set
 *   cut                close every connection now, then pass
 *
 * Control, either way:
 *   - a TCP line protocol on the control port: send "mode MODE\n", "cut\n" or
 *     "stats\n"; each gets one reply line "OK ..." or "ERR ...". "stats"
 *     answers "OK mode=M conns=ACTIVE accepted=N dropped_acks=N c2s=BYTES
 *     s2c=BYTES".
 *   - --control-file PATH: when the file's mtime or size changes, its first
 *     line is applied as a control command (same syntax as above).
 *
 * Server->client bytes are parsed by NATS framing (control lines; MSG subj sid
 * [reply] size and HMSG subj sid [reply] hdr_size total_size, each followed by
 * the payload and CRLF) across partial reads, and forwarded byte-for-byte
 * unless a frame is dropped. A connection whose INFO says tls_required, or
 * whose stream does not parse as NATS, is forwarded raw. Client->server bytes
 * are never altered. Only counts and mode changes are logged (stderr); never
 * payloads, subjects or credentials.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS     512
#define MAX_CTRL      16
#define READ_CHUNK    65536
#define HIGH_WATER    (8u << 20)  /* stop reading a side whose peer lags this much */
#define MAX_FRAME     (64u << 20) /* a MSG larger than this is not NATS: go raw */
#define MAX_CTRL_LINE 65536u      /* a control line longer than this: go raw */

typedef enum { M_PASS, M_DROP_FIRST, M_WITHHOLD, M_CUT_AFTER, M_PAUSE } mode_t_;

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

typedef struct conn {
    int cfd, ufd;
    buf to_up;     /* client -> server, pending write */
    buf to_client; /* server -> client, pending write */
    buf s2c_in;    /* server -> client, not yet framed */
    bool raw;      /* forward server bytes unparsed */
    bool seen_info;
    bool closing; /* flush to_client, then close */
} conn;

typedef struct ctrl {
    int fd;
    buf in;
} ctrl;

static conn *conns[MAX_CONNS];
static ctrl ctrls[MAX_CTRL];
static mode_t_ mode = M_PASS;
static uint64_t cut_budget;
static uint64_t n_accepted, n_dropped_acks, n_c2s, n_s2c;
static struct sockaddr_in upstream;
static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static const char *mode_name(void)
{
    switch (mode) {
    case M_PASS:
        return "pass";
    case M_DROP_FIRST:
        return "drop-first-puback";
    case M_WITHHOLD:
        return "withhold-acks";
    case M_CUT_AFTER:
        return "cut-after";
    case M_PAUSE:
        return "pause";
    }
    return "?";
}

static int buf_add(buf *b, const char *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np)
            return -1;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static void buf_consume(buf *b, size_t n)
{
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

static void buf_free(buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static int parse_hostport(const char *s, struct sockaddr_in *a)
{
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof(host))
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || *end || port < 0 || port > 65535)
        return -1;
    memset(a, 0, sizeof(*a));
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost"))
        snprintf(host, sizeof(host), "127.0.0.1");
    return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int listen_on(struct sockaddr_in *a)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t len = sizeof(*a);
    if (bind(fd, (struct sockaddr *)a, sizeof(*a)) != 0 || listen(fd, 256) != 0 ||
        getsockname(fd, (struct sockaddr *)a, &len) != 0 || set_nonblock(fd) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void conn_close(int i)
{
    conn *c = conns[i];
    if (!c)
        return;
    close(c->cfd);
    close(c->ufd);
    buf_free(&c->to_up);
    buf_free(&c->to_client);
    buf_free(&c->s2c_in);
    free(c);
    conns[i] = NULL;
}

static int flush_to(int fd, buf *b, uint64_t *count);

/* Close every connection (flushing what is already due to the clients when
 * `flush`), then pass. */
static void cut_all(const char *why, bool flush)
{
    int n = 0;
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i]) {
            if (flush)
                flush_to(conns[i]->cfd, &conns[i]->to_client, NULL);
            conn_close(i);
            n++;
        }
    mode = M_PASS;
    fprintf(stderr, "faultproxy: %s: closed %d connection(s); mode pass\n", why, n);
}

/* Queue server bytes for the client, honouring a cut-after budget. Returns
 * true when the budget ran out (the caller cuts everything). */
static bool forward_s2c(conn *c, const char *p, size_t n)
{
    bool out = false;
    if (mode == M_CUT_AFTER) {
        if (n >= cut_budget) {
            n = (size_t)cut_budget;
            out = true;
        }
        cut_budget -= n;
    }
    buf_add(&c->to_client, p, n);
    n_s2c += n;
    return out;
}

static bool is_puback(const char *payload, size_t n)
{
    static const char head[] = "{\"stream\":";
    if (n < sizeof(head) - 1 || memcmp(payload, head, sizeof(head) - 1) != 0)
        return false;
    return memmem(payload, n, "\"seq\":", 6) != NULL;
}

/* Split line in place on blanks into at most max tokens; the count, or
 * max + 1 when there are more. */
static int tokens(char *line, char **tok, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            *p++ = '\0';
        if (!*p)
            return n;
        if (n == max)
            return max + 1;
        tok[n++] = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
    }
}

static bool parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || end == s || v > MAX_FRAME)
        return false;
    *out = (size_t)v;
    return true;
}

/* Frame what the server sent and queue it for the client, dropping PubAcks
 * as the mode says. Returns true if a cut-after budget ran out. */
static bool process_s2c(conn *c)
{
    size_t pos = 0;
    bool cut = false;
    buf *in = &c->s2c_in;
    while (pos < in->len && !cut && mode != M_PAUSE) {
        if (c->raw) {
            cut = forward_s2c(c, in->p + pos, in->len - pos);
            pos = in->len;
            break;
        }
        char *start = in->p + pos;
        size_t avail = in->len - pos;
        char *crlf = memmem(start, avail, "\r\n", 2);
        if (!crlf) {
            if (avail > MAX_CTRL_LINE)
                c->raw = true; /* not NATS framing */
            break;
        }
        size_t linelen = (size_t)(crlf - start);
        size_t frame = linelen + 2;
        bool msg = linelen > 4 && !memcmp(start, "MSG ", 4);
        bool hmsg = linelen > 5 && !memcmp(start, "HMSG ", 5);
        bool drop = false;
        if (msg || hmsg) {
            char line[1024], *tok[8];
            size_t hdr = 0, total = 0;
            if (linelen >= sizeof(line)) {
                c->raw = true;
                continue;
            }
            memcpy(line, start, linelen);
            line[linelen] = '\0';
            int nt = tokens(line, tok, 8);
            bool ok;
            if (msg)
                ok = (nt == 4 || nt == 5) && parse_size(tok[nt - 1], &total);
            else
                ok = (nt == 5 || nt == 6) && parse_size(tok[nt - 2], &hdr) &&
                     parse_size(tok[nt - 1], &total) && hdr <= total;
            if (!ok) {
                c->raw = true;
                continue;
            }
            if (avail < frame + total + 2)
                break; /* wait for the rest of the payload */
            frame += total + 2;
            if ((mode == M_DROP_FIRST || mode == M_WITHHOLD) &&
                is_puback(start + linelen + 2 + hdr, total - hdr)) {
                drop = true;
                n_dropped_acks++;
                fprintf(stderr, "faultproxy: dropped PubAck #%llu\n",
                        (unsigned long long)n_dropped_acks);
                if (mode == M_DROP_FIRST) {
                    mode = M_PASS;
                    fprintf(stderr, "faultproxy: mode pass\n");
                }
            }
        } else if (!c->seen_info && linelen >= 5 && !memcmp(start, "INFO ", 5)) {
            c->seen_info = true;
            if (memmem(start, linelen, "\"tls_required\":true", 19))
                c->raw = true; /* everything after this INFO is TLS */
        }
        if (!drop)
            cut = forward_s2c(c, start, frame);
        pos += frame;
    }
    buf_consume(in, pos);
    return cut;
}

static int set_mode(const char *arg, char *reply, size_t cap)
{
    char copy[128], *tok[4];
    snprintf(copy, sizeof(copy), "%s", arg);
    int nt = tokens(copy, tok, 4);
    if (nt < 1) {
        snprintf(reply, cap, "ERR empty mode");
        return -1;
    }
    mode_t_ old = mode;
    if (!strcmp(tok[0], "pass") && nt == 1)
        mode = M_PASS;
    else if (!strcmp(tok[0], "drop-first-puback") && nt == 1)
        mode = M_DROP_FIRST;
    else if (!strcmp(tok[0], "withhold-acks") && nt == 1)
        mode = M_WITHHOLD;
    else if (!strcmp(tok[0], "pause") && nt == 1)
        mode = M_PAUSE;
    else if (!strcmp(tok[0], "cut") && nt == 1) {
        cut_all("cut", false);
        snprintf(reply, cap, "OK mode=pass");
        return 0;
    } else if (!strcmp(tok[0], "cut-after") && nt == 2) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(tok[1], &end, 10);
        if (errno || *end || end == tok[1]) {
            snprintf(reply, cap, "ERR cut-after needs a byte count");
            return -1;
        }
        mode = M_CUT_AFTER;
        cut_budget = v;
    } else {
        snprintf(reply, cap,
                 "ERR unknown mode (pass|drop-first-puback|withhold-acks|cut-after "
                 "N|pause|cut)");
        return -1;
    }
    if (old != mode || mode == M_CUT_AFTER)
        fprintf(stderr, "faultproxy: mode %s\n", mode_name());
    snprintf(reply, cap, "OK mode=%s", mode_name());
    return 0;
}

static void command(const char *line, char *reply, size_t cap)
{
    while (*line == ' ' || *line == '\t')
        line++;
    if (!strncmp(line, "mode ", 5)) {
        set_mode(line + 5, reply, cap);
    } else if (!strcmp(line, "cut")) {
        set_mode("cut", reply, cap);
    } else if (!strcmp(line, "stats")) {
        int active = 0;
        for (int i = 0; i < MAX_CONNS; i++)
            active += conns[i] != NULL;
        snprintf(
            reply, cap, "OK mode=%s conns=%d accepted=%llu dropped_acks=%llu c2s=%llu s2c=%llu",
            mode_name(), active, (unsigned long long)n_accepted, (unsigned long long)n_dropped_acks,
            (unsigned long long)n_c2s, (unsigned long long)n_s2c);
    } else {
        snprintf(reply, cap, "ERR unknown command (mode MODE | cut | stats)");
    }
}

static void accept_client(int lfd)
{
    for (;;) {
        int cfd = accept(lfd, NULL, NULL);
        if (cfd < 0)
            return;
        int slot = -1;
        for (int i = 0; i < MAX_CONNS && slot < 0; i++)
            if (!conns[i])
                slot = i;
        int ufd = socket(AF_INET, SOCK_STREAM, 0);
        if (slot < 0 || ufd < 0 ||
            connect(ufd, (struct sockaddr *)&upstream, sizeof(upstream)) != 0) {
            if (slot < 0)
                fprintf(stderr, "faultproxy: too many connections; refusing one\n");
            close(cfd);
            if (ufd >= 0)
                close(ufd);
            continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        setsockopt(ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        set_nonblock(cfd);
        set_nonblock(ufd);
        conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(cfd);
            close(ufd);
            continue;
        }
        c->cfd = cfd;
        c->ufd = ufd;
        conns[slot] = c;
        n_accepted++;
    }
}

static void accept_ctrl(int cfd_listen)
{
    int fd = accept(cfd_listen, NULL, NULL);
    if (fd < 0)
        return;
    for (int i = 0; i < MAX_CTRL; i++)
        if (ctrls[i].fd < 0) {
            set_nonblock(fd);
            ctrls[i].fd = fd;
            return;
        }
    close(fd);
}

static void ctrl_read(ctrl *k)
{
    char tmp[1024];
    ssize_t n = read(k->fd, tmp, sizeof(tmp));
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(k->fd);
        k->fd = -1;
        buf_free(&k->in);
        return;
    }
    if (n < 0)
        return;
    buf_add(&k->in, tmp, (size_t)n);
    char *nl;
    while (k->fd >= 0 && (nl = memchr(k->in.p, '\n', k->in.len))) {
        char line[256], reply[256];
        size_t len = (size_t)(nl - k->in.p);
        if (len >= sizeof(line))
            len = sizeof(line) - 1;
        memcpy(line, k->in.p, len);
        line[len] = '\0';
        if (len && line[len - 1] == '\r')
            line[len - 1] = '\0';
        buf_consume(&k->in, (size_t)(nl - k->in.p) + 1);
        command(line, reply, sizeof(reply));
        size_t rl = strlen(reply);
        reply[rl++] = '\n';
        /* replies are short: a blocking-enough write on loopback */
        if (write(k->fd, reply, rl) != (ssize_t)rl) {
            close(k->fd);
            k->fd = -1;
            buf_free(&k->in);
        }
    }
    if (k->fd >= 0 && k->in.len > 4096) {
        close(k->fd);
        k->fd = -1;
        buf_free(&k->in);
    }
}

static void check_control_file(const char *path, struct timespec *mtime, off_t *size)
{
    struct stat st;
    if (!path || stat(path, &st) != 0)
        return;
    if (st.st_mtim.tv_sec == mtime->tv_sec && st.st_mtim.tv_nsec == mtime->tv_nsec &&
        st.st_size == *size)
        return;
    *mtime = st.st_mtim;
    *size = st.st_size;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[256], reply[256];
    if (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0]) {
            command(line, reply, sizeof(reply));
            fprintf(stderr, "faultproxy: control file: %s\n", reply);
        }
    }
    fclose(f);
}

/* Write as much of b as fd takes. -1 on a dead socket. */
static int flush_to(int fd, buf *b, uint64_t *count)
{
    while (b->len) {
        ssize_t n = write(fd, b->p, b->len);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return -1;
        }
        buf_consume(b, (size_t)n);
        if (count)
            *count += (uint64_t)n;
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: faultproxy --listen HOST:PORT --upstream HOST:PORT [--mode MODE] "
                    "[--control-file PATH]\n");
}

int main(int argc, char **argv)
{
    const char *listen_s = "127.0.0.1:0", *upstream_s = NULL, *mode_s = "pass", *cfile = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--listen"))
            listen_s = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--upstream"))
            upstream_s = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--mode"))
            mode_s = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--control-file"))
            cfile = argv[++i];
        else {
            usage();
            return 2;
        }
    }
    struct sockaddr_in la, ca;
    if (!upstream_s || parse_hostport(upstream_s, &upstream) != 0 ||
        parse_hostport(listen_s, &la) != 0) {
        usage();
        return 2;
    }
    char reply[256];
    if (set_mode(mode_s, reply, sizeof(reply)) != 0) {
        fprintf(stderr, "faultproxy: %s\n", reply);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int lfd = listen_on(&la);
    memset(&ca, 0, sizeof(ca));
    ca.sin_family = AF_INET;
    ca.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int cfd = listen_on(&ca);
    if (lfd < 0 || cfd < 0) {
        fprintf(stderr, "faultproxy: cannot listen on %s: %s\n", listen_s, strerror(errno));
        return 1;
    }
    for (int i = 0; i < MAX_CTRL; i++)
        ctrls[i].fd = -1;
    printf("PORT=%d\nCONTROL=%d\n", ntohs(la.sin_port), ntohs(ca.sin_port));
    fflush(stdout);
    fprintf(stderr, "faultproxy: listening on port %d, mode %s\n", ntohs(la.sin_port), mode_name());

    struct timespec cmtime = {0, 0};
    off_t csize = -1;
    static struct pollfd pfd[2 + MAX_CTRL + 2 * MAX_CONNS];
    static int owner[2 + MAX_CTRL + 2 * MAX_CONNS]; /* conn slot, or -1 */
    char chunk[READ_CHUNK];

    while (!stop_flag) {
        int n = 0;
        pfd[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
        owner[n++] = -1;
        pfd[n] = (struct pollfd){.fd = cfd, .events = POLLIN};
        owner[n++] = -1;
        for (int i = 0; i < MAX_CTRL; i++)
            if (ctrls[i].fd >= 0) {
                pfd[n] = (struct pollfd){.fd = ctrls[i].fd, .events = POLLIN};
                owner[n++] = -2 - i;
            }
        bool paused = mode == M_PAUSE;
        for (int i = 0; i < MAX_CONNS; i++) {
            conn *c = conns[i];
            if (!c)
                continue;
            short ce = 0, ue = 0;
            if (!paused) {
                if (c->to_up.len < HIGH_WATER && !c->closing)
                    ce |= POLLIN;
                if (c->to_client.len + c->s2c_in.len < HIGH_WATER && !c->closing)
                    ue |= POLLIN;
                if (c->to_client.len)
                    ce |= POLLOUT;
                if (c->to_up.len)
                    ue |= POLLOUT;
            }
            pfd[n] = (struct pollfd){.fd = c->cfd, .events = ce};
            owner[n++] = i;
            pfd[n] = (struct pollfd){.fd = c->ufd, .events = ue};
            owner[n++] = i;
        }
        int pr = poll(pfd, (nfds_t)n, cfile ? 20 : 200);
        if (pr < 0 && errno != EINTR)
            break;
        check_control_file(cfile, &cmtime, &csize);
        if (pr <= 0)
            continue;
        if (pfd[0].revents & POLLIN)
            accept_client(lfd);
        if (pfd[1].revents & POLLIN)
            accept_ctrl(cfd);
        for (int k = 2; k < n; k++) {
            if (!pfd[k].revents)
                continue;
            if (owner[k] <= -2) {
                ctrl_read(&ctrls[-2 - owner[k]]);
                continue;
            }
            int i = owner[k];
            conn *c = conns[i];
            if (!c || mode == M_PAUSE)
                continue; /* closed by an earlier event or a cut; or paused */
            bool client_side = pfd[k].fd == c->cfd;
            bool dead = false, cut = false;
            if (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t got = read(pfd[k].fd, chunk, sizeof(chunk));
                if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
                    dead = true;
                } else if (got > 0 && client_side) {
                    buf_add(&c->to_up, chunk, (size_t)got);
                } else if (got > 0) {
                    buf_add(&c->s2c_in, chunk, (size_t)got);
                    cut = process_s2c(c);
                }
            }
            if (!dead && c->to_up.len && flush_to(c->ufd, &c->to_up, &n_c2s) != 0)
                dead = true;
            if (!dead && c->to_client.len && flush_to(c->cfd, &c->to_client, NULL) != 0)
                dead = true;
            if (cut) {
                cut_all("cut-after budget spent", true);
                break; /* the pollfd table is stale */
            }
            if (dead) {
                /* hand over what the other side still has, then close both */
                flush_to(c->ufd, &c->to_up, &n_c2s);
                flush_to(c->cfd, &c->to_client, NULL);
                conn_close(i);
            }
        }
        /* a mode switch may have released frames held back while paused */
        if (mode != M_PAUSE) {
            for (int i = 0; i < MAX_CONNS; i++) {
                conn *c = conns[i];
                if (c && c->s2c_in.len && process_s2c(c)) {
                    cut_all("cut-after budget spent", true);
                    break;
                }
            }
        }
    }
    int active = 0;
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i]) {
            conn_close(i);
            active++;
        }
    fprintf(stderr,
            "faultproxy: exit; accepted %llu, closed %d open, dropped %llu "
            "PubAck(s)\n",
            (unsigned long long)n_accepted, active, (unsigned long long)n_dropped_acks);
    close(lfd);
    close(cfd);
    return 0;
}
