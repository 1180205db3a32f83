/*
 * The nats CLI's conventions in the jsdurable tool, through the built binary
 * against real nats-servers: -s/--server as --nats, NATS_URL after
 * JSD_NATS_URL, the nats CLI's contexts (--context, $NATS_CONTEXT, the
 * selected one; flags and variables win over a context; a malformed or
 * missing one refused naming its file; the token never printed), the
 * JetStream domain and API prefix (a server with `jetstream { domain: hub }`,
 * and an account that reaches another's JetStream through an import under
 * its own prefix), and -j/--json on dlq, provision and gc. Every run clears
 * the variables it could inherit and points XDG_CONFIG_HOME at the test's
 * folder, so no context of the machine takes part.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <nats/nats.h>

#include "fixture.h"
#include "test.h"

static char xdg[PATH_MAX];

/* Run `jsdurable ARGS` with env (VAR=value words, may be "") and a clean
 * environment otherwise; stdout only when stdout_only, else both. */
static int cli(char *out, size_t cap, bool stdout_only, const char *env, const char *fmt, ...)
{
    char args[4096], cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    if (!xdg[0])
        snprintf(xdg, sizeof(xdg), "%s/xdg", jsd_test_dir());
    snprintf(cmd, sizeof(cmd),
             "env -u JSD_NATS_URL -u NATS_URL -u NATS_CONTEXT -u JSD_NATS_TOKEN -u NATS_TOKEN "
             "-u JSD_NATS_USER -u JSD_NATS_PASSWORD -u NATS_USER -u NATS_PASSWORD -u NATS_CREDS "
             "-u NATS_NKEY -u NATS_CERT -u NATS_KEY -u NATS_CA -u JSD_STORE -u JSD_LOG_FORMAT "
             "XDG_CONFIG_HOME='%s' %s '%s' %s%s",
             xdg, env ? env : "", jsd_fx_bin("jsdurable"), args, stdout_only ? " 2>/dev/null" : "");
    return jsd_test_run(cmd, out, cap);
}

static json_t *parse(const char *out)
{
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    if (!doc)
        fail_msg("not one JSON document (%s): %s", jerr.text, out);
    return doc;
}

static json_int_t int_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("\"%s\" is not an integer in %s", key, json_dumps(o, JSON_COMPACT));
    return json_integer_value(v);
}

/* Messages of a stream as `status -s URL --stream S -j` reports them. */
static json_int_t stream_msgs(const char *flags, const char *stream)
{
    char out[16384];
    ASSERT_EQ(cli(out, sizeof(out), true, "", "status %s --stream %s -j", flags, stream), 0);
    json_t *doc = parse(out);
    json_t *st = json_array_get(json_object_get(json_object_get(doc, "nats"), "streams"), 0);
    ASSERT_TRUE(st != NULL);
    json_int_t n = int_at(st, "messages");
    json_decref(doc);
    return n;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(text, f);
    ASSERT_EQ(fclose(f), 0);
}

/* A topology of one stream NAME capturing NAME.> (and its file path). */
static void topology(char *path, size_t cap, const char *name)
{
    char text[512];
    snprintf(path, cap, "%s/%s.topology.json", jsd_test_dir(), name);
    snprintf(text, sizeof(text), "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%s.>\"]}]}\n",
             name, name);
    write_file(path, text);
}

static void provision_ok(const char *flags, const char *name)
{
    char path[PATH_MAX], out[8192];
    topology(path, sizeof(path), name);
    ASSERT_EQ(cli(out, sizeof(out), true, "", "provision %s --file '%s' -j", flags, path), 0);
    json_t *doc = parse(out);
    ASSERT_TRUE(json_is_true(json_object_get(doc, "ok")));
    json_decref(doc);
}

