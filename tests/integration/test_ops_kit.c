/*
 * The operations kit under examples/ stays true to the code it describes.
 *
 * Monitoring: every jsd_* metric that examples/monitoring/alerts.yml and
 * dashboard.json use in a PromQL expression is a series the code exports. The
 * exported set comes from a real registry with a relay created on it (the
 * relay registers its own families at create time), rendered with
 * jsd_metrics_render, so histogram suffixes (_bucket, _sum, _count) are the
 * real ones. promtool, when installed, checks the rules file and runs its
 * unit tests (examples/monitoring/alerts_test.yml).
 *
 * systemd: the units under examples/systemd pass systemd-analyze verify (and
 * an offline exposure score) when systemd-analyze is installed; whether or
 * not it is, every jsdurable flag an ExecStart line passes is in the
 * command's --help, every variable the example environment files set is one
 * the tool reads or the unit uses, and no secret reaches a command line, an
 * Environment= line or an example file: credential flags only name files
 * under the credentials directory that LoadCredential= fills.
 */
#include <ctype.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "test.h"
#include "consumer_env.h"

/* ---- small helpers ---------------------------------------------------------- */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            cap = cap ? cap * 2 : 65536;
            buf = realloc(buf, cap);
            if (!buf)
                fail_msg("out of memory reading %s", path);
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

/* A file of the source tree: the runner exports JSD_TOP; else the cwd. */
static const char *top_path(const char *rel)
{
    static char bufs[4][PATH_MAX];
    static unsigned next;
    char *b = bufs[next++ % 4];
    const char *top = getenv("JSD_TOP");
    snprintf(b, PATH_MAX, "%s/%s", top && *top ? top : ".", rel);
    return b;
}

#define NAMES_MAX 256
typedef struct names {
    char v[NAMES_MAX][JSD_METRICS_NAME_MAX];
    size_t n;
} names;

static bool names_has(const names *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], name))
            return true;
    return false;
}

static void names_add(names *s, const char *name, size_t len)
{
    char tmp[JSD_METRICS_NAME_MAX];
    if (len == 0 || len >= sizeof(tmp))
        fail_msg("metric name of %zu bytes", len);
    memcpy(tmp, name, len);
    tmp[len] = '\0';
    if (names_has(s, tmp))
        return;
    if (s->n == NAMES_MAX)
        fail_msg("more than %d metric names", NAMES_MAX);
    memcpy(s->v[s->n++], tmp, len + 1);
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

/* Every jsd_[a-z0-9_]+ that starts a word in text. */
static void promql_names(const char *text, names *out)
{
    for (const char *p = strstr(text, "jsd_"); p; p = strstr(p + 1, "jsd_")) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == ':'))
            continue;
        size_t n = 4;
        while (name_char(p[n]))
            n++;
        names_add(out, p, n);
    }
}

/* The series names of an exposition: each sample line's name, and the family
 * of each # TYPE line. */
static void exposition_names(const char *text, names *out)
{
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *name = line;
        if (len > 7 && !strncmp(line, "# TYPE ", 7))
            name = line + 7;
        else if (line[0] == '#')
            name = NULL;
        if (name) {
            size_t n = 0;
            while (name + n < line + len && name[n] != '{' && name[n] != ' ')
                n++;
            if (n)
                names_add(out, name, n);
        }
        line += len + (end ? 1 : 0);
    }
}

/* ---- the names the code exports --------------------------------------------- */

static void exported_names(names *out)
{
    jsd_error e;
    jsd_error_clear(&e);
    /* A stream, its dead-letter stream and a durable on the shared server,
     * and a SQLite store: what a relay and a consumer need to be created. */
    cenv env = {0};
    cenv_up(&env, false);
    cenv_durable(&env, 30000, 6, 1024, NULL, 0);
    jsd_metrics *reg = NULL;
    ASSERT_OK_E(jsd_metrics_create(&reg, &e), e.msg);

    /* The relay and the consumer register their own families when created. */
    jsd_store *relay_store = NULL;
    ASSERT_OK_E(jsd_store_open(&relay_store, env.store_url, &e), e.msg);
    jsd_relay_opts ro;
    jsd_relay_opts_init(&ro);
    ro.metrics = reg;
    jsd_relay *relay = NULL;
    ASSERT_OK_E(jsd_relay_create(&relay, relay_store, env.conn, &ro, &e), e.msg);
    jsd_consumer_opts co;
    jsd_consumer_opts_init(&co);
    co.metrics = reg;
    jsd_consumer *consumer = cenv_consumer(&env, &co);
    jsd_metrics_observe_conn(reg, env.conn);

    static char text[1 << 17];
    size_t len = 0;
    ASSERT_OK(jsd_metrics_render(reg, text, sizeof(text), &len));
    exposition_names(text, out);

    jsd_consumer_destroy(consumer);
    jsd_relay_destroy(relay);
    jsd_store_close(relay_store);
    cenv_down(&env);
    jsd_metrics_destroy(reg);
}

