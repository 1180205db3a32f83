/*
 * `jsdurable publish` end to end: one JSON line per outcome and the exit code
 * documented for it (0 accepted, including a duplicate; 65 rejected; 69
 * unavailable; 75 unknown; 77 denied; 78 binding refused), with the payload
 * from stdin.
 */
#include <stdlib.h>

#include "proxy.h"
#include "publisher_env.h"

static int run(const char *url_env, const char *args, const char *input, char *out, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "printf '%%s' '%s' | %s %s publish %s 2>/dev/null", input,
             url_env ? url_env : "", jsd_fx_bin("jsdurable"), args);
    return jsd_test_run(cmd, out, cap);
}

static void outcomes_and_exit_codes(void **state)
{
    (void)state;
    char out[4096], args[1024], env[512], stream[96], filter[128], mem[96];
    const char *url = jsd_fx_shared_nats_url();
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("CLI"));
    snprintf(filter, sizeof(filter), "%s.>", stream);
    ph_add_stream(js, &(ph_stream){.name = stream, .subject = filter});
    snprintf(mem, sizeof(mem), "%s", jsd_test_unique("CLIMEM"));
    snprintf(filter, sizeof(filter), "%s.>", mem);
    ph_add_stream(js, &(ph_stream){.name = mem, .subject = filter, .memory = true});

    snprintf(args, sizeof(args),
             "--nats %s --stream %s --subject %s.created --id order-42 "
             "--header trace:abc",
             url, stream, stream);
    ASSERT_EQ(run(NULL, args, "{\"id\":42}", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "{\"outcome\":\"accepted\",\"stream\":\"");
    ASSERT_CONTAINS(out, "\"seq\":1,\"duplicate\":false");
    ASSERT_EQ(strchr(out, '\n') - out + 1, (long)strlen(out)); /* one line */

    /* JSD_NATS_URL instead of --nats; the same id is a duplicate, still 0 */
    snprintf(env, sizeof(env), "JSD_NATS_URL=%s", url);
    snprintf(args, sizeof(args), "--stream %s --subject %s.created --id order-42", stream, stream);
    ASSERT_EQ(run(env, args, "{\"id\":42}", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "\"seq\":1,\"duplicate\":true");
    ASSERT_EQ(ph_stream_msgs(js, stream), 1);
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    const char *v = NULL;
    ASSERT_EQ(js_GetMsg(&m, js, stream, 1, NULL, &jerr), NATS_OK);
    ASSERT_EQ(natsMsg_GetDataLength(m), 9);
    ASSERT_EQ(natsMsgHeader_Get(m, "Jsd-Attr-trace", &v), NATS_OK);
    ASSERT_STREQ(v, "abc");
    natsMsg_Destroy(m);

    /* rejected: a wildcard subject, and a CR in an attribute */
    snprintf(args, sizeof(args), "--nats %s --stream %s --subject '%s.*' --id x", url, stream,
             stream);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 65);
    ASSERT_CONTAINS(out, "\"outcome\":\"rejected\"");
    ASSERT_CONTAINS(out, "wildcard");
    snprintf(args, sizeof(args),
             "--nats %s --stream %s --subject %s.x --id x --header \"a:b$(printf '\\r')c\"", url,
             stream, stream);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 65);
    ASSERT_CONTAINS(out, "CR");

    /* binding refused: memory storage */
    snprintf(args, sizeof(args), "--nats %s --stream %s --subject %s.x --id x", url, mem, mem);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "uses memory storage; bind needs file storage");

    /* unavailable: nothing to connect to (FAILED needs the stream to vanish after
     * binding; the library tests cover it) */
    snprintf(args, sizeof(args),
             "--nats nats://127.0.0.1:1 --startup-budget-ms 0 --stream %s --subject %s.x --id x",
             stream, stream);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 69);
    ASSERT_CONTAINS(out, "\"outcome\":\"unavailable\"");

    /* usage */
    ASSERT_EQ(run(NULL, "--stream S", "x", out, sizeof(out)), 64);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
}

static void dropped_ack_exits_75_then_duplicate(void **state)
{
    (void)state;
    char out[4096], args[1024], stream[96], filter[128];
    const char *url = jsd_fx_shared_nats_url();
    jsd_fx_proxy px;
    ASSERT_EQ(jsd_fx_proxy_start(jsd_fx_url_port(url), "drop-first-puback", &px), 0);
    natsConnection *direct = ph_direct(url, NULL, NULL);
    jsCtx *js = ph_js(direct);
    snprintf(stream, sizeof(stream), "%s", jsd_test_unique("CLIU"));
    snprintf(filter, sizeof(filter), "%s.>", stream);
    ph_add_stream(js, &(ph_stream){.name = stream, .subject = filter});

    snprintf(args, sizeof(args), "--nats %s --stream %s --subject %s.x --id u-1 --deadline-ms 1000",
             px.url, stream, stream);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 75);
    ASSERT_CONTAINS(out, "\"outcome\":\"unknown\"");
    ASSERT_CONTAINS(out, "retry with the same id");
    ASSERT_EQ(ph_stream_msgs(js, stream), 1);
    /* the script's retry with the same id */
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "\"duplicate\":true");
    ASSERT_EQ(ph_stream_msgs(js, stream), 1);
    jsd_fx_proxy_stop(&px);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
}

static void denied_exits_77(void **state)
{
    (void)state;
    char out[4096], args[1024], pwfile[600];
    jsd_fx_nats fx;
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_USERPASS, &fx), 0);
    natsConnection *direct = ph_direct(fx.url, fx.user, fx.password);
    jsCtx *js = ph_js(direct);
    ph_add_stream(js, &(ph_stream){.name = "DENY", .subject = "denied.>"});
    snprintf(pwfile, sizeof(pwfile), "%s/limited.pw", jsd_test_dir());
    FILE *f = fopen(pwfile, "w");
    ASSERT_TRUE(f != NULL);
    fputs(fx.limited_password, f);
    fclose(f);
    snprintf(args, sizeof(args),
             "--nats %s --user %s --password-file %s --stream DENY --subject denied.x --id d-1",
             fx.url, fx.limited_user, pwfile);
    ASSERT_EQ(run(NULL, args, "x", out, sizeof(out)), 77);
    ASSERT_CONTAINS(out, "\"outcome\":\"denied\"");
    ASSERT_NOT_CONTAINS(out, fx.limited_password);
    ASSERT_EQ(ph_stream_msgs(js, "DENY"), 0);
    jsCtx_Destroy(js);
    natsConnection_Destroy(direct);
    jsd_fx_nats_stop(&fx);
}

JSD_TEST_MAIN(cmocka_unit_test(outcomes_and_exit_codes),
              cmocka_unit_test(dropped_ack_exits_75_then_duplicate),
              cmocka_unit_test(denied_exits_77))