static void short_server_flag_on_relay_status_publish(void **state)
{
    (void)state;
    char out[8192], flags[512], stream[96];
    const char *url = jsd_fx_shared_nats_url();
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("SFLAG"));
    snprintf(flags, sizeof(flags), "-s %s", url);
    provision_ok(flags, stream);

    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "publish -s %s --stream %s --subject %s.a --id one < /dev/null", url, stream,
                  stream),
              0);
    ASSERT_CONTAINS(out, "\"outcome\":\"accepted\"");
    ASSERT_I64_EQ(stream_msgs(flags, stream), 1);

    /* relay: an effect committed to a store goes out through -s */
    char store[PATH_MAX + 16];
    snprintf(store, sizeof(store), "sqlite:%s/sflag.db", jsd_test_dir());
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "enqueue --store '%s' --subject %s.b --id two -j "
                  "< /dev/null",
                  store, stream),
              0);
    ASSERT_EQ(cli(out, sizeof(out), false, "", "relay --store '%s' -s %s --until-idle", store, url),
              0);
    ASSERT_I64_EQ(stream_msgs(flags, stream), 2);

    /* --server, the long spelling, is the same flag */
    snprintf(flags, sizeof(flags), "--server %s", url);
    ASSERT_I64_EQ(stream_msgs(flags, stream), 2);
    /* and -sURL, the value attached as the nats CLI takes it */
    snprintf(flags, sizeof(flags), "-s%s", url);
    ASSERT_I64_EQ(stream_msgs(flags, stream), 2);
    ASSERT_EQ(cli(out, sizeof(out), false, "", "relay --store '%s' -s%s --until-idle", store, url),
              0);
    /* an attached value that is no URL is refused, not taken for another flag */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status -sbogus --stream %s -j", stream), 78);
    ASSERT_CONTAINS(out, "server URL \"bogus\" has no scheme");
}

static void nats_url_after_jsd_nats_url(void **state)
{
    (void)state;
    char out[8192], env[1024], stream[96];
    const char *url = jsd_fx_shared_nats_url();
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("NURL"));
    snprintf(env, sizeof(env), "-s %s", url);
    provision_ok(env, stream);

    /* NATS_URL alone is used */
    snprintf(env, sizeof(env), "NATS_URL=%s", url);
    ASSERT_EQ(cli(out, sizeof(out), false, env, "status --stream %s", stream), 0);
    ASSERT_CONTAINS(out, stream);
    /* JSD_NATS_URL wins over it: a dead NATS_URL is not tried ... */
    snprintf(env, sizeof(env), "NATS_URL=nats://127.0.0.1:1 JSD_NATS_URL=%s", url);
    ASSERT_EQ(cli(out, sizeof(out), false, env, "status --stream %s", stream), 0);
    /* ... and a dead JSD_NATS_URL is, although NATS_URL would answer */
    snprintf(env, sizeof(env), "NATS_URL=%s JSD_NATS_URL=nats://127.0.0.1:1", url);
    ASSERT_EQ(cli(out, sizeof(out), false, env, "status --stream %s --startup-budget-ms 0", stream),
              69);
    ASSERT_CONTAINS(out, "127.0.0.1:1");
}

/* The nats CLI's context folder under the test's XDG_CONFIG_HOME. */
static void context_file(const char *name, const char *text)
{
    char dir[PATH_MAX + 32], path[PATH_MAX + 64];
    if (!xdg[0])
        snprintf(xdg, sizeof(xdg), "%s/xdg", jsd_test_dir());
    snprintf(dir, sizeof(dir), "mkdir -p '%s/nats/context'", xdg);
    ASSERT_EQ(system(dir), 0);
    if (!strcmp(name, "context.txt"))
        snprintf(path, sizeof(path), "%s/nats/context.txt", xdg);
    else
        snprintf(path, sizeof(path), "%s/nats/context/%s.json", xdg, name);
    write_file(path, text);
}