/* ---- the names the kit uses ------------------------------------------------- */

static size_t indent_of(const char *line)
{
    size_t n = 0;
    while (line[n] == ' ')
        n++;
    return n;
}

/* The PromQL of every `expr:` of a rules file, one per line of *out, with
 * folded (>-, |) continuation lines joined. Returns the number of exprs and
 * counts the `- alert:` entries into *alerts. Full-line comments are skipped. */
static size_t rules_exprs(const char *yaml, char *out, size_t cap, size_t *alerts)
{
    size_t exprs = 0, used = 0;
    *alerts = 0;
    out[0] = '\0';
    const char *line = yaml;
    bool in_block = false;
    size_t block_indent = 0;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char l[1024];
        if (len >= sizeof(l))
            fail_msg("alerts.yml has a line of %zu bytes", len);
        memcpy(l, line, len);
        l[len] = '\0';
        size_t ind = indent_of(l);
        const char *t = l + ind;
        bool blank = *t == '\0';
        if (in_block && !blank && ind <= block_indent)
            in_block = false;
        if (*t == '#') {
            /* a comment */
        } else if (in_block) {
            used += (size_t)snprintf(out + used, cap - used, " %s", t);
        } else {
            if (!strncmp(t, "- alert:", 8))
                (*alerts)++;
            if (!strncmp(t, "expr:", 5)) {
                exprs++;
                const char *v = t + 5;
                while (*v == ' ')
                    v++;
                used += (size_t)snprintf(out + used, cap - used, "\n");
                if (*v == '>' || *v == '|') {
                    in_block = true;
                    block_indent = ind;
                } else {
                    used += (size_t)snprintf(out + used, cap - used, "%s", v);
                }
            }
        }
        if (used >= cap)
            fail_msg("the rules' expressions exceed %zu bytes", cap);
        line += len + (end ? 1 : 0);
    }
    return exprs;
}

/* Strings under the keys a Grafana dashboard keeps PromQL in. */
static void dashboard_exprs(json_t *v, const char *key, names *out, size_t *n_exprs)
{
    if (json_is_object(v)) {
        const char *k;
        json_t *child;
        json_object_foreach(v, k, child) dashboard_exprs(child, k, out, n_exprs);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *child;
        json_array_foreach(v, i, child) dashboard_exprs(child, key, out, n_exprs);
    } else if (json_is_string(v) && key &&
               (!strcmp(key, "expr") || !strcmp(key, "query") || !strcmp(key, "definition"))) {
        promql_names(json_string_value(v), out);
        if (!strcmp(key, "expr"))
            (*n_exprs)++;
    }
}

/* Fail naming every used name that is not exported. */
static void assert_all_exported(const names *used, const names *exported, const char *what)
{
    char missing[2048] = "";
    size_t m = 0;
    for (size_t i = 0; i < used->n; i++)
        if (!names_has(exported, used->v[i]))
            m += (size_t)snprintf(missing + m, sizeof(missing) - m, " %s", used->v[i]);
    if (m)
        fail_msg("%s uses metrics the code does not export:%s", what, missing);
}

