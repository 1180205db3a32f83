/*
 * libFuzzer target for the connection profile's checks before any network
 * (src/conn.c: jsd__conn_opts_check, the same checks jsd_conn_open makes first:
 * the server URL list, the authentication choice, the ranges). The URL list
 * is outside text (flags, environment, configuration files) and may carry
 * credentials, so besides never crashing or leaking memory:
 * - the error text is NUL-terminated inside JSD_ERRMSG_MAX;
 * - the password and token never appear in it;
 * - nothing of a URL's user-info ("nats://user:PASSWORD@host", also when the
 *   scheme is missing or wrong) reaches it: changing the user-info must not
 *   change the text.
 *
 * Input: up to four fields separated by 0x00 bytes: servers, token, user,
 * password (a missing field is NULL). Built and run by `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "jsd_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A secret may legitimately show when it also stands in the text outside any
 * user-info (as a host name, say), when it is too short to be searched for
 * (scrub_secret leaves secrets under three bytes), or holds the '*' of the
 * replacement. */
static int searchable(const char *secret)
{
    return secret && strlen(secret) >= 4 && !strchr(secret, '*');
}

static int plain(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-' || ch == ':';
}

static char rotate(char ch)
{
    if (ch == 'z' || ch == 'Z')
        return (char)(ch - 25);
    if (ch == '9')
        return '0';
    if ((ch >= 'a' && ch < 'z') || (ch >= 'A' && ch < 'Z') || (ch >= '0' && ch < '9'))
        return (char)(ch + 1);
    return ch;
}

/* Whether scrub_secret replaced something (its "***" is not followed by the
 * '@' of a redacted user-info): then the two texts may differ by what each
 * profile's secrets matched in the fixed wording, which is no leak. */
static int scrubbed(const char *m)
{
    for (const char *s = strstr(m, "***"); s; s = strstr(s + 1, "***"))
        if (s[3] != '@')
            return 1;
    return 0;
}

/* Differential check of the user-info: in a copy of the server list, change
 * every letter and digit of each entry's user-info (up to its last '@'; after
 * "://" when that comes first) and check again. The refusal must be word for
 * word the same: nothing of a user-info may reach the text. Only entries whose
 * user-info is plain (letters, digits, . _ - :) are changed, so the parse is
 * the same. */
static void check_userinfo(const jsd_conn_opts *o, jsd_status st, const char *msg)
{
    size_t n = strlen(o->servers);
    char *alt = malloc(n + 1);
    if (!alt)
        return;
    memcpy(alt, o->servers, n + 1);
    int changed = 0;
    for (char *p = alt; *p;) {
        char *e = p + strcspn(p, ",");
        char *at = NULL;
        for (char *q = p; q < e; q++)
            if (*q == '@')
                at = q;
        if (at) {
            char *s = strstr(p, "://");
            char *ui = (s && s < at && !memchr(p, '@', (size_t)(s - p))) ? s + 3 : p;
            int ok = ui < at;
            for (char *q = ui; q < at && ok; q++)
                ok = plain(*q);
            for (char *q = ui; q < at && ok; q++) {
                *q = rotate(*q);
                changed = 1;
            }
        }
        p = *e ? e + 1 : e;
    }
    if (changed) {
        jsd_conn_opts o2 = *o;
        jsd_error e2;
        jsd_error_clear(&e2);
        o2.servers = alt;
        jsd_status st2 = jsd__conn_opts_check(&o2, &e2);
        if (st2 != st || (!scrubbed(msg) && !scrubbed(e2.msg) && strcmp(e2.msg, msg) != 0))
            abort();
    }
    free(alt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    const char *field[4] = {NULL, NULL, NULL, NULL};
    size_t k = 0, at = 0;
    while (k < 4 && at <= size) {
        field[k++] = buf + at;
        at += strlen(buf + at) + 1;
    }
    jsd_conn_opts o;
    jsd_conn_opts_init(&o);
    o.servers = field[0];
    o.token = field[1] && *field[1] ? field[1] : NULL;
    o.user = field[2] && *field[2] ? field[2] : NULL;
    o.password = field[3] && *field[3] ? field[3] : NULL;

    jsd_error e;
    jsd_error_clear(&e);
    jsd_status st = jsd__conn_opts_check(&o, &e);
    if (memchr(e.msg, '\0', sizeof(e.msg)) == NULL)
        abort();
    if (st != JSD_OK) {
        if (!e.msg[0])
            abort(); /* every refusal says why */
        if (searchable(o.token) && strstr(e.msg, o.token))
            abort();
        if (searchable(o.password) && strstr(e.msg, o.password))
            abort();
        if (o.servers)
            check_userinfo(&o, st, e.msg);
    }
    free(buf);
    return 0;
}
