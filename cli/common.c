/*
 * The tool's shared helpers: connection flags and environment fallbacks,
 * store URL lookup, exit codes, errors, reading input and secret files.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"

void cli_conn_init(cli_conn *c)
{
    memset(c, 0, sizeof(*c));
    jsd_conn_opts_init(&c->opts);
}

static char *dup_or_die(const char *s)
{
    char *d = strdup(s);
    if (!d) {
        fputs("jsdurable: out of memory\n", stderr);
        exit(CLI_SOFTWARE);
    }
    return d;
}

static void wipe_free(char *s)
{
    if (!s)
        return;
    volatile char *v = s;
    while (*v)
        *v++ = 0;
    free(s);
}

bool cli_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end = NULL;
    if (!s || !*s)
        return false;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool cli_parse_duration_ms(const char *s, int64_t *out)
{
    char *end = NULL;
    if (!s || !*s)
        return false;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    long long mul = 0;
    if (errno || end == s || v < 0)
        return false;
    if (!*end || !strcmp(end, "ms"))
        mul = 1;
    else if (!strcmp(end, "s"))
        mul = 1000;
    else if (!strcmp(end, "m"))
        mul = 60000;
    else if (!strcmp(end, "h"))
        mul = 3600000;
    else if (!strcmp(end, "d"))
        mul = 86400000;
    if (!mul || v > INT64_MAX / mul)
        return false;
    *out = (int64_t)(v * mul);
    return true;
}

/* Milliseconds for the connection's timeouts: 0..100000000. */
static bool parse_ms_int(const char *arg, int *out)
{
    long v;
    if (!cli_parse_long(arg, 0, 100000000, &v))
        return false;
    *out = (int)v;
    return true;
}

/* ---- options ------------------------------------------------------------------------ */

/* Levenshtein distance of a[0..na) and b[0..nb), both short option names. */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    size_t row[64];
    if (na >= 63 || nb >= 63)
        return 99;
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

/* The known option nearest to name[0..n): a prefix of one, or within a third
 * of its length in edits; NULL when none is near. */
static const char *nearest_option(const char *name, size_t n, const struct option *longopts)
{
    const char *best = NULL;
    size_t best_d = n / 3 + 1;
    for (const struct option *o = longopts; o->name; o++) {
        size_t len = strlen(o->name);
        size_t d = len > n && !strncmp(o->name, name, n) ? 1 : edit_distance(name, n, o->name, len);
        if (d < best_d || (d == best_d && best && len < strlen(best))) {
            best_d = d;
            best = o->name;
        }
    }
    return best;
}

/* Every "--name" in argv must be a long option's whole name: getopt_long's
 * prefix matching would take `--token SECRET` for --token-file and then
 * print the secret as a file name it cannot read. An unknown name is said
 * without its value (which may be a secret), with the nearest known one. */
static bool long_names_exact(int argc, char *const argv[], const struct option *longopts)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            return true;
        if (strncmp(a, "--", 2) != 0)
            continue;
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const struct option *hit = NULL;
        for (const struct option *o = longopts; o->name && !hit; o++)
            if (strlen(o->name) == n && !strncmp(o->name, name, n))
                hit = o;
        if (!hit) {
            const char *near = nearest_option(name, n, longopts);
            char shown[48];
            /* the name only, cut and printable: never the value */
            size_t k = 0;
            for (; k < n && k + 1 < sizeof(shown); k++)
                shown[k] = (name[k] > 0x20 && name[k] < 0x7f) ? name[k] : '?';
            shown[k] = '\0';
            if (near)
                cli_err(argv[0], "unknown option --%s%s; did you mean --%s? (see --help)", shown,
                        k < n ? "..." : "", near);
            else
                cli_err(argv[0], "unknown option --%s%s (see --help)", shown, k < n ? "..." : "");
            return false;
        }
        if (hit->has_arg == required_argument && !eq)
            i++; /* its value, which may itself begin with "--" */
    }
    return true;
}

int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *longopts)
{
    if (optind <= 1 && !long_names_exact(argc, argv, longopts)) {
        fflush(stdout);
        exit(CLI_USAGE);
    }
    return getopt_long(argc, argv, shortopts, longopts, NULL);
}

