/*
 * The store's commands of the jsdurable tool, run as a user would run them
 * (the built binary, through a shell): enqueue (one effect and --jsonl),
 * status (text and --json) and gc, on SQLite and PostgreSQL. What they
 * committed is checked through the library.
 */
#include <stdlib.h>

#include "fixture.h"
#include "store/store.h"
#include "test.h"

enum { BE_SQLITE = 1, BE_PG = 2 };
static int be_sqlite = BE_SQLITE, be_pg = BE_PG;
#define BE(state) (*(int *)*(state))
#define BOTH(f)                                                                                    \
    {"sqlite_" #f, f, NULL, NULL, &be_sqlite},                                                     \
    {                                                                                              \
        "pg_" #f, f, NULL, NULL, &be_pg                                                            \
    }

static char out[1 << 16];

static void make_url(void **state, char *url, size_t cap)
{
    if (BE(state) == BE_SQLITE)
        jsd_fx_sqlite_url(url, cap);
    else
        assert_int_equal(jsd_fx_pg_database(url, cap), 0);
}

/* Run "jsdurable ARGS" with a shell prefix (stdin redirection etc.). */
static int run(const char *prefix, const char *args)
{
    char cmd[8000];
    snprintf(cmd, sizeof(cmd), "%s '%s' %s", prefix ? prefix : "", jsd_fx_bin("jsdurable"), args);
    return jsd_test_run(cmd, out, sizeof(out));
}

static jsd_store *open_url(const char *url)
{
    jsd_store *s = NULL;
    jsd_error e;
    if (jsd_store_open(&s, url, &e) != JSD_OK)
        fail_msg("open %s: %s", url, e.msg);
    return s;
}

static void enqueue_one_effect(void **state)
{
    char url[512], args[2048], want[200], mid[JSD_MSG_ID_MAX];
    make_url(state, url, sizeof(url));
    snprintf(args, sizeof(args),
             "enqueue --store '%s' --subject orders.created --owner order-42 --id created "
             "--header X-Trace:t1 --header 'Content-Type:application/json' --order-key order-42",
             url);
    ASSERT_EQ(run("printf '{\"order\":42}' |", args), 0);
    jsd_store *s = open_url(url);
    ASSERT_EQ(strlen(jsd_store_namespace(s)), 32); /* the store id */
    ASSERT_OK(jsd_effect_msg_id(jsd_store_namespace(s), "order-42", "created", mid));
    snprintf(want, sizeof(want), "{\"owner\":\"order-42\",\"id\":\"created\",\"msg_id\":\"%s\"}",
             mid);
    ASSERT_CONTAINS(out, want);

    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 1);
    ASSERT_STREQ(b.items[0].subject, "orders.created");
    ASSERT_EQ(b.items[0].len, 12);
    assert_memory_equal(b.items[0].payload, "{\"order\":42}", 12);
    ASSERT_EQ(b.items[0].n_headers, 2);
    ASSERT_STREQ(b.items[0].headers[1].name, "Content-Type");
    ASSERT_STREQ(b.items[0].headers[1].value, "application/json");
    ASSERT_STREQ(b.items[0].order_key, "order-42");
    jsd__effect_batch_free(&b);

    /* The same identity again: refused, exit 65, nothing added. */
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "already exists");
    ASSERT_CONTAINS(out, "nothing was committed");
    /* A delay makes a durable timer; JSD_STORE stands in for --store. */
    char prefix[700];
    snprintf(prefix, sizeof(prefix), "printf '' | JSD_STORE='%s'", url);
    ASSERT_EQ(run(prefix, "enqueue --subject timers.fire --id t1 --delay-ms 3600000"), 0);
    jsd_store_stats st;
    ASSERT_OK(jsd_store_stats_get(s, &st));
    ASSERT_EQ(st.backlog, 2);
    ASSERT_EQ(st.due, 1);
    jsd_store_close(s);
}

static void enqueue_refuses_bad_input(void **state)
{
    char url[512], args[2048];
    make_url(state, url, sizeof(url));
    char subj[300];
    memset(subj, 'a', 257);
    subj[257] = '\0';
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject %s --id x", url, subj);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "limit is 256");
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject 'orders.*' --id x", url);
    ASSERT_EQ(run("printf x |", args), 65);
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id x --header Nats-Msg-Id:x",
             url);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "reserved");
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id x --header novalue", url);
    ASSERT_EQ(run("printf x |", args), 64);
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id big", url);
    ASSERT_EQ(run("head -c 262145 /dev/zero |", args), 65);
    ASSERT_CONTAINS(out, "over 262144 bytes, the payload limit");
    ASSERT_EQ(run("head -c 262144 /dev/zero |", args), 0);
    ASSERT_EQ(run("printf x |", "enqueue --subject a.b --id x"), 64); /* no store */
    ASSERT_EQ(run(NULL, "enqueue --store sqlite:/nonexistent/x.db --subject a.b --id x </dev/null"),
              74);
    jsd_store *s = open_url(url);
    jsd_store_stats st;
    ASSERT_OK(jsd_store_stats_get(s, &st));
    ASSERT_EQ(st.backlog, 1);
    jsd_store_close(s);
}