static void context_supplies_url_and_token(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char out[16384], text[16384], env[1024], wrong[PATH_MAX + 16], stream[96];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_TLS, &fx), 0);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("CTX"));
    snprintf(text, sizeof(text),
             "{\"description\":\"test\",\"url\":\"%s\",\"token\":\"%s\",\"ca\":\"%s\"}\n", fx.url,
             fx.token, fx.ca_file);
    context_file("tlsctx", text);

    /* --context alone: URL, token and CA from the file */
    provision_ok("--context tlsctx", stream);
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "publish --context tlsctx --stream %s --subject %s.a --id one < /dev/null",
                  stream, stream),
              0);
    ASSERT_CONTAINS(out, "\"outcome\":\"accepted\"");
    ASSERT_NOT_CONTAINS(out, fx.token);
    ASSERT_I64_EQ(stream_msgs("--context tlsctx", stream), 1);
    /* $NATS_CONTEXT, and the nats CLI's selection when neither is given */
    ASSERT_EQ(cli(out, sizeof(out), false, "NATS_CONTEXT=tlsctx", "status --stream %s", stream), 0);
    context_file("context.txt", "tlsctx\n");
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --stream %s", stream), 0);
    ASSERT_CONTAINS(out, stream);
    ASSERT_NOT_CONTAINS(out, fx.token);

    /* a flag wins over the context: its URL, its token */
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "status --context tlsctx -s nats://127.0.0.1:1 --startup-budget-ms 0 "
                  "--stream %s",
                  stream),
              69);
    ASSERT_CONTAINS(out, "127.0.0.1:1");
    snprintf(wrong, sizeof(wrong), "%s/wrong.token", jsd_test_dir());
    write_file(wrong, "not-the-token\n");
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "status --context tlsctx --token-file '%s' --startup-budget-ms 0 --stream %s",
                  wrong, stream),
              77);
    /* so does a variable */
    ASSERT_EQ(cli(out, sizeof(out), false, "JSD_NATS_TOKEN=not-the-token",
                  "status --startup-budget-ms 0 --stream %s", stream),
              77);
    ASSERT_NOT_CONTAINS(out, fx.token);
    /* --no-context: the selection is not used */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --no-context --stream %s", stream), 64);

    /* malformed: refused, naming the file, never showing the token */
    snprintf(text, sizeof(text), "{\"url\":\"%s\",\"token\":\"%s\" %s\n", fx.url, fx.token,
             fx.token);
    context_file("broken", text);
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --context broken --stream %s", stream), 78);
    ASSERT_CONTAINS(out, "nats/context/broken.json");
    ASSERT_CONTAINS(out, "not valid JSON");
    ASSERT_NOT_CONTAINS(out, fx.token);
    /* a wrong type: named by its key */
    snprintf(text, sizeof(text), "{\"url\":\"%s\",\"token\":42}\n", fx.url);
    context_file("typed", text);
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --context typed --stream %s", stream), 78);
    ASSERT_CONTAINS(out, "\"token\" must be a string");
    /* missing, and selected but missing */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --context nosuch --stream %s", stream), 78);
    ASSERT_CONTAINS(out, "nats/context/nosuch.json");
    context_file("context.txt", "gone\n");
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --stream %s", stream), 78);
    ASSERT_CONTAINS(out, "nats/context/gone.json");
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status --context ../up --stream %s", stream), 64);
    /* the token may come from the environment the context names */
    snprintf(text, sizeof(text), "{\"url\":\"%s\",\"token\":\"env://CTX_TOKEN\",\"ca\":\"%s\"}\n",
             fx.url, fx.ca_file);
    context_file("indirect", text);
    snprintf(env, sizeof(env), "CTX_TOKEN=%s", fx.token);
    ASSERT_EQ(cli(out, sizeof(out), false, env, "status --context indirect --stream %s", stream),
              0);
    ASSERT_NOT_CONTAINS(out, fx.token);
    context_file("context.txt", "");
    jsd_fx_nats_stop(&fx);
}

/* Rewrite a stopped fixture's nats.conf: keep what comes before its
 * jetstream block (name, listen, http), then append tail (which may use %s
 * for the store folder, twice at most). */
static void rewrite_conf(jsd_fx_nats *fx, const char *tail)
{
    char path[PATH_MAX + 16], store[PATH_MAX + 8], *head = NULL, more[4096];
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/nats.conf", fx->dir);
    snprintf(store, sizeof(store), "%s/js", fx->dir);
    FILE *f = fopen(path, "r");
    ASSERT_TRUE(f != NULL);
    head = calloc(1, 65536);
    ASSERT_TRUE(head != NULL);
    len = fread(head, 1, 65535, f);
    fclose(f);
    head[len] = '\0';
    char *js = strstr(head, "jetstream {");
    ASSERT_TRUE(js != NULL);
    *js = '\0';
    snprintf(more, sizeof(more), tail, store, store);
    f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(head, f);
    fputs(more, f);
    ASSERT_EQ(fclose(f), 0);
    free(head);
}