int cli_conn_flag(cli_conn *c, int opt, const char *arg)
{
    switch (opt - CLI_CONN_OPT_BASE) {
    case 0:
        c->opts.servers = arg;
        c->have_url = true;
        return 0;
    case 1:
        wipe_free(c->secret_token);
        c->secret_token = cli_read_secret_file(arg);
        if (!c->secret_token) {
            /* not the name given: a token typed in its place would be shown */
            cli_err("", "cannot read the file given to --token-file (the name is not shown: it "
                        "may be the token itself)");
            return CLI_USAGE;
        }
        return 0;
    case 2:
        c->opts.user = arg;
        return 0;
    case 3:
        wipe_free(c->secret_password);
        c->secret_password = cli_read_secret_file(arg);
        if (!c->secret_password) {
            cli_err("", "cannot read the file given to --password-file (the name is not shown: "
                        "it may be the password itself)");
            return CLI_USAGE;
        }
        return 0;
    case 4:
        c->opts.creds_file = arg;
        return 0;
    case 5:
        c->opts.nkey_seed_file = arg;
        return 0;
    case 6:
        c->opts.tls_ca_file = arg;
        return 0;
    case 7:
        c->opts.tls_cert_file = arg;
        return 0;
    case 8:
        c->opts.tls_key_file = arg;
        return 0;
    case 9:
        c->opts.tls_hostname = arg;
        return 0;
    case 10:
        c->opts.tls_required = 1;
        return 0;
    case 11:
        if (!parse_ms_int(arg, &c->opts.connect_timeout_ms)) {
            cli_err("", "--connect-timeout-ms needs a number of milliseconds");
            return CLI_USAGE;
        }
        return 0;
    case 12:
        if (!parse_ms_int(arg, &c->opts.startup_budget_ms)) {
            cli_err("", "--startup-budget-ms needs a number of milliseconds");
            return CLI_USAGE;
        }
        return 0;
    case 13: {
        jsd_log_level lv;
        if (jsd_log_level_parse(arg, &lv) != JSD_OK) {
            fprintf(stderr, "jsdurable: --log-level takes debug, info, warn, error or off\n");
            return CLI_USAGE;
        }
        setenv("JSD_LOG_LEVEL", arg, 1);
        return cli_log_apply();
    }
    case 14:
        if (strcmp(arg, "text") != 0 && strcmp(arg, "json") != 0) {
            fprintf(stderr, "jsdurable: --log-format takes text or json\n");
            return CLI_USAGE;
        }
        setenv("JSD_LOG_FORMAT", arg, 1);
        return cli_log_apply();
    case 15:
        c->context = arg;
        return 0;
    case 16:
        c->no_context = true;
        return 0;
    case 17:
        c->opts.js_domain = arg;
        return 0;
    case 18:
        c->opts.js_api_prefix = arg;
        return 0;
    default:
        return CLI_USAGE;
    }
}

/* The log settings live in JSD_LOG_LEVEL and JSD_LOG_FORMAT (the flags set
 * them), so --log-level and --log-format combine in any order and a flag wins
 * over the environment it replaces. Without either, the command's default
 * level holds: info for the daemons, warn for one-shot commands. */
static jsd_log_level log_default = JSD_LOG_WARN;

int cli_log_default(jsd_log_level level)
{
    log_default = level;
    return cli_log_apply();
}

int cli_log_apply(void)
{
    jsd_log_level lv = log_default;
    const char *level = getenv("JSD_LOG_LEVEL"), *fmt = getenv("JSD_LOG_FORMAT");
    if (level && *level && jsd_log_level_parse(level, &lv) != JSD_OK) {
        fprintf(stderr, "jsdurable: JSD_LOG_LEVEL takes debug, info, warn, error or off\n");
        return CLI_USAGE;
    }
    if (fmt && *fmt && strcmp(fmt, "text") != 0 && strcmp(fmt, "json") != 0) {
        fprintf(stderr, "jsdurable: JSD_LOG_FORMAT takes text or json\n");
        return CLI_USAGE;
    }
    jsd_log_configure(lv, fmt && !strcmp(fmt, "json") ? JSD_LOG_JSON : JSD_LOG_TEXT, NULL, NULL);
    return 0;
}

static const char *env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Precedence, as the nats CLI has it (a flag, or the variable that stands in
 * for it, wins over the context), with this tool's own JSD_* variables
 * first: flag > JSD_* > NATS_* > context. Authentication is taken as a whole
 * from the first of these that names any method, so a token in a context
 * never joins the creds file of a flag (one method only, CONN-2). */
