/*
 * The tool's options are taken by their whole names only: getopt_long's
 * prefix matching took `--token SECRET` for --token-file and printed the
 * secret as a file it could not read (and `--password s3cret` the same). Every
 * credential-like spelling a user might try, on every command, must fail
 * with a usage error that names the option, never its value; a typo gets the
 * nearest option's name. No service is needed: each command stops at its
 * options, before any connection.
 */
#include <stdio.h>
#include <string.h>

#include "fixture.h"
#include "test.h"

#define SECRET "s3cr3t-Vq7Zp9"

static char out[1 << 14];

static int run(const char *cmd, const char *args)
{
    char line[2048];
    snprintf(line, sizeof(line), "'%s' %s %s </dev/null", jsd_fx_bin("jsdurable"), cmd, args);
    return jsd_test_run(line, out, sizeof(out));
}

static void secrets_are_never_echoed(void **state)
{
    (void)state;
    static const char *commands[] = {"relay",     "consume",  "status",      "doctor", "verify",
                                     "publish",   "dlq list", "outbox list", "gc",     "migrate",
                                     "provision", "enqueue",  "schema"};
    static const char *spellings[] = {"--token " SECRET,         "--token=" SECRET,
                                      "--tok " SECRET,           "--password " SECRET,
                                      "--password=" SECRET,      "--pass " SECRET,
                                      "--passwd " SECRET,        "--pw " SECRET,
                                      "--secret " SECRET,        "--auth-token " SECRET,
                                      "--user-password " SECRET, "--nkey-seed " SECRET,
                                      "--jwt " SECRET,           "--seed " SECRET,
                                      "--token-file " SECRET,    "--password-file " SECRET,
                                      "--token-file=" SECRET,    "--password-file=" SECRET};
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++) {
        for (size_t s = 0; s < sizeof(spellings) / sizeof(spellings[0]); s++) {
            int rc = run(commands[c], spellings[s]);
            if (rc == 0 || strstr(out, SECRET)) {
                fprintf(stderr, "jsdurable %s %s: exit %d, printed:\n%s\n", commands[c],
                        spellings[s], rc, out);
                fail_msg("a credential-like option was taken or its value was printed");
            }
        }
    }
}

static void an_abbreviation_is_not_taken(void **state)
{
    (void)state;
    /* --tok was --token-file through getopt_long's prefix matching */
    ASSERT_EQ(run("status", "--tok " SECRET), 64);
    ASSERT_TRUE(strstr(out, "unknown option --tok;") != NULL);
    ASSERT_TRUE(strstr(out, "did you mean --token-file?") != NULL);
    ASSERT_EQ(run("relay", "--password " SECRET), 64);
    ASSERT_TRUE(strstr(out, "did you mean --password-file?") != NULL);
    /* one line, not the whole help */
    ASSERT_TRUE(strchr(out, '\n') == strrchr(out, '\n'));
}

static void a_typo_names_the_nearest_option(void **state)
{
    (void)state;
    ASSERT_EQ(run("relay", "--until_idle"), 64);
    ASSERT_TRUE(strstr(out, "unknown option --until_idle; did you mean --until-idle?") != NULL);
    ASSERT_EQ(run("consume", "--stram S"), 64);
    ASSERT_TRUE(strstr(out, "did you mean --stream?") != NULL);
    ASSERT_EQ(run("status", "--zzzzzzzz"), 64);
    ASSERT_TRUE(strstr(out, "unknown option --zzzzzzzz (see --help)") != NULL);
}

static void a_value_may_begin_with_dashes(void **state)
{
    (void)state;
    /* the value of an option that takes one is not read as an option */
    ASSERT_EQ(run("status", "--store --not-an-option --help"), 0);
    ASSERT_TRUE(strstr(out, "unknown option") == NULL);
}

JSD_TEST_MAIN(cmocka_unit_test(secrets_are_never_echoed),
              cmocka_unit_test(an_abbreviation_is_not_taken),
              cmocka_unit_test(a_typo_names_the_nearest_option),
              cmocka_unit_test(a_value_may_begin_with_dashes))
