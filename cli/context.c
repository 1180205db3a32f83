/*
 * The nats CLI's contexts for the jsdurable tool: --context NAME (else
 * $NATS_CONTEXT, else the context the nats CLI has selected in context.txt)
 * reads ${XDG_CONFIG_HOME:-~/.config}/nats/context/NAME.json, or NAME itself
 * when it is the path of an existing .json file, as the nats CLI does. The
 * context only fills what flags and variables left unset (cli_conn_finish
 * holds the precedence); its keys are the nats CLI's (jsm.go natscontext):
 * url, token, user, password, creds, nkey, cert, key, ca, jetstream_domain,
 * jetstream_api_prefix. Keys that would change the connection in a way this
 * tool cannot follow (user_jwt, user_seed, nsc, socks_proxy, inbox_prefix,
 * windows_cert_store) are refused rather than ignored. The token and password
 * are copied into cli_conn's wiped buffers and wiped inside the parsed
 * document and the file buffer; messages name the file and the key, never a
 * value.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"

#define CONTEXT_MAX_BYTES (64 * 1024)

static void wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

/* The nats CLI's configuration folder: $XDG_CONFIG_HOME/nats, else
 * $HOME/.config/nats; false when neither is set. */
static bool config_dir(char *out, size_t cap)
{
    const char *x = getenv("XDG_CONFIG_HOME"), *h = getenv("HOME");
    int n;
    if (x && *x)
        n = snprintf(out, cap, "%s/nats", x);
    else if (h && *h)
        n = snprintf(out, cap, "%s/.config/nats", h);
    else
        return false;
    return n > 0 && (size_t)n < cap;
}

/* The selected context's name from context.txt into out; false when there is
 * none (no file, or an empty one). */
static bool selected_context(const char *dir, char *out, size_t cap)
{
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/context.txt", dir);
    FILE *f = n > 0 && (size_t)n < sizeof(path) ? fopen(path, "r") : NULL;
    if (!f)
        return false;
    size_t len = 0;
    char *s = cli_read_all(f, 4096, &len, NULL);
    fclose(f);
    if (!s)
        return false;
    char *b = s, *e = s + len;
    while (b < e && (*b == ' ' || *b == '\t' || *b == '\n' || *b == '\r'))
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        e--;
    bool ok = e > b && (size_t)(e - b) < cap;
    if (ok) {
        memcpy(out, b, (size_t)(e - b));
        out[e - b] = '\0';
    }
    free(s);
    return ok;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* The nats CLI's rule for a context name (natscontext.ValidateName). */
static bool name_valid(const char *name)
{
    return *name && !strstr(name, "..") && !strchr(name, '/') && !strchr(name, '\\');
}

/* A string key of the context: NULL when absent or empty; *bad set (and a
 * message printed) when present with another type. */
static const char *str_key(json_t *doc, const char *key, const char *path, const char *prog,
                           bool *bad)
{
    json_t *v = json_object_get(doc, key);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_string(v)) {
        cli_err(prog, "context file %s: \"%s\" must be a string", path, key);
        *bad = true;
        return NULL;
    }
    const char *s = json_string_value(v);
    return *s ? s : NULL;
}

/* A secret of the context (token, password), copied into a wiped buffer:
 * the value itself, or "env://NAME" (read from the environment) or
 * "file://PATH" (read from a file), the nats CLI's resolvers that need no
 * outside service. Other schemes (op://, nsc://, data:) are refused. */
static int take_secret(const char *val, const char *key, const char *path, const char *prog,
                       char **out)
{
    if (!strncmp(val, "env://", 6)) {
        const char *e = getenv(val + 6);
        if (!e || !*e) {
            cli_err(prog, "context file %s: \"%s\" names an environment variable that is not set",
                    path, key);
            return CLI_CONFIG;
        }
        *out = cli_strdup(e);
        return 0;
    }
    if (!strncmp(val, "file://", 7)) {
        *out = cli_read_secret_file(val + 7);
        if (!*out) {
            cli_err(prog, "context file %s: cannot read the file \"%s\" names: %s", path, key,
                    strerror(errno));
            return CLI_CONFIG;
        }
        return 0;
    }
    if (strstr(val, "://") || !strncmp(val, "data:", 5)) {
        cli_err(prog,
                "context file %s: \"%s\" uses a resolver this tool does not support (only a "
                "literal value, env:// and file://)",
                path, key);
        return CLI_CONFIG;
    }
    *out = cli_strdup(val);
    return 0;
}