static void js_domain_publishes_and_reads(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char out[8192], flags[512], text[1024], stream[96];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    rewrite_conf(&fx, "jetstream {\n  domain: hub\n  store_dir: \"%s\"\n}\n");
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("DOM"));

    snprintf(flags, sizeof(flags), "-s %s --js-domain hub", fx.url);
    provision_ok(flags, stream);
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "publish %s --stream %s --subject %s.a --id one < /dev/null", flags, stream,
                  stream),
              0);
    ASSERT_CONTAINS(out, "\"outcome\":\"accepted\"");
    char store[PATH_MAX + 16];
    snprintf(store, sizeof(store), "sqlite:%s/dom.db", jsd_test_dir());
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "enqueue --store '%s' --subject %s.b --id two < /dev/null", store, stream),
              0);
    ASSERT_EQ(cli(out, sizeof(out), false, "", "relay --store '%s' %s --until-idle", store, flags),
              0);
    ASSERT_I64_EQ(stream_msgs(flags, stream), 2);
    /* the prefix that domain stands for is the same thing */
    snprintf(flags, sizeof(flags), "-s %s --js-api-prefix '$JS.hub.API'", fx.url);
    ASSERT_I64_EQ(stream_msgs(flags, stream), 2);
    /* the domain is used: another one finds no JetStream */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status -s %s --js-domain elsewhere --stream %s",
                  fx.url, stream),
              78);
    ASSERT_CONTAINS(out, "$JS.elsewhere.API");
    /* from a context, too */
    snprintf(text, sizeof(text), "{\"url\":\"%s\",\"jetstream_domain\":\"hub\"}\n", fx.url);
    context_file("hubctx", text);
    ASSERT_I64_EQ(stream_msgs("--context hubctx", stream), 2);
    /* bad values are refused before connecting */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status -s %s --js-domain 'a.b' --stream %s", fx.url,
                  stream),
              78);
    ASSERT_CONTAINS(out, "is one token of");
    ASSERT_EQ(cli(out, sizeof(out), false, "", "status -s %s --js-api-prefix 'js.*' --stream %s",
                  fx.url, stream),
              78);
    ASSERT_CONTAINS(out, "without wildcards");
    jsd_fx_nats_stop(&fx);
}

/* Account B has no JetStream of its own and reaches A's through an import
 * under "jsa.API": every request (the relay's stream lookup included) must
 * go to that prefix, since "$JS.API" has no responders there. */
static void js_api_prefix_through_an_import(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char out[8192], flags[512], stream[96], conf[2048];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("IMP"));
    snprintf(conf, sizeof(conf),
             "jetstream {\n  store_dir: \"%%s\"\n}\n"
             "accounts {\n"
             "  A: { jetstream: enabled, users: [{user: a, password: pa}],\n"
             "       exports: [{service: \"$JS.API.>\"}, {service: \"%s.>\"}] }\n"
             "  B: { users: [{user: b, password: pb}],\n"
             "       imports: [{service: {account: A, subject: \"$JS.API.>\"}, to: "
             "\"jsa.API.>\"},\n"
             "                 {service: {account: A, subject: \"%s.>\"}}] }\n"
             "}\n",
             stream, stream);
    rewrite_conf(&fx, conf);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);

    char path[PATH_MAX];
    topology(path, sizeof(path), stream);
    ASSERT_EQ(cli(out, sizeof(out), false, "JSD_NATS_USER=a JSD_NATS_PASSWORD=pa",
                  "provision -s %s --file '%s'", fx.url, path),
              0);
    const char *b = "JSD_NATS_USER=b JSD_NATS_PASSWORD=pb";
    /* without the prefix B finds no JetStream */
    ASSERT_EQ(cli(out, sizeof(out), false, b, "status -s %s --stream %s", fx.url, stream), 78);
    snprintf(flags, sizeof(flags), "-s %s --js-api-prefix jsa.API", fx.url);
    char store[PATH_MAX + 16];
    snprintf(store, sizeof(store), "sqlite:%s/imp.db", jsd_test_dir());
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "enqueue --store '%s' --subject %s.b --id two < /dev/null", store, stream),
              0);
    /* bounded: a lookup sent to "$JS.API" would go unanswered for ever */
    char cmd[16384];
    snprintf(cmd, sizeof(cmd),
             "env -u JSD_NATS_URL -u NATS_URL -u NATS_CONTEXT XDG_CONFIG_HOME='%s' %s timeout 30 "
             "'%s' relay --store '%s' %s --until-idle",
             xdg, b, jsd_fx_bin("jsdurable"), store, flags);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    char env_b[256];
    snprintf(env_b, sizeof(env_b), "%s", b);
    ASSERT_EQ(cli(out, sizeof(out), true, env_b, "status %s --stream %s -j", flags, stream), 0);
    json_t *doc = parse(out);
    json_t *st = json_array_get(json_object_get(json_object_get(doc, "nats"), "streams"), 0);
    ASSERT_I64_EQ(int_at(st, "messages"), 1);
    json_decref(doc);
    jsd_fx_nats_stop(&fx);
}

