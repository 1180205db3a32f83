/*
 * Unit tests for the topology file parser: a valid file with defaults filled
 * in, and for each refusal the exact key path it names (unknown keys, bad
 * durations and sizes, limits crossed, wildcard rules, overlapping subjects
 * between and within streams, the dead-letter stream's own root).
 */
#include <stdlib.h>
#include <unistd.h>

#include "test.h"
#include "jsd_int.h"

#define DAY_MS (24LL * 3600 * 1000)

static const char valid_file[] =
    "{\n"
    "  \"version\": 1,\n"
    "  \"streams\": [\n"
    "    {\"name\": \"ORDERS\", \"subjects\": [\"orders.>\"], \"max_age\": \"72h\",\n"
    "     \"max_bytes\": \"1GiB\", \"max_msgs\": 1000000, \"max_msgs_per_subject\": 100,\n"
    "     \"discard\": \"old\", \"duplicate_window\": \"24h\", \"replicas\": 1},\n"
    "    {\"name\": \"HEARTBEAT\", \"subjects\": [\"hb.*\", \"beat.x\"], \"storage\": \"memory\",\n"
    "     \"discard\": \"new\", \"max_age\": \"30s\"}\n"
    "  ],\n"
    "  \"dead_letter\": {\"name\": \"DLQ\", \"subjects\": [\"jsd.dlq.>\"], \"max_msgs\": 100000},\n"
    "  \"consumers\": [\n"
    "    {\"stream\": \"ORDERS\", \"durable\": \"shipping\", \"filter_subject\": "
    "\"orders.created\",\n"
    "     \"max_deliver\": 5, \"backoff\": [\"1s\", \"2s\", \"5s\", "
    "\"10s\"],\n"
    "     \"max_ack_pending\": 256, \"inactive_threshold\": \"7d\", \"deliver\": \"all\"},\n"
    "    {\"stream\": \"DLQ\", \"durable\": \"dlq-tools\"}\n"
    "  ]\n"
    "}\n";

static void parses_valid_file_with_defaults(void **state)
{
    (void)state;
    jsd_topology *t = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_topology_parse(&t, valid_file, strlen(valid_file), &e), e.msg);
    ASSERT_EQ(jsd_topology_stream_count(t), 3);
    ASSERT_EQ(jsd_topology_consumer_count(t), 2);

    const jsd_topology_stream *s = jsd_topology_stream_at(t, 0);
    ASSERT_STREQ(s->name, "ORDERS");
    ASSERT_EQ(s->n_subjects, 1);
    ASSERT_STREQ(s->subjects[0], "orders.>");
    ASSERT_EQ(s->storage, JSD_TOPOLOGY_FILE);
    ASSERT_EQ(s->retention, JSD_TOPOLOGY_LIMITS);
    ASSERT_EQ(s->max_age_ms, 72LL * 3600 * 1000);
    ASSERT_EQ(s->max_bytes, 1024LL * 1024 * 1024);
    ASSERT_EQ(s->max_msgs, 1000000);
    ASSERT_EQ(s->max_msgs_per_subject, 100);
    ASSERT_EQ(s->duplicate_window_ms, DAY_MS);
    ASSERT_EQ(s->replicas, 1);
    ASSERT_TRUE(!s->dead_letter);
    ASSERT_EQ(s->allow_atomic, -1); /* not said: the server's setting stands */
    ASSERT_TRUE(s->persist_mode == NULL);

    s = jsd_topology_stream_at(t, 1);
    ASSERT_EQ(s->storage, JSD_TOPOLOGY_MEMORY);
    ASSERT_EQ(s->discard, JSD_TOPOLOGY_DISCARD_NEW);
    ASSERT_EQ(s->max_msgs, -1);
    ASSERT_EQ(s->max_bytes, -1);
    /* duplicate window defaults to 2 min, or max_age when that is shorter */
    ASSERT_EQ(s->duplicate_window_ms, 30000);

    const jsd_topology_stream *d = jsd_topology_dead_letter(t);
    ASSERT_TRUE(d != NULL);
    ASSERT_STREQ(d->name, "DLQ");
    ASSERT_TRUE(d->dead_letter);
    ASSERT_EQ(d->max_age_ms, 0);
    ASSERT_EQ(d->duplicate_window_ms, 120000);
    ASSERT_TRUE(d == jsd_topology_stream_at(t, 2));

    const jsd_topology_consumer *c = jsd_topology_consumer_at(t, 0);
    ASSERT_STREQ(c->stream, "ORDERS");
    ASSERT_STREQ(c->durable, "shipping");
    ASSERT_STREQ(c->filter_subject, "orders.created");
    /* with a backoff list, the first ack wait is backoff[0] */
    ASSERT_EQ(c->ack_wait_ms, 1000);
    ASSERT_EQ(c->max_deliver, 5);
    ASSERT_EQ(c->n_backoff, 4);
    ASSERT_EQ(c->backoff_ms[2], 5000);
    ASSERT_EQ(c->max_ack_pending, 256);
    ASSERT_EQ(c->inactive_threshold_ms, 7 * DAY_MS);

    c = jsd_topology_consumer_at(t, 1);
    ASSERT_TRUE(c->filter_subject == NULL);
    ASSERT_EQ(c->ack_wait_ms, 30000);
    ASSERT_EQ(c->max_deliver, -1);
    ASSERT_EQ(c->max_ack_pending, 1000);
    ASSERT_EQ(c->n_backoff, 0);
    ASSERT_EQ(c->inactive_threshold_ms, 0);
    ASSERT_TRUE(jsd_topology_stream_at(t, 3) == NULL);
    jsd_topology_destroy(t);
    jsd_topology_destroy(NULL);
}