static void alert_rules_use_exported_metrics(void **state)
{
    (void)state;
    static names exported, used;
    exported_names(&exported);
    ASSERT_TRUE(names_has(&exported, "jsd_relay_first_attempt_duplicates_total"));
    ASSERT_TRUE(names_has(&exported, "jsd_consumer_held_deliveries"));
    ASSERT_TRUE(names_has(&exported, "jsd_handler_duration_seconds_bucket"));

    char *yaml = read_all(top_path("examples/monitoring/alerts.yml"));
    static char exprs[1 << 16];
    size_t alerts = 0;
    size_t n = rules_exprs(yaml, exprs, sizeof(exprs), &alerts);
    free(yaml);
    ASSERT_EQ(n, alerts); /* every alert has an expression the parser saw */
    ASSERT_LE(10, n);
    promql_names(exprs, &used);
    ASSERT_LE(10, used.n);
    assert_all_exported(&used, &exported, "examples/monitoring/alerts.yml");
    /* The alerts the operations guide promises. */
    const char *needed[] = {"jsd_outbox_oldest_unpublished_age_seconds",
                            "jsd_relay_errors_total",
                            "jsd_dead_letters_total",
                            "jsd_relay_dead_lettered_total",
                            "jsd_nats_connected",
                            "jsd_consumer_held_deliveries",
                            "jsd_poison_unpublished",
                            "jsd_relay_first_attempt_duplicates_total"};
    for (size_t i = 0; i < sizeof(needed) / sizeof(needed[0]); i++)
        if (!names_has(&used, needed[i]))
            fail_msg("alerts.yml has no rule over %s", needed[i]);
}

static void dashboard_uses_exported_metrics(void **state)
{
    (void)state;
    static names exported, used;
    exported_names(&exported);
    json_error_t je;
    json_t *dash = json_load_file(top_path("examples/monitoring/dashboard.json"), 0, &je);
    if (!dash)
        fail_msg("dashboard.json line %d: %s", je.line, je.text);
    size_t n_exprs = 0;
    dashboard_exprs(dash, NULL, &used, &n_exprs);
    ASSERT_TRUE(json_is_array(json_object_get(dash, "panels")));
    json_decref(dash);
    ASSERT_LE(10, n_exprs);
    ASSERT_LE(10, used.n);
    assert_all_exported(&used, &exported, "examples/monitoring/dashboard.json");
}

/* The checker itself reports a name the code does not export, and a rule the
 * parser did not see an expression for. Forks so the failure stays inside. */
static void checker_reports_unknown_names(void **state)
{
    (void)state;
    static names exported, used;
    names_add(&exported, "jsd_relay_errors_total", strlen("jsd_relay_errors_total"));
    static char exprs[4096];
    size_t alerts = 0;
    const char *yaml = "groups:\n"
                       "  - name: g\n"
                       "    rules:\n"
                       "      # jsd_in_a_comment is not PromQL\n"
                       "      - alert: A\n"
                       "        expr: rate(jsd_relay_errors_total[5m]) > 0\n"
                       "      - alert: B\n"
                       "        expr: >-\n"
                       "          rate(jsd_relay_errors_total[5m])\n"
                       "          and my_jsd_x > 0 and jsd_no_such_total > 0\n"
                       "        annotations:\n"
                       "          summary: jsd_not_an_expr\n";
    ASSERT_EQ(rules_exprs(yaml, exprs, sizeof(exprs), &alerts), 2);
    ASSERT_EQ(alerts, 2);
    promql_names(exprs, &used);
    ASSERT_EQ(used.n, 2);
    ASSERT_TRUE(names_has(&used, "jsd_no_such_total"));
    ASSERT_TRUE(!names_has(&exported, "jsd_no_such_total"));
    ASSERT_TRUE(!names_has(&used, "jsd_in_a_comment"));
    ASSERT_TRUE(!names_has(&used, "jsd_not_an_expr"));
    static names expo;
    exposition_names("# HELP jsd_h_seconds h\n# TYPE jsd_h_seconds histogram\n"
                     "jsd_h_seconds_bucket{le=\"+Inf\"} 0\njsd_h_seconds_sum 0\n"
                     "jsd_h_seconds_count 0\n",
                     &expo);
    ASSERT_EQ(expo.n, 4);
    ASSERT_TRUE(names_has(&expo, "jsd_h_seconds_bucket"));
    ASSERT_TRUE(!names_has(&expo, "jsd_h_seconds_total"));
}

static bool on_path(const char *prog, char *out, size_t cap)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v %s", prog);
    if (jsd_test_run(cmd, out, cap) != 0)
        return false;
    out[strcspn(out, "\n")] = '\0';
    return out[0] != '\0';
}

