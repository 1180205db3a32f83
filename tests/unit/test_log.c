/*
 * Unit tests for the structured logger (OBS-2): text lines and JSON lines
 * (each parsed back with jansson), level filtering, the application sink,
 * lines that need escaping or are not valid UTF-8, very long messages, and
 * whole lines from many threads at once.
 */
#include <jansson.h>
#include <pthread.h>
#include <regex.h>
#include <stdlib.h>

#include "test.h"
#include "jsd_int.h"

#define MAX_LINES 64

typedef struct captured {
    pthread_mutex_t mu;
    int n;
    int total;
    int bad_json;
    jsd_log_level level[MAX_LINES];
    char component[MAX_LINES][32];
    char line[MAX_LINES][4096];
    bool check_json;
} captured;

static captured cap = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void sink(jsd_log_level level, const char *component, const char *line, void *user)
{
    captured *c = user;
    pthread_mutex_lock(&c->mu);
    c->total++;
    if (c->check_json) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o || !json_is_object(o))
            c->bad_json++;
        json_decref(o);
    }
    if (c->n < MAX_LINES) {
        c->level[c->n] = level;
        jsd__strlcpy(c->component[c->n], component ? component : "", sizeof(c->component[0]));
        jsd__strlcpy(c->line[c->n], line, sizeof(c->line[0]));
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
}

static void reset(jsd_log_level min, jsd_log_format fmt)
{
    cap.n = cap.total = cap.bad_json = 0;
    cap.check_json = false;
    jsd_log_configure(min, fmt, sink, &cap);
}

static int teardown(void **state)
{
    (void)state;
    jsd_log_configure(JSD_LOG_WARN, JSD_LOG_TEXT, NULL, NULL);
    return 0;
}

static void text_lines(void **state)
{
    (void)state;
    reset(JSD_LOG_DEBUG, JSD_LOG_TEXT);
    JSD_WARN("relay", "publish of %s failed: %d", "orders.created", 42);
    ASSERT_EQ(cap.n, 1);
    ASSERT_EQ(cap.level[0], JSD_LOG_WARN);
    ASSERT_STREQ(cap.component[0], "relay");
    regex_t re;
    ASSERT_EQ(regcomp(&re,
                      "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                      "WARN relay: publish of orders\\.created failed: 42$",
                      REG_EXTENDED | REG_NOSUB),
              0);
    if (regexec(&re, cap.line[0], 0, NULL, 0) != 0)
        fail_msg("text line has the wrong shape: \"%s\"", cap.line[0]);
    regfree(&re);
    ASSERT_TRUE(strchr(cap.line[0], '\n') == NULL); /* the sink gets no newline */

    JSD_DEBUG("ingress", "d");
    JSD_INFO("ingress", "i");
    JSD_ERROR(NULL, "e");
    ASSERT_EQ(cap.n, 4);
    ASSERT_CONTAINS(cap.line[1], " DEBUG ingress: d");
    ASSERT_CONTAINS(cap.line[2], " INFO ingress: i");
    ASSERT_CONTAINS(cap.line[3], " ERROR -: e");
}

static void json_lines_parse(void **state)
{
    (void)state;
    reset(JSD_LOG_INFO, JSD_LOG_JSON);
    JSD_INFO("consumer", "delivery %s: \"quoted\"\tand\\slashed\nnext line", "ORDERS/ship/7");
    ASSERT_EQ(cap.n, 1);
    json_error_t je;
    json_t *o = json_loads(cap.line[0], 0, &je);
    if (!o)
        fail_msg("not JSON (%s): %s", je.text, cap.line[0]);
    ASSERT_STREQ(json_string_value(json_object_get(o, "level")), "info");
    ASSERT_STREQ(json_string_value(json_object_get(o, "component")), "consumer");
    ASSERT_STREQ(json_string_value(json_object_get(o, "msg")),
                 "delivery ORDERS/ship/7: \"quoted\"\tand\\slashed\nnext line");
    const char *ts = json_string_value(json_object_get(o, "ts"));
    ASSERT_TRUE(ts != NULL);
    ASSERT_EQ(strlen(ts), 24); /* 2026-11-29T09:00:00.123Z */
    ASSERT_EQ(ts[23], 'Z');
    ASSERT_EQ(json_object_size(o), 4);
    json_decref(o);
    ASSERT_TRUE(strchr(cap.line[0], '\n') == NULL); /* one line: the newline is escaped */

    JSD_ERROR("relay", "x");
    o = json_loads(cap.line[1], 0, &je);
    ASSERT_TRUE(o != NULL);
    ASSERT_STREQ(json_string_value(json_object_get(o, "level")), "error");
    json_decref(o);
}