/* Parse text that must be refused with JSD_ERR_CONFIG; the message must start
 * with the key path. */
static void expect_refused(const char *json, const char *path_prefix, const char *also)
{
    jsd_topology *t = (jsd_topology *)1;
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status s = jsd_topology_parse(&t, json, strlen(json), &e);
    if (s != JSD_ERR_CONFIG)
        fail_msg("parse returned %s, expected JSD_ERR_CONFIG, for: %s (msg: %s)",
                 jsd_status_name(s), json, e.msg);
    ASSERT_TRUE(t == NULL);
    if (strncmp(e.msg, path_prefix, strlen(path_prefix)) != 0)
        fail_msg("error \"%s\" does not start with \"%s\"", e.msg, path_prefix);
    if (also)
        ASSERT_CONTAINS(e.msg, also);
}

#define ONE_STREAM(extra) "{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]" extra "}]}"

/* allow_atomic and persist_mode (nats-server 2.12+): read as said, and
 * "async", which acknowledges before storing, refused with the reason. */
static void atomic_and_persist_mode(void **state)
{
    (void)state;
    const char *json = ONE_STREAM(",\"allow_atomic\":true,\"persist_mode\":\"default\"");
    jsd_topology *t = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    ASSERT_OK_E(jsd_topology_parse(&t, json, strlen(json), &e), e.msg);
    ASSERT_EQ(jsd_topology_stream_at(t, 0)->allow_atomic, 1);
    ASSERT_STREQ(jsd_topology_stream_at(t, 0)->persist_mode, "default");
    jsd_topology_destroy(t);
    json = ONE_STREAM(",\"allow_atomic\":false");
    ASSERT_OK_E(jsd_topology_parse(&t, json, strlen(json), &e), e.msg);
    ASSERT_EQ(jsd_topology_stream_at(t, 0)->allow_atomic, 0);
    jsd_topology_destroy(t);

    expect_refused(ONE_STREAM(",\"allow_atomic\":\"yes\""),
                   "streams[0].allow_atomic: ", "must be true or false");
    expect_refused(ONE_STREAM(",\"persist_mode\":\"async\""),
                   "streams[0].persist_mode: ", "acknowledges a message before it is stored");
    expect_refused(ONE_STREAM(",\"persist_mode\":\"fast\""),
                   "streams[0].persist_mode: ", "\"fast\" is not a persist mode");
    expect_refused(ONE_STREAM(",\"persist_mode\":1"), "streams[0].persist_mode: ", "");
}