static void promtool_checks_rules(void **state)
{
    (void)state;
    char tool[PATH_MAX], cmd[PATH_MAX * 2 + 64];
    static char out[1 << 16];
    const char *env = getenv("JSD_PROMTOOL");
    if (env && *env)
        snprintf(tool, sizeof(tool), "%s", env);
    else if (!on_path("promtool", tool, sizeof(tool))) {
        jsd_test_skip_because("promtool not found (Debian package prometheus, or "
                              "JSD_PROMTOOL=PATH): the rules file is not checked by it");
    }
    snprintf(cmd, sizeof(cmd), "'%s' check rules '%s'", tool,
             top_path("examples/monitoring/alerts.yml"));
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("promtool check rules exited %d:\n%s", rc, out);
    ASSERT_CONTAINS(out, "SUCCESS");
    /* The rules' own unit tests: each named alert fires on its series, and
     * the quiet cases stay quiet. */
    snprintf(cmd, sizeof(cmd), "'%s' test rules '%s'", tool,
             top_path("examples/monitoring/alerts_test.yml"));
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("promtool test rules exited %d:\n%s", rc, out);
    ASSERT_CONTAINS(out, "SUCCESS");
}

/* ---- systemd units ---------------------------------------------------------- */

typedef struct unit_case {
    const char *unit; /* under examples/systemd */
    const char *env;  /* its example environment file */
    const char *cmd;  /* the jsdurable command it runs */
} unit_case;

static const unit_case units[] = {
    {"jsdurable-relay@.service", "relay.env.example", "relay"},
    {"jsdurable-consume@.service", "consume.env.example", "consume"},
};

/* The value of `Key=` lines (continuations joined), one per line of out. */
static void unit_values(const char *text, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key), used = 0;
    out[0] = '\0';
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > klen && !strncmp(line, key, klen) && line[klen] == '=') {
            const char *v = line + klen + 1;
            size_t vlen = len - klen - 1;
            for (;;) {
                bool cont = vlen && v[vlen - 1] == '\\';
                used += (size_t)snprintf(out + used, cap - used, "%.*s", (int)(vlen - cont), v);
                if (used >= cap)
                    fail_msg("%s= values exceed %zu bytes", key, cap);
                if (!cont || !end)
                    break;
                line = end + 1;
                end = strchr(line, '\n');
                len = end ? (size_t)(end - line) : strlen(line);
                v = line;
                vlen = len;
            }
            used += (size_t)snprintf(out + used, cap - used, "\n");
        }
        if (!end)
            break;
        line = end + 1;
    }
}

/* The next whitespace-separated word of *p into w; false at the end. */
static bool next_word(const char **p, char *w, size_t cap)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    if (!*s)
        return false;
    size_t n = 0;
    while (s[n] && s[n] != ' ' && s[n] != '\t' && s[n] != '\n')
        n++;
    if (n >= cap)
        fail_msg("a word of %zu bytes in a unit", n);
    memcpy(w, s, n);
    w[n] = '\0';
    *p = s + n;
    return true;
}

/* `flag` is listed in help as a word of its own. */
static bool help_has_flag(const char *help, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = strstr(help, flag); p; p = strstr(p + 1, flag))
        if ((p == help || !name_char(p[-1])) && !(name_char(p[n]) || p[n] == '-'))
            return true;
    return false;
}

static bool is_cred_flag(const char *w)
{
    return !strcmp(w, "--token-file") || !strcmp(w, "--password-file") || !strcmp(w, "--creds") ||
           !strcmp(w, "--nkey") || !strcmp(w, "--tls-key");
}

/* The variables an example environment file sets (active lines only). */
static void env_keys(const char *text, names *out)
{
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *eq = memchr(line, '=', len);
        if (line[0] != '#' && eq && eq > line)
            names_add(out, line, (size_t)(eq - line));
        line += len + (end ? 1 : 0);
    }
}