/* Account B reaches A's JetStream account info ("$JS.API.INFO", imported)
 * but nothing else: the relay connects, and its stream lookup finds no
 * responders. The effect waits, spending no attempt, and the relay says so
 * at warn instead of waiting in silence. */
static void stream_lookup_without_responders_is_warned(void **state)
{
    (void)state;
    jsd_fx_nats fx;
    char conf[2048], stream[96];
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &fx), 0);
    ASSERT_EQ(jsd_fx_nats_stop(&fx), 0);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("NORESP"));
    snprintf(conf, sizeof(conf),
             "jetstream {\n  store_dir: \"%%s\"\n}\n"
             "accounts {\n"
             "  A: { jetstream: enabled, users: [{user: a, password: pa}],\n"
             "       exports: [{service: \"$JS.API.INFO\"}] }\n"
             "  B: { users: [{user: b, password: pb}],\n"
             "       imports: [{service: {account: A, subject: \"$JS.API.INFO\"}}] }\n"
             "}\n");
    rewrite_conf(&fx, conf);
    ASSERT_EQ(jsd_fx_nats_restart(&fx), 0);
    char out[8192], store[PATH_MAX + 16], log[PATH_MAX + 16];
    snprintf(store, sizeof(store), "sqlite:%s/noresp.db", jsd_test_dir());
    snprintf(log, sizeof(log), "%s/relay-noresp.log", jsd_test_dir());
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "enqueue --store '%s' --subject %s.x --id one < /dev/null", store, stream),
              0);
    setenv("JSD_NATS_USER", "b", 1);
    setenv("JSD_NATS_PASSWORD", "pb", 1);
    const char *argv_r[] = {
        jsd_fx_bin("jsdurable"), "relay", "--store", store, "-s", fx.url, "--poll-ms", "200", NULL};
    pid_t pid = jsd_test_spawn(argv_r, log, true, NULL);
    unsetenv("JSD_NATS_USER");
    unsetenv("JSD_NATS_PASSWORD");
    bool said =
        WAIT_UNTIL(jsd_test_file_contains(log, "the effects wait (no attempt is spent)"), 20000);
    kill(pid, SIGTERM);
    int status = 0;
    ASSERT_WAIT(waitpid(pid, &status, WNOHANG) == pid, 10000);
    if (!said) {
        char dump[8192] = "";
        FILE *lf = fopen(log, "r");
        if (lf) {
            dump[fread(dump, 1, sizeof(dump) - 1, lf)] = '\0';
            fclose(lf);
        }
        fail_msg("the relay did not warn that its effect waits; its log:\n%s", dump);
    }
    ASSERT_TRUE(jsd_test_file_contains(log, "WARN relay:"));
    /* no attempt was spent on the effect */
    ASSERT_EQ(cli(out, sizeof(out), true, "", "outbox list --store '%s' -j", store), 0);
    ASSERT_CONTAINS(out, "\"attempts\":0");
    jsd_fx_nats_stop(&fx);
}