static void wildcard_rules_name_key_path(void **state)
{
    (void)state;
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.>\"]},"
                   "{\"name\":\"B\",\"subjects\":[\"b.c\",\"b.>.c\"]}]}",
                   "streams[1].subjects[1]: ", "wildcard \">\" must be the last token");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a*.b\"]}]}",
                   "streams[0].subjects[0]: ", "wildcard \"*\" must be a whole token");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a..b\"]}]}",
                   "streams[0].subjects[0]: ", "empty token");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.b.\"]}]}",
                   "streams[0].subjects[0]: ", "empty token");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"\"]}]}",
                   "streams[0].subjects[0]: ", "empty");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a b\"]}]}",
                   "streams[0].subjects[0]: ", "byte 0x20 at byte 1");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"$JS.API.>\"]}]}",
                   "streams[0].subjects[0]: ", "'$'");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[]}]}",
                   "streams[0].subjects: ", "at least one subject");
    expect_refused("{\"streams\":[{\"name\":\"A\"}]}", "streams[0].subjects: ", "missing");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[7]}]}",
                   "streams[0].subjects[0]: ", "must be a string");
}

static void subject_length_limit(void **state)
{
    (void)state;
    char subj[300], json[512];
    memset(subj, 'x', sizeof(subj));
    subj[256] = '\0'; /* exactly the limit: accepted */
    jsd__snprintf(json, sizeof(json), "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"%s\"]}]}",
                  subj);
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_topology_parse(&t, json, strlen(json), &e), e.msg);
    jsd_topology_destroy(t);
    subj[256] = 'x';
    subj[257] = '\0';
    jsd__snprintf(json, sizeof(json), "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"%s\"]}]}",
                  subj);
    expect_refused(json, "streams[0].subjects[0]: ", "257 bytes; the limit is 256");
}

static void unknown_keys_are_errors(void **state)
{
    (void)state;
    expect_refused(ONE_STREAM(",\"max_msg\":5"), "streams[0].max_msg: ", "unknown key");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumer\":[]}",
                   "consumer: ", "unknown key");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\",\"ackwait\":\"1s\"}]}",
                   "consumers[0].ackwait: ", "known keys: stream, durable");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"dead_letter\":"
                   "{\"name\":\"D\",\"subjects\":[\"dlq.>\"],\"colour\":\"red\"}}",
                   "dead_letter.colour: ", "unknown key");
}

static void bad_durations_name_key_path(void **state)
{
    (void)state;
    expect_refused(ONE_STREAM(",\"max_age\":\"5 weeks\""),
                   "streams[0].max_age: ", "not a duration");
    expect_refused(ONE_STREAM(",\"max_age\":3600"),
                   "streams[0].max_age: ", "must be a duration string");
    expect_refused(ONE_STREAM(",\"max_age\":\"-1s\""), "streams[0].max_age: ", "not a duration");
    expect_refused(ONE_STREAM(",\"max_age\":\"500ms\""), "streams[0].max_age: ", "out of range");
    expect_refused(ONE_STREAM(",\"duplicate_window\":\"8d\""),
                   "streams[0].duplicate_window: ", "out of range");
    expect_refused(ONE_STREAM(",\"max_age\":\"1m\",\"duplicate_window\":\"2m\""),
                   "streams[0].duplicate_window: ", "longer than max_age");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\",\"backoff\":[\"1s\",\"soon\"]}]}",
                   "consumers[0].backoff[1]: ", "not a duration");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\",\"ack_wait\":\"13h\"}]}",
                   "consumers[0].ack_wait: ", "out of range");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\",\"inactive_threshold\":\"10\"}]}",
                   "consumers[0].inactive_threshold: ", "out of range");
}