static bool binary_has_string(const char *bin, size_t n, const char *s)
{
    size_t sl = strlen(s) + 1; /* with its NUL: a whole C string literal */
    for (const char *p = bin; p + sl <= bin + n; p++) {
        p = memchr(p, s[0], (size_t)(bin + n - p));
        if (!p || p + sl > bin + n)
            return false;
        /* a whole literal, not the tail of a longer one: what precedes it is not text
         * (a NUL, or other read-only data such as a jump table) */
        if (!memcmp(p, s, sl) && (p == bin || !isprint((unsigned char)p[-1])))
            return true;
    }
    return false;
}

static char *read_binary(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz)
        fail_msg("cannot read %s", path);
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

static void unit_flags_exist_and_no_secret_on_the_command_line(void **state)
{
    (void)state;
    size_t bin_n = 0;
    char *bin = read_binary(jsd_fx_bin("jsdurable"), &bin_n);
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
        const unit_case *uc = &units[u];
        char rel[256];
        snprintf(rel, sizeof(rel), "examples/systemd/%s", uc->unit);
        char *text = read_all(top_path(rel));
        snprintf(rel, sizeof(rel), "examples/systemd/%s", uc->env);
        char *env = read_all(top_path(rel));

        static char help[1 << 15], cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof(cmd), "'%s' %s --help", jsd_fx_bin("jsdurable"), uc->cmd);
        ASSERT_EQ(jsd_test_run(cmd, help, sizeof(help)), 0);

        static char exec[8192], creds[4096], environ_[4096];
        unit_values(text, "ExecStart", exec, sizeof(exec));
        unit_values(text, "LoadCredential", creds, sizeof(creds));
        unit_values(text, "Environment", environ_, sizeof(environ_));
        const char *nl = strchr(exec, '\n');
        if (!nl || nl[1] != '\0')
            fail_msg("%s needs exactly one ExecStart= line:\n%s", uc->unit, exec);

        const char *p = exec;
        char w[1024], prev[1024] = "";
        int i = 0, flags = 0, cred_flags = 0;
        names vars;
        vars.n = 0;
        while (next_word(&p, w, sizeof(w))) {
            size_t wl = strlen(w), bl = strlen("/jsdurable");
            if (i == 0 && (wl < bl || strcmp(w + wl - bl, "/jsdurable") != 0))
                fail_msg("%s runs %s, not jsdurable", uc->unit, w);
            if (i == 1 && strcmp(w, uc->cmd) != 0)
                fail_msg("%s runs `jsdurable %s`, expected %s", uc->unit, w, uc->cmd);
            if (!strncmp(w, "--", 2)) {
                flags++;
                if (strchr(w, '='))
                    fail_msg("%s: write `%s` as two words", uc->unit, w);
                if (!help_has_flag(help, w))
                    fail_msg("%s passes %s, which `jsdurable %s --help` does not list", uc->unit, w,
                             uc->cmd);
            }
            if (is_cred_flag(prev)) {
                cred_flags++;
                /* %d is systemd's $CREDENTIALS_DIRECTORY */
                if (strncmp(w, "%d/", 3) != 0)
                    fail_msg("%s: %s %s is not a file under the credentials directory (%%d/)",
                             uc->unit, prev, w);
                char id[sizeof(w) + 1];
                snprintf(id, sizeof(id), "%s:", w + 3);
                if (!strstr(creds, id))
                    fail_msg("%s: %s reads credential %s, which no LoadCredential= provides",
                             uc->unit, prev, w + 3);
            }
            if (w[0] == '$') {
                const char *v = w + 1 + (w[1] == '{');
                size_t n = strcspn(v, "}");
                names_add(&vars, v, n);
            }
            snprintf(prev, sizeof(prev), "%s", w);
            i++;
        }
        ASSERT_LE(1, cred_flags);
        ASSERT_LE(1, flags);
        /* No secret on the command line or in the unit's environment. */
        const char *secrets[] = {"JSD_NATS_TOKEN", "JSD_NATS_PASSWORD", "PGPASSWORD", "--token ",
                                 "--password "};
        for (size_t s = 0; s < sizeof(secrets) / sizeof(secrets[0]); s++) {
            ASSERT_NOT_CONTAINS(exec, secrets[s]);
            ASSERT_NOT_CONTAINS(environ_, secrets[s]);
        }
        /* Nor in the example settings: no secret variables, no user:password@ in a URL. */
        names keys;
        keys.n = 0;
        env_keys(env, &keys);
        ASSERT_LE(3, keys.n);
        for (size_t k = 0; k < keys.n; k++) {
            if (!strcmp(keys.v[k], "JSD_NATS_TOKEN") || !strcmp(keys.v[k], "JSD_NATS_PASSWORD") ||
                !strcmp(keys.v[k], "PGPASSWORD"))
                fail_msg("%s sets the secret %s; use a credential file", uc->env, keys.v[k]);
            /* Each setting is read by the tool (a getenv literal in the binary) or used by
             * the unit's ExecStart. */
            if (!names_has(&vars, keys.v[k]) && !binary_has_string(bin, bin_n, keys.v[k]))
                fail_msg("%s sets %s, which neither jsdurable nor %s reads", uc->env, keys.v[k],
                         uc->unit);
        }
        for (size_t k = 0; k < vars.n; k++)
            if (!names_has(&keys, vars.v[k]))
                fail_msg("%s uses $%s, which %s does not set", uc->unit, vars.v[k], uc->env);
        for (const char *at = strstr(env, "://"); at; at = strstr(at + 1, "://")) {
            /* user@host is fine; user:password@host is a secret */
            size_t auth = strcspn(at + 3, "/ ,?\n");
            const char *amp = memchr(at + 3, '@', auth);
            if (amp && memchr(at + 3, ':', (size_t)(amp - (at + 3))))
                fail_msg("%s has a password in a URL", uc->env);
        }
        free(text);
        free(env);
    }
    free(bin);
}