/* Every limit of an effect, crossed by one through `jsdurable enqueue`: the
 * CLI holds no limits of its own, the library's emit checks answer. */
static void enqueue_limits_match_the_relay(void **state)
{
    char url[512], args[6000], hdrs[4500], v[300];
    make_url(state, url, sizeof(url));
    /* a reserved subject prefix */
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject _INBOX.x --id x", url);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "reserved \"_INBOX\" prefix");
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject _INBOXES.x --id x", url);
    ASSERT_EQ(run("printf x |", args), 0);
    /* 17 headers; 16 pass */
    size_t o = 0;
    for (int i = 0; i < 17; i++)
        o += (size_t)snprintf(hdrs + o, sizeof(hdrs) - o, " --header X-H%d:v", i);
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id h17%s", url, hdrs);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "more than 16");
    /* header name of 65 bytes; 64 pass */
    char name[80];
    memset(name, 'N', 65);
    name[65] = '\0';
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id n65 --header %s:v", url,
             name);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "is 65 bytes; the limit is 64");
    name[64] = '\0';
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id n64 --header %s:v", url,
             name);
    ASSERT_EQ(run("printf x |", args), 0);
    /* header value of 257 bytes; 256 pass */
    memset(v, 'v', 257);
    v[257] = '\0';
    snprintf(args, sizeof(args), "enqueue --store '%s' --subject a.b --id v257 --header X-V:%s",
             url, v);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "value is 257 bytes; the limit is 256");
    /* encoded headers: 3840 bytes pass, 3841 do not. 14 headers
     * "X-Hnn: <256 v>\r\n" take 5 + 2 + 256 + 2 = 265 bytes each (3710); a 15th
     * "X-Hzz: <121 w>\r\n" takes 130: 3840. */
    memset(v, 'v', 256);
    v[256] = '\0';
    o = 0;
    for (int i = 0; i < 14; i++)
        o += (size_t)snprintf(hdrs + o, sizeof(hdrs) - o, " --header X-H%02d:%s", i, v);
    char last[200];
    memset(last, 'w', 121);
    last[121] = '\0';
    snprintf(args, sizeof(args),
             "enqueue --store '%s' --subject a.b --id w3840%s --header X-Hzz:%s", url, hdrs, last);
    ASSERT_EQ(run("printf x |", args), 0);
    last[121] = 'w';
    last[122] = '\0';
    snprintf(args, sizeof(args),
             "enqueue --store '%s' --subject a.b --id w3841%s --header X-Hzz:%s", url, hdrs, last);
    ASSERT_EQ(run("printf x |", args), 65);
    ASSERT_CONTAINS(out, "headers are 3841 bytes as encoded on the wire; the limit is 3840");
    /* the same through --jsonl */
    snprintf(args, sizeof(args), "enqueue --store '%s' --jsonl", url);
    ASSERT_EQ(run("printf '{\"subject\":\"_INBOX.y\",\"id\":\"j\"}\\n' |", args), 65);
    ASSERT_CONTAINS(out, "line 1: ");
    ASSERT_CONTAINS(out, "_INBOX");
    jsd_store *s = open_url(url);
    jsd_store_stats st;
    ASSERT_OK(jsd_store_stats_get(s, &st));
    ASSERT_EQ(st.backlog, 3); /* _INBOXES.x, n64, w3840 */
    jsd_store_close(s);
}

/* The message-id namespace through the CLI: the URL's namespace parameter,
 * $JSD_STORE_NAMESPACE, and a clear refusal of a bad one. */