static void json_survives_bad_utf8_and_long_messages(void **state)
{
    (void)state;
    reset(JSD_LOG_INFO, JSD_LOG_JSON);
    /* bytes that are not UTF-8 must not turn the line into "{}" */
    JSD_WARN("subject", "refused subject \"%s\"",
             "ord\xff\xfe"
             "ers");
    ASSERT_EQ(cap.n, 1);
    json_error_t je;
    json_t *o = json_loads(cap.line[0], 0, &je);
    if (!o)
        fail_msg("not JSON (%s): %s", je.text, cap.line[0]);
    const char *msg = json_string_value(json_object_get(o, "msg"));
    ASSERT_TRUE(msg != NULL);
    ASSERT_CONTAINS(msg, "refused subject \"ord");
    ASSERT_CONTAINS(msg, "ers\"");
    json_decref(o);

    /* a message that doubles in size when escaped stays one valid JSON line */
    char big[1100];
    memset(big, '"', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    JSD_WARN("relay", "%s", big);
    ASSERT_EQ(cap.n, 2);
    o = json_loads(cap.line[1], 0, &je);
    if (!o)
        fail_msg("long line is not JSON (%s): %.200s...", je.text, cap.line[1]);
    msg = json_string_value(json_object_get(o, "msg"));
    ASSERT_TRUE(msg != NULL);
    ASSERT_TRUE(strlen(msg) >= 512); /* cut, perhaps, but not emptied */
    ASSERT_TRUE(msg[0] == '"');
    json_decref(o);
}

static void level_filtering(void **state)
{
    (void)state;
    reset(JSD_LOG_WARN, JSD_LOG_TEXT);
    ASSERT_TRUE(!jsd__log_enabled(JSD_LOG_DEBUG));
    ASSERT_TRUE(!jsd__log_enabled(JSD_LOG_INFO));
    ASSERT_TRUE(jsd__log_enabled(JSD_LOG_WARN));
    ASSERT_TRUE(jsd__log_enabled(JSD_LOG_ERROR));
    JSD_DEBUG("x", "no");
    JSD_INFO("x", "no");
    JSD_WARN("x", "yes");
    JSD_ERROR("x", "yes");
    ASSERT_EQ(cap.n, 2);
    ASSERT_EQ(cap.level[0], JSD_LOG_WARN);
    ASSERT_EQ(cap.level[1], JSD_LOG_ERROR);

    reset(JSD_LOG_OFF, JSD_LOG_JSON);
    JSD_ERROR("x", "no");
    ASSERT_EQ(cap.n, 0);
    ASSERT_TRUE(!jsd__log_enabled(JSD_LOG_ERROR));
    ASSERT_TRUE(!jsd__log_enabled(JSD_LOG_OFF)); /* OFF is not a level to log at */

    reset(JSD_LOG_DEBUG, JSD_LOG_TEXT);
    JSD_DEBUG("x", "yes");
    ASSERT_EQ(cap.n, 1);
}

static void level_names_parse(void **state)
{
    (void)state;
    jsd_log_level lv = JSD_LOG_OFF;
    ASSERT_OK(jsd_log_level_parse("debug", &lv));
    ASSERT_EQ(lv, JSD_LOG_DEBUG);
    ASSERT_OK(jsd_log_level_parse("error", &lv));
    ASSERT_EQ(lv, JSD_LOG_ERROR);
    ASSERT_OK(jsd_log_level_parse("off", &lv));
    ASSERT_EQ(lv, JSD_LOG_OFF);
    ASSERT_STATUS(jsd_log_level_parse("WARN", &lv), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_log_level_parse("verbose", &lv), JSD_ERR_INVALID);
    ASSERT_STATUS(jsd_log_level_parse(NULL, &lv), JSD_ERR_INVALID);
}

#define THREADS    4
#define PER_THREAD 2000

static void *log_loop(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER_THREAD; i++)
        JSD_INFO("thread", "line %d with \"quotes\" to escape", i);
    return NULL;
}

static void whole_lines_from_many_threads(void **state)
{
    (void)state;
    reset(JSD_LOG_INFO, JSD_LOG_JSON);
    cap.check_json = true;
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, log_loop, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    ASSERT_EQ(cap.total, THREADS * PER_THREAD);
    ASSERT_EQ(cap.bad_json, 0);
}

JSD_TEST_MAIN(cmocka_unit_test_teardown(text_lines, teardown),
              cmocka_unit_test_teardown(json_lines_parse, teardown),
              cmocka_unit_test_teardown(json_survives_bad_utf8_and_long_messages, teardown),
              cmocka_unit_test_teardown(level_filtering, teardown),
              cmocka_unit_test_teardown(level_names_parse, teardown),
              cmocka_unit_test_teardown(whole_lines_from_many_threads, teardown))