/* A file path of the context: "file://" dropped, "~/" expanded (the nats CLI
 * expands both); other schemes refused. *slot keeps an expanded copy. */
static int take_path(const char *val, const char *key, const char *path, const char *prog,
                     char **slot, const char **out)
{
    if (!strncmp(val, "file://", 7))
        val += 7;
    else if (strstr(val, "://")) {
        cli_err(prog, "context file %s: \"%s\" must be a file path (this tool reads no %.*s)", path,
                key, (int)(strstr(val, "://") - val + 3), val);
        return CLI_CONFIG;
    }
    const char *home = getenv("HOME");
    if (val[0] == '~' && val[1] == '/' && home && *home) {
        size_t n = strlen(home) + strlen(val);
        free(*slot);
        *slot = malloc(n);
        if (!*slot)
            return CLI_SOFTWARE;
        snprintf(*slot, n, "%s%s", home, val + 1);
        val = *slot;
    }
    *out = val;
    return 0;
}

static const char *const refused_keys[] = {
    "user_jwt",           "user_seed",         "nsc", "socks_proxy", "inbox_prefix",
    "windows_cert_store", "windows_cert_match"};

/* Copy what the context supplies into c where nothing set it yet. */
static int apply_doc(cli_conn *c, json_t *doc, const char *path, const char *prog)
{
    bool bad = false;
    int rc = 0;
    if (!json_is_object(doc)) {
        cli_err(prog, "context file %s: not a JSON object", path);
        return CLI_CONFIG;
    }
    for (size_t i = 0; i < sizeof(refused_keys) / sizeof(refused_keys[0]); i++) {
        json_t *v = json_object_get(doc, refused_keys[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && !*json_string_value(v))) {
            cli_err(prog,
                    "context file %s: \"%s\" is set, which this tool cannot honour; use "
                    "a context without it",
                    path, refused_keys[i]);
            return CLI_CONFIG;
        }
    }
    json_t *tf = json_object_get(doc, "tls_first");
    if (tf && !json_is_boolean(tf)) {
        cli_err(prog, "context file %s: \"tls_first\" must be true or false", path);
        return CLI_CONFIG;
    }
    const char *url = str_key(doc, "url", path, prog, &bad);
    const char *token = str_key(doc, "token", path, prog, &bad);
    const char *user = str_key(doc, "user", path, prog, &bad);
    const char *password = str_key(doc, "password", path, prog, &bad);
    const char *creds = str_key(doc, "creds", path, prog, &bad);
    const char *nkey = str_key(doc, "nkey", path, prog, &bad);
    const char *cert = str_key(doc, "cert", path, prog, &bad);
    const char *key = str_key(doc, "key", path, prog, &bad);
    const char *ca = str_key(doc, "ca", path, prog, &bad);
    const char *domain = str_key(doc, "jetstream_domain", path, prog, &bad);
    const char *prefix = str_key(doc, "jetstream_api_prefix", path, prog, &bad);
    if (bad)
        return CLI_CONFIG;

    if (!c->opts.servers && url)
        c->opts.servers = url;
    if (!cli_conn_has_auth(c)) {
        if (token && (rc = take_secret(token, "token", path, prog, &c->secret_token)) != 0)
            return rc;
        if (password &&
            (rc = take_secret(password, "password", path, prog, &c->secret_password)) != 0)
            return rc;
        if (user) {
            /* the nats CLI's rule: a user without a password is a token */
            if (!password && !token) {
                if ((rc = take_secret(user, "user", path, prog, &c->secret_token)) != 0)
                    return rc;
            } else {
                c->opts.user = user;
            }
        }
        if (creds && (rc = take_path(creds, "creds", path, prog, &c->context_expanded[0],
                                     &c->opts.creds_file)) != 0)
            return rc;
        if (nkey && (rc = take_path(nkey, "nkey", path, prog, &c->context_expanded[1],
                                    &c->opts.nkey_seed_file)) != 0)
            return rc;
    }
    if (!c->opts.tls_cert_file && cert &&
        (rc = take_path(cert, "cert", path, prog, &c->context_expanded[2],
                        &c->opts.tls_cert_file)) != 0)
        return rc;
    if (!c->opts.tls_key_file && key &&
        (rc = take_path(key, "key", path, prog, &c->context_expanded[3], &c->opts.tls_key_file)) !=
            0)
        return rc;
    if (!c->opts.tls_ca_file && ca &&
        (rc = take_path(ca, "ca", path, prog, &c->context_expanded[4], &c->opts.tls_ca_file)) != 0)
        return rc;
    if (!c->opts.js_domain && !c->opts.js_api_prefix) {
        c->opts.js_domain = domain;
        c->opts.js_api_prefix = domain ? NULL : prefix;
    }
    if (tf && json_is_true(tf))
        c->opts.tls_handshake_first = 1;
    return 0;
}