static void limits_are_range_checked(void **state)
{
    (void)state;
    jsd_topology *t = NULL;
    jsd_error e;
    const char *ok = ONE_STREAM(",\"replicas\":5,\"max_msgs\":-1,\"max_bytes\":1");
    ASSERT_OK_E(jsd_topology_parse(&t, ok, strlen(ok), &e), e.msg);
    jsd_topology_destroy(t);
    expect_refused(ONE_STREAM(",\"replicas\":6"), "streams[0].replicas: ", "allowed 1..5");
    expect_refused(ONE_STREAM(",\"replicas\":0"), "streams[0].replicas: ", "out of range");
    expect_refused(ONE_STREAM(",\"max_msgs\":0"), "streams[0].max_msgs: ", "-1 for unlimited");
    expect_refused(ONE_STREAM(",\"max_msgs\":-2"), "streams[0].max_msgs: ", "out of range");
    expect_refused(ONE_STREAM(",\"max_msgs\":1.5"), "streams[0].max_msgs: ", "must be an integer");
    expect_refused(ONE_STREAM(",\"max_msgs_per_subject\":\"9\""),
                   "streams[0].max_msgs_per_subject: ", "must be an integer");
    expect_refused(ONE_STREAM(",\"max_bytes\":\"2PB\""), "streams[0].max_bytes: ", "is not a size");
    expect_refused(ONE_STREAM(",\"max_bytes\":0"), "streams[0].max_bytes: ", "out of range");
    expect_refused(ONE_STREAM(",\"storage\":\"disk\""),
                   "streams[0].storage: ", "use one of \"file\", \"memory\"");
    expect_refused(ONE_STREAM(",\"discard\":\"oldest\""), "streams[0].discard: ", "not allowed");
    expect_refused(ONE_STREAM(",\"retention\":\"forever\""),
                   "streams[0].retention: ", "not allowed");
    expect_refused("{\"version\":2,\"streams\":[]}", "version: ", "out of range");

    const char *base = "{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                       "[{\"stream\":\"S\",\"durable\":\"d\"%s}]}";
    char json[512];
    jsd__snprintf(json, sizeof(json), base, ",\"max_ack_pending\":0");
    expect_refused(json, "consumers[0].max_ack_pending: ", "allowed 1..1000000");
    jsd__snprintf(json, sizeof(json), base, ",\"max_ack_pending\":1000001");
    expect_refused(json, "consumers[0].max_ack_pending: ", "out of range");
    jsd__snprintf(json, sizeof(json), base, ",\"max_deliver\":0");
    expect_refused(json, "consumers[0].max_deliver: ", "out of range");
    jsd__snprintf(json, sizeof(json), base,
                  ",\"max_deliver\":3,\"backoff\":[\"1s\",\"2s\",\"3s\"]");
    expect_refused(json, "consumers[0].max_deliver: ", "greater than the 3 backoff steps");
    jsd__snprintf(json, sizeof(json), base, ",\"ack_wait\":\"30s\",\"backoff\":[\"1s\"]");
    expect_refused(json, "consumers[0].ack_wait: ", "differs from backoff[0]");
    jsd__snprintf(json, sizeof(json), base, ",\"ack_wait\":\"1s\",\"backoff\":[\"1s\",\"5s\"]");
    {
        jsd_topology *t2 = NULL;
        ASSERT_OK_E(jsd_topology_parse(&t2, json, strlen(json), &e), e.msg);
        ASSERT_EQ(jsd_topology_consumer_at(t2, 0)->ack_wait_ms, 1000);
        jsd_topology_destroy(t2);
    }
    jsd__snprintf(json, sizeof(json), base, ",\"deliver\":\"new\"");
    expect_refused(json, "consumers[0].deliver: ", "use one of \"all\"");
    jsd__snprintf(json, sizeof(json), base, ",\"backoff\":\"1s\"");
    expect_refused(json, "consumers[0].backoff: ", "must be an array");
    jsd__snprintf(json, sizeof(json), base, ",\"backoff\":[\"50ms\"]");
    expect_refused(json, "consumers[0].backoff[0]: ", "out of range");
}

static void step_limits(void **state)
{
    (void)state;
    /* backoff: 32 steps accepted, 33 refused */
    char json[4096];
    for (int n = 32; n <= 33; n++) {
        size_t len = (size_t)snprintf(json, sizeof(json),
                                      "{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],"
                                      "\"consumers\":[{\"stream\":\"S\",\"durable\":\"d\","
                                      "\"backoff\":[");
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(json + len, sizeof(json) - len, "%s\"1s\"", i ? "," : "");
        snprintf(json + len, sizeof(json) - len, "]}]}");
        jsd_topology *t = NULL;
        jsd_error e;
        if (n == 32) {
            ASSERT_OK_E(jsd_topology_parse(&t, json, strlen(json), &e), e.msg);
            ASSERT_EQ(jsd_topology_consumer_at(t, 0)->n_backoff, 32);
            jsd_topology_destroy(t);
        } else {
            expect_refused(json, "consumers[0].backoff: ", "33 steps; the limit is 32");
        }
    }
    /* subjects per stream: 65 refused */
    size_t len =
        (size_t)snprintf(json, sizeof(json), "{\"streams\":[{\"name\":\"S\",\"subjects\":[");
    for (int i = 0; i < 65; i++)
        len += (size_t)snprintf(json + len, sizeof(json) - len, "%s\"s.%d\"", i ? "," : "", i);
    snprintf(json + len, sizeof(json) - len, "]}]}");
    expect_refused(json, "streams[0].subjects: ", "65 subjects; the limit is 64");
}

static void file_size_limit(void **state)
{
    (void)state;
    size_t n = JSD_TOPOLOGY_FILE_MAX + 1;
    char *big = malloc(n);
    ASSERT_TRUE(big != NULL);
    memset(big, ' ', n);
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_STATUS(jsd_topology_parse(&t, big, n, &e), JSD_ERR_LIMIT);
    ASSERT_CONTAINS(e.msg, "the limit is");
    free(big);
}

static void names_and_structure(void **state)
{
    (void)state;
    expect_refused("{\"streams\":[{\"name\":\"OR.DERS\",\"subjects\":[\"a.>\"]}]}",
                   "streams[0].name: ", "'.'");
    expect_refused("{\"streams\":[{\"subjects\":[\"a.>\"]}]}", "streams[0].name: ", "missing");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]},"
                   "{\"name\":\"S\",\"subjects\":[\"b.>\"]}]}",
                   "streams[1].name: ", "declared twice");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"T\",\"durable\":\"d\"}]}",
                   "consumers[0].stream: ", "not a stream declared in this file");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\"},{\"stream\":\"S\",\"durable\":\"d\"}]}",
                   "consumers[1].durable: ", "declared twice");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"has space\"}]}",
                   "consumers[0].durable: ", "byte 0x20 at byte 3");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.b.>\"]}],\"consumers\":"
                   "[{\"stream\":\"S\",\"durable\":\"d\",\"filter_subject\":\"a.>\"}]}",
                   "consumers[0].filter_subject: ", "not within the subjects of stream \"S\"");
    expect_refused("[1,2]", "(top level): ", "must be an object");
    expect_refused("{}", "streams: ", "declare at least one stream");
    expect_refused("{\"streams\":{}}", "streams: ", "must be an array");
    expect_refused("{\"streams\":[5]}", "streams[0]: ", "must be an object");
    expect_refused("{\"streams\":[{\"name\":\"S\",\"subjects\":[\"a.>\"],\"name\":\"T\"}]}",
                   "line 1", "duplicate");
    expect_refused("{\"streams\":[", "line 1", NULL);
}