int cli_conn_finish(cli_conn *c, const char *prog)
{
    const char *v;
    if (!c->have_url && ((v = env_set("JSD_NATS_URL")) || (v = env_set("NATS_URL"))))
        c->opts.servers = v;
    if (!c->secret_token && (v = env_set("JSD_NATS_TOKEN")))
        c->secret_token = dup_or_die(v);
    if (!c->opts.user && (v = env_set("JSD_NATS_USER")))
        c->opts.user = v;
    if (!c->secret_password && (v = env_set("JSD_NATS_PASSWORD")))
        c->secret_password = dup_or_die(v);
    if (!cli_conn_has_auth(c)) {
        if ((v = env_set("NATS_TOKEN")))
            c->secret_token = dup_or_die(v);
        if ((v = env_set("NATS_PASSWORD")))
            c->secret_password = dup_or_die(v);
        if ((v = env_set("NATS_USER"))) {
            /* the nats CLI's rule: a user without a password is a token */
            if (c->secret_password || c->secret_token)
                c->opts.user = v;
            else
                c->secret_token = dup_or_die(v);
        }
        if ((v = env_set("NATS_CREDS")))
            c->opts.creds_file = v;
        if ((v = env_set("NATS_NKEY")))
            c->opts.nkey_seed_file = v;
    }
    if (!c->opts.tls_ca_file && (v = env_set("NATS_CA")))
        c->opts.tls_ca_file = v;
    if (!c->opts.tls_cert_file && (v = env_set("NATS_CERT")))
        c->opts.tls_cert_file = v;
    if (!c->opts.tls_key_file && (v = env_set("NATS_KEY")))
        c->opts.tls_key_file = v;
    int rc = cli_context_apply(c, prog);
    if (rc != 0)
        return rc;
    if (!c->opts.servers || !*c->opts.servers) {
        cli_err(prog, "no NATS server: give -s/--nats URL, set JSD_NATS_URL or NATS_URL, or "
                      "name a --context");
        return CLI_USAGE;
    }
    c->opts.token = c->secret_token;
    c->opts.password = c->secret_password;
    return 0;
}

bool cli_conn_wanted(const cli_conn *c)
{
    return c->have_url || env_set("JSD_NATS_URL") || env_set("NATS_URL") ||
           (!c->no_context && ((c->context && *c->context) || env_set("NATS_CONTEXT")));
}

bool cli_conn_has_auth(const cli_conn *c)
{
    return c->secret_token || c->secret_password || (c->opts.user && *c->opts.user) ||
           (c->opts.creds_file && *c->opts.creds_file) ||
           (c->opts.nkey_seed_file && *c->opts.nkey_seed_file);
}

char *cli_strdup(const char *s)
{
    return dup_or_die(s);
}

void cli_wipe_free(char *s)
{
    wipe_free(s);
}

int cli_conn_open(cli_conn *c, jsd_conn **out)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd_conn_open(out, &c->opts, &err);
    if (s != JSD_OK) {
        cli_err("", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        return cli_exit_for(s);
    }
    return 0;
}

void cli_conn_free(cli_conn *c)
{
    wipe_free(c->secret_token);
    wipe_free(c->secret_password);
    c->secret_token = c->secret_password = NULL;
    c->opts.token = c->opts.password = NULL;
    cli_context_free(c);
}

const char *cli_store_url(const char *flag)
{
    const char *url = flag && *flag ? flag : getenv("JSD_STORE");
    if (!url || !*url)
        return NULL;
    /* $JSD_STORE_NAMESPACE reaches every command that opens a store as the
     * URL's namespace parameter; a namespace the URL names wins. The library
     * validates it when the store opens. */
    const char *ns = getenv("JSD_STORE_NAMESPACE");
    if (!ns || !*ns || strstr(url, "namespace="))
        return url;
    static char *joined;
    size_t n = strlen(url) + strlen(ns) + 16;
    char *j = realloc(joined, n);
    if (!j)
        return url;
    joined = j;
    bool pg = !strncmp(url, "postgres://", 11) || !strncmp(url, "postgresql://", 13);
    snprintf(joined, n, "%s%snamespace=%s", url, pg && strchr(url, '?') ? "&" : "?", ns);
    return joined;
}

int cli_exit_for(jsd_status s)
{
    switch (s) {
    case JSD_OK:
        return CLI_OK;
    case JSD_ERR_INVALID:
    case JSD_ERR_LIMIT:
        return CLI_DATAERR;
    case JSD_ERR_CONFIG:
    case JSD_ERR_BIND:
    case JSD_ERR_SCHEMA:
    case JSD_ERR_NOT_SUPPORTED:
    case JSD_ERR_NO_JETSTREAM:
        return CLI_CONFIG;
    case JSD_ERR_AUTH:
        return CLI_NOPERM;
    case JSD_ERR_CONNECT:
    case JSD_ERR_TLS:
    case JSD_ERR_TIMEOUT:
        return CLI_UNAVAILABLE;
    case JSD_ERR_READONLY:
    case JSD_ERR_FULL:
    case JSD_ERR_IO:
        return CLI_IOERR;
    case JSD_ERR_BUSY:
        return CLI_TEMPFAIL;
    case JSD_ERR_STORE:
        return CLI_CANTCREAT;
    default:
        return CLI_FAILED;
    }
}