static void enqueue_namespace(void **state)
{
    char url[512], args[2048], want[200], mid[JSD_MSG_ID_MAX], prefix[800];
    make_url(state, url, sizeof(url));
    const char *sep = strchr(url, '?') ? "&" : "?";
    snprintf(args, sizeof(args), "enqueue --store '%s%snamespace=shop-a' --subject a.b --id k1",
             url, sep);
    ASSERT_EQ(run("printf x |", args), 0);
    ASSERT_OK(jsd_effect_msg_id("shop-a", "", "k1", mid));
    snprintf(want, sizeof(want), "\"msg_id\":\"%s\"", mid);
    ASSERT_CONTAINS(out, want);
    snprintf(prefix, sizeof(prefix), "printf x | JSD_STORE_NAMESPACE=shop-b JSD_STORE='%s'", url);
    ASSERT_EQ(run(prefix, "enqueue --subject a.b --id k2"), 0);
    ASSERT_OK(jsd_effect_msg_id("shop-b", "", "k2", mid));
    snprintf(want, sizeof(want), "\"msg_id\":\"%s\"", mid);
    ASSERT_CONTAINS(out, want);
    snprintf(prefix, sizeof(prefix), "printf x | JSD_STORE_NAMESPACE='bad ns' JSD_STORE='%s'", url);
    ASSERT_EQ(run(prefix, "enqueue --subject a.b --id k3"), 78);
    ASSERT_CONTAINS(out, "message-id namespace \"bad ns\" has byte 0x20");
    /* the rows keep what they were committed with */
    jsd_store *s = open_url(url);
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    ASSERT_OK(jsd__store_claim(s, 10, 1000, "t", jsd__now_ms(), &b));
    ASSERT_EQ(b.n, 2);
    ASSERT_OK(jsd_effect_msg_id("shop-a", "", "k1", mid));
    ASSERT_STREQ(b.items[0].msg_id, mid);
    ASSERT_OK(jsd_effect_msg_id("shop-b", "", "k2", mid));
    ASSERT_STREQ(b.items[1].msg_id, mid);
    jsd__effect_batch_free(&b);
    jsd_store_close(s);
}

static void enqueue_jsonl_in_batches(void **state)
{
    char url[512], args[2048], file[600];
    make_url(state, url, sizeof(url));
    snprintf(file, sizeof(file), "%s/lines.jsonl", jsd_test_dir());
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    for (int i = 0; i < 600; i++)
        fprintf(f,
                "{\"subject\":\"bulk.x\",\"owner\":\"o\",\"id\":\"e%d\",\"payload\":\"p%d\","
                "\"headers\":{\"X-N\":\"%d\"}}\n",
                i, i, i);
    fclose(f);
    snprintf(args, sizeof(args), "enqueue --store '%s' --jsonl --batch 256 < '%s'", url, file);
    ASSERT_EQ(run(NULL, args), 0);
    ASSERT_CONTAINS(out, "\"id\":\"e599\"");
    ASSERT_CONTAINS(out, "600 effects committed");

    /* A bad line: earlier batches stay, its batch does not, the line is named. */
    f = fopen(file, "w");
    for (int i = 0; i < 300; i++)
        fprintf(f, "{\"subject\":\"bulk.y\",\"id\":\"f%d\"}\n", i);
    fprintf(f, "{\"subject\":\"bulk.y\",\"id\":\"f300\",\"payload\":7}\n");
    fprintf(f, "{\"subject\":\"bulk.y\",\"id\":\"f301\"}\n");
    fclose(f);
    snprintf(args, sizeof(args), "enqueue --store '%s' --jsonl --batch 100 < '%s'", url, file);
    ASSERT_EQ(run(NULL, args), 65);
    ASSERT_CONTAINS(out, "line 301");
    ASSERT_CONTAINS(out, "300 effects committed before the failure");
    /* A duplicate identity in a batch: the whole batch is refused. */
    f = fopen(file, "w");
    fprintf(f, "{\"subject\":\"bulk.z\",\"id\":\"g1\"}\n");
    fprintf(f, "{\"subject\":\"bulk.z\",\"id\":\"e5\",\"owner\":\"o\"}\n");
    fclose(f);
    snprintf(args, sizeof(args), "enqueue --store '%s' --jsonl < '%s'", url, file);
    ASSERT_EQ(run(NULL, args), 65);
    ASSERT_CONTAINS(out, "line 2");
    ASSERT_CONTAINS(out, "already exists");
    jsd_store *s = open_url(url);
    jsd_store_stats st;
    ASSERT_OK(jsd_store_stats_get(s, &st));
    ASSERT_EQ(st.backlog, 900);
    jsd_store_close(s);
}