/* Overwrite the secrets inside the parsed document once they are copied; the
 * user too unless the connection uses it as a user name (it may be a token). */
static void wipe_doc_secrets(json_t *doc, const char *user_in_use)
{
    static const char *const keys[] = {"token", "password", "user"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *v = json_object_get(doc, keys[i]);
        if (json_is_string(v) && json_string_value(v) != user_in_use)
            wipe((char *)json_string_value(v), json_string_length(v));
    }
}

int cli_context_apply(cli_conn *c, const char *prog)
{
    char dir[4096], path[4096], selected[256];
    const char *name = c->context;
    bool from_selection = false;
    if (c->no_context)
        return 0;
    if (!name || !*name)
        name = getenv("NATS_CONTEXT");
    bool have_dir = config_dir(dir, sizeof(dir));
    if ((!name || !*name) && have_dir && selected_context(dir, selected, sizeof(selected))) {
        name = selected;
        from_selection = true;
    }
    if (!name || !*name)
        return 0;
    FILE *probe = ends_with(name, ".json") ? fopen(name, "r") : NULL;
    if (probe) {
        fclose(probe);
        snprintf(path, sizeof(path), "%s", name);
    } else {
        if (!name_valid(name)) {
            cli_err(prog, "context name \"%s\" is not valid (no \"/\", \"\\\" or \"..\"%s)", name,
                    from_selection ? "; it is the one selected in the nats CLI's context.txt" : "");
            return CLI_USAGE;
        }
        if (!have_dir) {
            cli_err(prog, "context \"%s\": neither XDG_CONFIG_HOME nor HOME is set", name);
            return CLI_CONFIG;
        }
        int n = snprintf(path, sizeof(path), "%s/context/%s.json", dir, name);
        if (n < 0 || (size_t)n >= sizeof(path)) {
            cli_err(prog, "context \"%.64s...\": the file's path is too long", name);
            return CLI_USAGE;
        }
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_err(prog, "cannot read the nats context file %s: %s%s", path, strerror(errno),
                from_selection ? " (it is the context selected in the nats CLI's context.txt; "
                                 "--no-context skips it)"
                               : "");
        return CLI_CONFIG;
    }
    size_t len = 0;
    bool too_big = false;
    char *raw = cli_read_all(f, CONTEXT_MAX_BYTES, &len, &too_big);
    fclose(f);
    if (!raw) {
        cli_err(prog, "cannot read the nats context file %s%s", path,
                too_big ? ": larger than 64 KiB" : "");
        return CLI_CONFIG;
    }
    json_error_t jerr;
    json_t *doc = json_loadb(raw, len, JSON_REJECT_DUPLICATES, &jerr);
    wipe(raw, len);
    free(raw);
    if (!doc) {
        /* only the position: jansson's text can quote the input near it */
        cli_err(prog, "the nats context file %s is not valid JSON (line %d, column %d)", path,
                jerr.line, jerr.column);
        return CLI_CONFIG;
    }
    cli_context_free(c);
    c->context_doc = doc;
    int rc = apply_doc(c, doc, path, prog);
    wipe_doc_secrets(doc, c->opts.user);
    return rc;
}

void cli_context_free(cli_conn *c)
{
    for (size_t i = 0; i < sizeof(c->context_expanded) / sizeof(c->context_expanded[0]); i++) {
        free(c->context_expanded[i]);
        c->context_expanded[i] = NULL;
    }
    if (c->context_doc) {
        json_t *user = json_object_get(c->context_doc, "user");
        if (json_is_string(user) && c->opts.user == json_string_value(user))
            c->opts.user = NULL;
        wipe_doc_secrets(c->context_doc, NULL);
        json_decref(c->context_doc);
        c->context_doc = NULL;
    }
}
