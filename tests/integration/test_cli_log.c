/*
 * The jsdurable tool's log settings: --log-level and --log-format combine in
 * either order, JSD_LOG_LEVEL / JSD_LOG_FORMAT set the same, and a flag wins
 * over the variable. The lines come from the connection's start-up retries
 * (debug level) against a port where nothing listens, so no service is
 * needed; the command then fails with its usual exit status.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "fixture.h"
#include "test.h"

static char out[1 << 15];

/* Run `relay` against a closed port with the given environment and flags. */
static int relay_logs(const char *env, const char *flags)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "env -u JSD_LOG_LEVEL -u JSD_LOG_FORMAT %s '%s' relay --store 'sqlite:%s/log.db' "
             "--nats nats://127.0.0.1:1 --startup-budget-ms 300 %s",
             env, jsd_fx_bin("jsdurable"), jsd_test_dir(), flags);
    return jsd_test_run(cmd, out, sizeof(out));
}

static bool has_json_debug(void)
{
    return strstr(out, "{\"ts\":") && strstr(out, "\"level\":\"debug\"");
}

static bool has_text_debug(void)
{
    return strstr(out, " DEBUG conn: ") != NULL;
}

static void level_then_format(void **state)
{
    (void)state;
    ASSERT_EQ(relay_logs("", "--log-level debug --log-format json"), 69);
    ASSERT_TRUE(has_json_debug());
    ASSERT_TRUE(!has_text_debug());
}

static void format_then_level(void **state)
{
    (void)state;
    ASSERT_EQ(relay_logs("", "--log-format json --log-level debug"), 69);
    ASSERT_TRUE(has_json_debug());
    ASSERT_TRUE(!has_text_debug());
}

static void environment_sets_both(void **state)
{
    (void)state;
    ASSERT_EQ(relay_logs("JSD_LOG_LEVEL=debug JSD_LOG_FORMAT=json", ""), 69);
    ASSERT_TRUE(has_json_debug());
    ASSERT_EQ(relay_logs("JSD_LOG_LEVEL=debug", ""), 69);
    ASSERT_TRUE(has_text_debug());
}

static void flag_wins_over_environment(void **state)
{
    (void)state;
    ASSERT_EQ(relay_logs("JSD_LOG_LEVEL=debug JSD_LOG_FORMAT=json", "--log-level warn"), 69);
    ASSERT_TRUE(!strstr(out, "\"level\":\"debug\""));
    ASSERT_TRUE(!has_text_debug());
    ASSERT_EQ(relay_logs("JSD_LOG_LEVEL=debug JSD_LOG_FORMAT=json", "--log-format text"), 69);
    ASSERT_TRUE(has_text_debug());
}

static void bad_environment_is_refused(void **state)
{
    (void)state;
    ASSERT_EQ(relay_logs("JSD_LOG_LEVEL=loud", ""), 64);
    ASSERT_TRUE(strstr(out, "JSD_LOG_LEVEL takes debug, info, warn, error or off") != NULL);
    ASSERT_EQ(relay_logs("JSD_LOG_FORMAT=xml", ""), 64);
    ASSERT_TRUE(strstr(out, "JSD_LOG_FORMAT takes text or json") != NULL);
}

/* Every line a command writes to stderr in JSON mode is one JSON object with
 * the log's keys, its own summaries and errors included; errors are at level
 * "error". */
static void json_mode_lines_are_json(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && printf '%%s\\n' '{\"subject\":\"a.b\",\"id\":\"1\"}' "
             "'{\"subject\":\"a.b\",\"id\":\"2\"}' | env -u JSD_LOG_LEVEL "
             "JSD_LOG_FORMAT=json '%s' enqueue --store sqlite:j.db --jsonl >/dev/null; "
             "echo x | '%s' enqueue --store sqlite:j.db --subject 'a.*' --id 3 "
             "--log-format json >/dev/null; echo exit=$?",
             jsd_test_dir(), jsd_fx_bin("jsdurable"), jsd_fx_bin("jsdurable"));
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 0);
    ASSERT_CONTAINS(out, "exit=65");
    int lines = 0, errors = 0;
    for (char *line = out, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        if ((nl = strchr(line, '\n')) != NULL)
            *nl = '\0';
        if (!*line || !strncmp(line, "exit=", 5))
            continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o || !json_is_string(json_object_get(o, "ts")) ||
            !json_is_string(json_object_get(o, "msg")) ||
            !json_is_string(json_object_get(o, "component")))
            fail_msg("not a JSON log line: %s", line);
        const char *lv = json_string_value(json_object_get(o, "level"));
        if (lv && !strcmp(lv, "error")) {
            errors++;
            ASSERT_CONTAINS(json_string_value(json_object_get(o, "msg")), "subject");
        }
        lines++;
        json_decref(o);
    }
    ASSERT_TRUE(lines >= 2); /* the summary and the refusal */
    ASSERT_EQ(errors, 1);
}

JSD_TEST_MAIN(cmocka_unit_test(level_then_format), cmocka_unit_test(format_then_level),
              cmocka_unit_test(environment_sets_both), cmocka_unit_test(flag_wins_over_environment),
              cmocka_unit_test(bad_environment_is_refused),
              cmocka_unit_test(json_mode_lines_are_json))