static void units_pass_systemd_analyze(void **state)
{
    (void)state;
    char tool[PATH_MAX];
    if (!on_path("systemd-analyze", tool, sizeof(tool))) {
        jsd_test_skip_because("systemd-analyze not found (Debian package systemd): the units are "
                              "only checked against --help");
    }
    char jsd[PATH_MAX];
    if (!realpath(jsd_fx_bin("jsdurable"), jsd))
        fail_msg("cannot resolve %s", jsd_fx_bin("jsdurable"));
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
        const char *unit = units[u].unit;
        char rel[256], inst[PATH_MAX], cmd[PATH_MAX * 3];
        snprintf(rel, sizeof(rel), "examples/systemd/%s", unit);
        /* An instance of the template, running this build's binary (verify
         * checks that the executable exists). */
        const char *at = strchr(unit, '@');
        snprintf(inst, sizeof(inst), "%s/%.*s@kit.service", jsd_test_dir(), (int)(at - unit), unit);
        snprintf(cmd, sizeof(cmd),
                 "sed 's#^ExecStart=/usr/local/bin/jsdurable #ExecStart=%s #' '%s' > '%s'", jsd,
                 top_path(rel), inst);
        static char out[1 << 16];
        ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
        char *copy = read_all(inst);
        ASSERT_CONTAINS(copy, jsd);
        free(copy);

        snprintf(cmd, sizeof(cmd), "SYSTEMD_LOG_COLOR=0 '%s' verify --man=no '%s'", tool, inst);
        int rc = jsd_test_run(cmd, out, sizeof(out));
        /* verify only warns (exit 0) about unknown keys: any output fails. */
        if (rc != 0 || out[0] != '\0')
            fail_msg("systemd-analyze verify %s exited %d:\n%s", unit, rc, out);

        /* The hardening holds: an offline exposure score of at most 2.5 (of 10). */
        snprintf(cmd, sizeof(cmd),
                 "SYSTEMD_LOG_COLOR=0 '%s' security --offline=true --threshold=25 --no-pager '%s'",
                 tool, inst);
        rc = jsd_test_run(cmd, out, sizeof(out));
        if (rc != 0)
            fail_msg("systemd-analyze security %s: exposure above 2.5 (exit %d):\n%s", unit, rc,
                     out);
        ASSERT_CONTAINS(out, "Overall exposure level");
    }
}

JSD_TEST_MAIN(cmocka_unit_test(alert_rules_use_exported_metrics),
              cmocka_unit_test(dashboard_uses_exported_metrics),
              cmocka_unit_test(checker_reports_unknown_names),
              cmocka_unit_test(promtool_checks_rules),
              cmocka_unit_test(unit_flags_exist_and_no_secret_on_the_command_line),
              cmocka_unit_test(units_pass_systemd_analyze))