static void say(const char *cmd, const char *level, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    const char *f = getenv("JSD_LOG_FORMAT");
    if (!f || strcmp(f, "json") != 0) {
        if (cmd && *cmd)
            fprintf(stderr, "jsdurable %s: %s\n", cmd, msg);
        else
            fprintf(stderr, "jsdurable: %s\n", msg);
        return;
    }
    char ts[40], comp[64];
    struct timespec now;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", now.tv_nsec / 1000000);
    snprintf(comp, sizeof(comp), "cli%s%s", cmd && *cmd ? "." : "", cmd ? cmd : "");
    /* jansson refuses invalid UTF-8: fall back to a lossless-enough ASCII copy */
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level, "component", comp, "msg", msg);
    if (!o) {
        for (char *p = msg; *p; p++)
            if ((unsigned char)*p >= 0x80)
                *p = '?';
        o = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level, "component", comp, "msg",
                      msg);
    }
    char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
    fprintf(stderr, "%s\n", js ? js : "{\"msg\":\"(line lost: out of memory)\"}");
    free(js);
    json_decref(o);
}

void cli_say(const char *cmd, const char *level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(cmd, level, fmt, ap);
    va_end(ap);
}

void cli_err(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(cmd, "error", fmt, ap);
    va_end(ap);
}

char *cli_read_all(FILE *f, size_t max, size_t *len, bool *too_big)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (too_big)
        *too_big = false;
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                if (too_big)
                    *too_big = true;
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f) || n > max) {
        if (too_big)
            *too_big = n > max;
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

char *cli_read_secret_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t len = 0;
    char *s = cli_read_all(f, 4096, &len, NULL);
    fclose(f);
    if (!s)
        return NULL;
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r'))
        s[--len] = '\0';
    return s;
}

bool cli_split_header(const char *arg, char **name, char **value)
{
    const char *colon = strchr(arg, ':');
    if (!colon || colon == arg)
        return false;
    *name = strndup(arg, (size_t)(colon - arg));
    *value = strdup(colon + 1);
    return *name && *value;
}

json_t *cli_json_str(const char *s)
{
    if (!s)
        return json_null();
    json_t *v = json_string(s);
    if (v)
        return v;
    char *copy = dup_or_die(s);
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    v = json_string(copy);
    free(copy);
    return v ? v : json_null();
}

void cli_json_set_bytes(json_t *o, const void *data, size_t len)
{
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (!data) {
        data = "";
        len = 0;
    }
    json_t *v = json_stringn(data, len);
    if (v) {
        json_object_set_new(o, "payload", v);
        return;
    }
    const unsigned char *p = data;
    char *out = malloc(len / 3 * 4 + 5);
    if (!out)
        return;
    size_t w = 0, i = 0;
    for (; i + 2 < len; i += 3) {
        out[w++] = b64[p[i] >> 2];
        out[w++] = b64[((p[i] & 3) << 4) | (p[i + 1] >> 4)];
        out[w++] = b64[((p[i + 1] & 15) << 2) | (p[i + 2] >> 6)];
        out[w++] = b64[p[i + 2] & 63];
    }
    if (i < len) {
        out[w++] = b64[p[i] >> 2];
        out[w++] = b64[((p[i] & 3) << 4) | (i + 1 < len ? p[i + 1] >> 4 : 0)];
        out[w++] = i + 1 < len ? b64[(p[i + 1] & 15) << 2] : '=';
        out[w++] = '=';
    }
    out[w] = '\0';
    json_object_set_new(o, "payload_base64", json_string(out));
    free(out);
}

void cli_json_print(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (text)
        printf("%s\n", text);
    else
        fputs("jsdurable: out of memory writing JSON\n", stderr);
    free(text);
    json_decref(o);
}

int cli_metrics_start(const char *cmd, const char *addr, jsd_conn *conn, jsd_metrics **reg,
                      jsd_metrics_server **srv)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = *reg ? JSD_OK : jsd_metrics_create(reg, &err);
    if (s == JSD_OK)
        s = jsd_metrics_serve(srv, *reg, conn, addr, &err);
    if (s != JSD_OK) {
        cli_err(cmd, "--metrics %s: %s", addr, err.msg[0] ? err.msg : jsd_status_str(s));
        return cli_exit_for(s);
    }
    cli_say(cmd, "info", "metrics on http://%s/metrics (port %d)", addr,
            jsd_metrics_server_port(*srv));
    return 0;
}

int cli_store_open(const char *cmd, const char *url, jsd_store **out)
{
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd_store_open(out, url, &err);
    if (s == JSD_OK)
        return 0;
    cli_err(cmd, "%s", err.msg[0] ? err.msg : jsd_status_str(s));
    return cli_exit_for(s);
}