static void json_on_dlq_provision_gc(void **state)
{
    (void)state;
    char out[16384], flags[512], dlq[96], orig[96], subject[160];
    const char *url = jsd_fx_shared_nats_url();
    snprintf(dlq, sizeof(dlq), "%s", jsd_test_unique("JDLQ"));
    snprintf(orig, sizeof(orig), "%s", jsd_test_unique("JORIG"));
    snprintf(flags, sizeof(flags), "-s %s", url);
    provision_ok(flags, dlq);
    provision_ok(flags, orig);

    /* provision -j: the plan (dry run) names each object */
    char path[PATH_MAX];
    topology(path, sizeof(path), orig);
    ASSERT_EQ(
        cli(out, sizeof(out), true, "", "provision -s %s --file '%s' --dry-run -j", url, path), 0);
    json_t *doc = parse(out);
    ASSERT_TRUE(json_is_true(json_object_get(doc, "dry_run")));
    json_t *obj = json_array_get(json_object_get(doc, "objects"), 0);
    ASSERT_STREQ(json_string_value(json_object_get(obj, "action")), "unchanged");
    ASSERT_STREQ(json_string_value(json_object_get(obj, "name")), orig);
    json_decref(doc);

    /* two death envelopes in the dead-letter stream: text, then bytes that
     * are not UTF-8 */
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    ASSERT_EQ(natsConnection_ConnectTo(&nc, url), NATS_OK);
    ASSERT_EQ(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    snprintf(subject, sizeof(subject), "%s.dead", dlq);
    char origin[160];
    snprintf(origin, sizeof(origin), "%s.x", orig);
    for (int i = 0; i < 2; i++) {
        natsMsg *m = NULL;
        jsPubAck *pa = NULL;
        jsErrCode jerr = 0;
        ASSERT_EQ(natsMsg_Create(&m, subject, NULL,
                                 i ? "\xff\x00"
                                     "a"
                                   : "payload\x01",
                                 i ? 3 : 8),
                  NATS_OK);
        natsMsgHeader_Set(m, JSD_HDR_DLQ_SUBJECT, origin);
        natsMsgHeader_Set(m, JSD_HDR_DLQ_STREAM, orig);
        natsMsgHeader_Set(m, JSD_HDR_DLQ_SEQ, "7");
        natsMsgHeader_Set(m, JSD_HDR_DLQ_REASON, "poison");
        natsMsgHeader_Set(m, JSD_HDR_DLQ_ERROR, "bad input");
        ASSERT_EQ(js_PublishMsg(&pa, js, m, NULL, &jerr), NATS_OK);
        jsPubAck_Destroy(pa);
        natsMsg_Destroy(m);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);

    ASSERT_EQ(cli(out, sizeof(out), true, "", "dlq list -s %s --stream %s -j", url, dlq), 0);
    doc = parse(out);
    ASSERT_I64_EQ(int_at(doc, "count"), 2);
    ASSERT_SIZE_EQ(json_array_size(json_object_get(doc, "dead_letters")), 2);
    obj = json_array_get(json_object_get(doc, "dead_letters"), 0);
    ASSERT_STREQ(json_string_value(json_object_get(obj, "reason")), "poison");
    ASSERT_STREQ(json_string_value(json_object_get(obj, "subject")), origin);
    ASSERT_I64_EQ(int_at(obj, "stream_seq"), 7);
    json_decref(doc);
    ASSERT_EQ(cli(out, sizeof(out), true, "", "dlq show -s %s --stream %s 1 -j", url, dlq), 0);
    doc = parse(out);
    obj = json_object_get(doc, "dead_letter");
    ASSERT_STREQ(json_string_value(json_object_get(obj, "payload")), "payload\x01");
    ASSERT_STREQ(json_string_value(json_object_get(obj, "error")), "bad input");
    json_decref(doc);
    ASSERT_EQ(cli(out, sizeof(out), true, "", "dlq show -s %s --stream %s 2 -j", url, dlq), 0);
    doc = parse(out);
    obj = json_object_get(doc, "dead_letter");
    ASSERT_TRUE(json_object_get(obj, "payload") == NULL);
    ASSERT_STREQ(json_string_value(json_object_get(obj, "payload_base64")), "/wBh");
    json_decref(doc);
    /* replay: --store (the parking durable's store) or --republish, never a
     * silent republication */
    ASSERT_EQ(cli(out, sizeof(out), false, "", "dlq replay -s %s --stream %s 1 -j", url, dlq), 64);
    ASSERT_CONTAINS(out, "give --store URL");
    ASSERT_EQ(
        cli(out, sizeof(out), true, "", "dlq replay -s %s --stream %s 1 --republish -j", url, dlq),
        0);
    doc = parse(out);
    obj = json_array_get(json_object_get(doc, "results"), 0);
    ASSERT_TRUE(json_is_true(json_object_get(obj, "ok")));
    ASSERT_I64_EQ(int_at(obj, "new_seq"), 1);
    ASSERT_I64_EQ(int_at(doc, "done"), 1);
    json_decref(doc);
    ASSERT_EQ(cli(out, sizeof(out), true, "", "dlq purge -s %s --stream %s --all --json", url, dlq),
              0);
    doc = parse(out);
    ASSERT_I64_EQ(int_at(doc, "purged"), 2);
    json_decref(doc);

    /* gc -j: the horizon, the window it was checked against, rows removed */
    char store[PATH_MAX + 16];
    snprintf(store, sizeof(store), "sqlite:%s/gc.db", jsd_test_dir());
    ASSERT_EQ(cli(out, sizeof(out), false, "",
                  "enqueue --store '%s' --subject %s.g --id g < /dev/null", store, orig),
              0);
    ASSERT_EQ(cli(out, sizeof(out), true, "", "gc --store '%s' --older-than 0 --dedup-window 0 -j",
                  store),
              0);
    doc = parse(out);
    ASSERT_TRUE(json_is_true(json_object_get(doc, "ok")));
    ASSERT_I64_EQ(int_at(doc, "horizon_ms"), 0);
    ASSERT_I64_EQ(int_at(doc, "removed"), 0); /* the effect is not published: kept */
    json_decref(doc);
    ASSERT_EQ(
        cli(out, sizeof(out), true, "", "gc --store '%s' --older-than 1s -s %s -j", store, url),
        78);
    doc = parse(out);
    ASSERT_TRUE(json_is_false(json_object_get(doc, "ok")));
    ASSERT_I64_EQ(int_at(doc, "horizon_ms"), 1000);
    ASSERT_TRUE(json_integer_value(json_object_get(doc, "duplicate_window_ms")) >= 120000);
    ASSERT_CONTAINS(json_string_value(json_object_get(doc, "error")), "duplicate window");
    json_decref(doc);

    /* publish: --payload-json is the payload check; -j changes nothing */
    char payload[PATH_MAX];
    snprintf(payload, sizeof(payload), "%s/nope.txt", jsd_test_dir());
    write_file(payload, "nope");
    ASSERT_EQ(cli(out, sizeof(out), true, "",
                  "publish -s %s --stream %s --subject %s.p --id p1 --payload-json -j < '%s'", url,
                  orig, orig, payload),
              65);
    ASSERT_CONTAINS(out, "\"outcome\":\"rejected\"");
    ASSERT_EQ(cli(out, sizeof(out), true, "",
                  "publish -s %s --stream %s --subject %s.p --id p2 -j < '%s'", url, orig, orig,
                  payload),
              0);
    ASSERT_CONTAINS(out, "\"outcome\":\"accepted\"");
}

JSD_TEST_MAIN(cmocka_unit_test(short_server_flag_on_relay_status_publish),
              cmocka_unit_test(nats_url_after_jsd_nats_url),
              cmocka_unit_test(context_supplies_url_and_token),
              cmocka_unit_test(js_domain_publishes_and_reads),
              cmocka_unit_test(js_api_prefix_through_an_import),
              cmocka_unit_test(stream_lookup_without_responders_is_warned),
              cmocka_unit_test(json_on_dlq_provision_gc))