static void overlapping_subjects_are_refused(void **state)
{
    (void)state;
    /* wildcard-aware: "orders.*.created" and "orders.eu.>" share orders.eu.created */
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"x.y\",\"orders.*.created\"]},"
                   "{\"name\":\"B\",\"subjects\":[\"orders.eu.>\"]}]}",
                   "streams[1].subjects[0]: ",
                   "overlaps streams[0].subjects[1] \"orders.*.created\" of stream \"A\"");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.b\"]},"
                   "{\"name\":\"B\",\"subjects\":[\"a.b\"]}]}",
                   "streams[1].subjects[0]: ", "\"a.b\" of stream \"B\"");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.*\",\"a.b\"]}]}",
                   "streams[0].subjects[1]: ", "same stream");
    /* not overlapping: accepted */
    const char *ok = "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"orders.*.created\"]},"
                     "{\"name\":\"B\",\"subjects\":[\"orders.eu.created.x\",\"orders.eu\"]}]}";
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_topology_parse(&t, ok, strlen(ok), &e), e.msg);
    jsd_topology_destroy(t);
}

static void overlap_function(void **state)
{
    (void)state;
    ASSERT_TRUE(jsd_subjects_overlap("a.b", "a.b"));
    ASSERT_TRUE(!jsd_subjects_overlap("a.b", "a.c"));
    ASSERT_TRUE(jsd_subjects_overlap("a.*", "a.b"));
    ASSERT_TRUE(jsd_subjects_overlap("a.>", "a.b.c"));
    ASSERT_TRUE(!jsd_subjects_overlap("a.>", "a"));
    ASSERT_TRUE(jsd_subjects_overlap(">", "x"));
    ASSERT_TRUE(jsd_subjects_overlap("*.b", "a.*"));
    ASSERT_TRUE(!jsd_subjects_overlap("*.b", "a.*.c"));
    ASSERT_TRUE(jsd_subjects_overlap("*.*.c", "a.>"));
    ASSERT_TRUE(!jsd_subjects_overlap("a.*", "a.b.c"));
    ASSERT_TRUE(!jsd_subjects_overlap("ab", "a"));
    ASSERT_TRUE(!jsd_subjects_overlap("jsd.dlq.>", "jsd.outbox.>"));
    ASSERT_TRUE(jsd_subjects_overlap("jsd.>", "jsd.dlq.>"));
    ASSERT_TRUE(!jsd_subjects_overlap(NULL, "a"));
}