static void status_and_gc(void **state)
{
    char url[512], args[1024];
    make_url(state, url, sizeof(url));
    jsd_store *s = open_url(url);
    jsd_tx *tx;
    ASSERT_OK(jsd_tx_begin(&tx, s));
    for (int i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof(id), "e%d", i);
        jsd_effect e = {.id = id, .subject = "s.x"};
        ASSERT_OK(jsd_tx_emit(tx, &e));
    }
    ASSERT_OK(jsd__tx_inbox_insert(tx, "S", "c", 1, NULL, 0, NULL, NULL));
    ASSERT_OK(jsd_tx_commit(tx));
    jsd__effect_batch b;
    jsd__effect_batch_init(&b);
    int64_t now = jsd__now_ms();
    ASSERT_OK(jsd__store_claim(s, 3, 1000, "t", now, &b));
    ASSERT_EQ(b.n, 3);
    jsd__receipt r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (jsd__receipt){.row_id = b.items[i].row_id,
                              .stream = "S",
                              .seq = (uint64_t)i + 1,
                              .published_at_ms = now - 2 * 3600 * 1000};
    ASSERT_OK(jsd__store_record_receipts(s, "t", r, 3, NULL));
    jsd__effect_batch_free(&b);
    jsd_store_close(s);

    snprintf(args, sizeof(args), "status --store '%s' --json", url);
    ASSERT_EQ(run(NULL, args), 0);
    ASSERT_CONTAINS(out, "\"backlog\":2");
    ASSERT_CONTAINS(out, "\"published\":3");
    ASSERT_CONTAINS(out, "\"inbox_rows\":1");
    ASSERT_CONTAINS(out, "\"dead_lettered\":0");
    ASSERT_CONTAINS(out,
                    BE(state) == BE_PG ? "\"backend\":\"postgres\"" : "\"backend\":\"sqlite\"");
    char prefix[700];
    snprintf(prefix, sizeof(prefix), "JSD_STORE='%s'", url);
    ASSERT_EQ(run(prefix, "status"), 0);
    ASSERT_CONTAINS(out, "outbox backlog   2");
    ASSERT_CONTAINS(out, "published        3");

    /* A horizon under the duplicate window (or the floor) is refused. */
    snprintf(args, sizeof(args), "gc --store '%s' --older-than 1m --dedup-window 2m", url);
    ASSERT_EQ(run(NULL, args), 78);
    ASSERT_CONTAINS(out, "duplicate window");
    snprintf(args, sizeof(args),
             "gc --store '%s' --older-than 1h --dedup-window 2m --min-horizon 3h", url);
    ASSERT_EQ(run(NULL, args), 78);
    snprintf(args, sizeof(args), "gc --store '%s' --older-than 10s --dedup-window 5s --batch 0",
             url);
    ASSERT_EQ(run(NULL, args), 64);
    snprintf(args, sizeof(args), "gc --store '%s' --older-than 1h --dedup-window 2m --batch 1",
             url);
    ASSERT_EQ(run(NULL, args), 0);
    ASSERT_CONTAINS(out, "removed 3 rows");
    snprintf(args, sizeof(args), "status --store '%s' --json", url);
    ASSERT_EQ(run(NULL, args), 0);
    ASSERT_CONTAINS(out, "\"published\":0");
    ASSERT_CONTAINS(out, "\"backlog\":2");
    ASSERT_CONTAINS(out, "\"inbox_rows\":1");
}

static void help_and_secrets(void **state)
{
    (void)state;
    static const char *const cmds[] = {"enqueue --help", "status --help", "gc --help"};
    for (size_t i = 0; i < JSD_ARRAY_LEN(cmds); i++) {
        ASSERT_EQ(run(NULL, cmds[i]), 0);
        ASSERT_CONTAINS(out, "Example");
        ASSERT_CONTAINS(out, "Exit codes");
    }
    ASSERT_EQ(run(NULL, "status --store 'postgresql://u:hunter2@127.0.0.1:1/x'"), 69);
    ASSERT_CONTAINS(out, "u:***@127.0.0.1:1");
    ASSERT_NOT_CONTAINS(out, "hunter2");
    ASSERT_EQ(run("printf x |", "enqueue --store 'postgres://u:hunter2@127.0.0.1:1/x' "
                                "--subject a.b --id x"),
              69);
    ASSERT_NOT_CONTAINS(out, "hunter2");
    ASSERT_EQ(
        run(NULL,
            "gc --store 'postgres://u:hunter2@127.0.0.1:1/x' --older-than 1d --dedup-window 2m"),
        69);
    ASSERT_NOT_CONTAINS(out, "hunter2");
    ASSERT_EQ(run(NULL, "status --store 'mysql://x'"), 78);
    ASSERT_EQ(run(NULL, "status"), 64);
}

JSD_TEST_MAIN(BOTH(enqueue_one_effect), BOTH(enqueue_refuses_bad_input),
              BOTH(enqueue_limits_match_the_relay), BOTH(enqueue_namespace),
              BOTH(enqueue_jsonl_in_batches), BOTH(status_and_gc),
              cmocka_unit_test(help_and_secrets))