static void dead_letter_needs_its_own_root(void **state)
{
    (void)state;
    /* overlapping: refused by the general rule */
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"jsd.>\"]}],"
                   "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"jsd.dlq.>\"]}}",
                   "dead_letter.subjects[0]: ", "overlaps streams[0].subjects[0]");
    /* not overlapping but nested roots: a broadened hot path would capture it */
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"orders.*.created\"]}],"
                   "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"orders.dlq\"]}}",
                   "dead_letter.subjects[0]: ", "shares its subject root with streams[0]");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"*.created\"]}],"
                   "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"dlq.x.>\"]}}",
                   "dead_letter.subjects[0]: ", "own root");
    /* flagged inside streams works the same */
    expect_refused(
        "{\"streams\":[{\"name\":\"D\",\"subjects\":[\"jsd.dlq.>\"],\"dead_letter\":true},"
        "{\"name\":\"A\",\"subjects\":[\"jsd\"]}]}",
        "streams[0].subjects[0]: ", "shares its subject root");
    expect_refused(
        "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.>\"]}],"
        "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"dlq.>\"],\"storage\":\"memory\"}}",
        "dead_letter.storage: ", "file");
    expect_refused(
        "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.>\"]}],"
        "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"dlq.>\"],\"retention\":\"interest\"}}",
        "dead_letter.retention: ", "limits");
    expect_refused("{\"streams\":[{\"name\":\"A\",\"subjects\":[\"a.>\"],\"dead_letter\":true}],"
                   "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"dlq.>\"]}}",
                   "dead_letter: ", "second dead-letter stream");
    /* sibling roots under one prefix are fine: jsd.outbox.> and jsd.dlq.> */
    const char *ok = "{\"streams\":[{\"name\":\"A\",\"subjects\":[\"jsd.outbox.>\"]}],"
                     "\"dead_letter\":{\"name\":\"D\",\"subjects\":[\"jsd.dlq.>\"]}}";
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_topology_parse(&t, ok, strlen(ok), &e), e.msg);
    ASSERT_TRUE(jsd_topology_dead_letter(t)->dead_letter);
    jsd_topology_destroy(t);
}

static void load_names_the_file(void **state)
{
    (void)state;
    char path[512];
    jsd__snprintf(path, sizeof(path), "%s/topo.json", jsd_test_dir());
    FILE *f = fopen(path, "w");
    ASSERT_TRUE(f != NULL);
    fputs(ONE_STREAM(",\"max_msgs\":\"x\""), f);
    fclose(f);
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_STATUS(jsd_topology_load(&t, path, &e), JSD_ERR_CONFIG);
    ASSERT_CONTAINS(e.msg, path);
    ASSERT_CONTAINS(e.msg, "streams[0].max_msgs: ");
    ASSERT_STATUS(jsd_topology_load(&t, "/nonexistent/topo.json", &e), JSD_ERR_IO);
    ASSERT_CONTAINS(e.msg, "/nonexistent/topo.json");

    f = fopen(path, "w");
    fputs(valid_file, f);
    fclose(f);
    ASSERT_OK_E(jsd_topology_load(&t, path, &e), e.msg);
    ASSERT_EQ(jsd_topology_stream_count(t), 3);
    jsd_topology_destroy(t);
}

static void example_file_is_valid(void **state)
{
    (void)state;
    const char *top = getenv("JSD_TOP");
    char path[512];
    jsd__snprintf(path, sizeof(path), "%s/examples/topology.json", top ? top : ".");
    jsd_topology *t = NULL;
    jsd_error e;
    ASSERT_OK_E(jsd_topology_load(&t, path, &e), e.msg);
    ASSERT_TRUE(jsd_topology_dead_letter(t) != NULL);
    ASSERT_TRUE(jsd_topology_consumer_count(t) >= 1);
    jsd_topology_destroy(t);
}

/* Run by allocation_failures_are_clean in a child process with
 * JSD_FAIL_ALLOC_AFTER set; alone it simply parses. */
static void oom_child(void **state)
{
    (void)state;
    jsd_topology *t = NULL;
    jsd_error e;
    jsd_error_clear(&e);
    jsd_status s = jsd_topology_parse(&t, valid_file, strlen(valid_file), &e);
    printf("status=%s\n", jsd_status_name(s));
    if (s == JSD_OK) {
        ASSERT_EQ(jsd_topology_stream_count(t), 3);
        jsd_topology_destroy(t);
    } else {
        ASSERT_EQ(s, JSD_ERR_NOMEM);
        ASSERT_TRUE(t == NULL);
        ASSERT_CONTAINS(e.msg, "out of memory");
    }
}

static void allocation_failures_are_clean(void **state)
{
    (void)state;
    jsd_test_alloc_failures("oom_child", 64, "the parser");
}

JSD_TEST_MAIN(cmocka_unit_test(parses_valid_file_with_defaults),
              cmocka_unit_test(atomic_and_persist_mode),
              cmocka_unit_test(wildcard_rules_name_key_path),
              cmocka_unit_test(subject_length_limit), cmocka_unit_test(unknown_keys_are_errors),
              cmocka_unit_test(bad_durations_name_key_path),
              cmocka_unit_test(limits_are_range_checked), cmocka_unit_test(step_limits),
              cmocka_unit_test(file_size_limit), cmocka_unit_test(names_and_structure),
              cmocka_unit_test(overlapping_subjects_are_refused),
              cmocka_unit_test(overlap_function), cmocka_unit_test(dead_letter_needs_its_own_root),
              cmocka_unit_test(load_names_the_file), cmocka_unit_test(example_file_is_valid),
              cmocka_unit_test(oom_child), cmocka_unit_test(allocation_failures_are_clean))
