/*
 * jsdurable — the command-line tool. A thin user of the public API
 * (include/jsdurable.h): one subcommand per file, cli/cmd_<name>.c.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define CLI_SHUTDOWN_WAIT_MS 2000

static const struct {
    const char *name;
    cli_cmd_fn fn;
    const char *summary;
} commands[] = {
    {"enqueue", cmd_enqueue, "commit outbox effects to a store (stdin payload or JSON lines)"},
    {"status", cmd_status,
     "show outbox, inbox and dead-letter counts (and stream lag with --nats)"},
    {"publish", cmd_publish,
     "publish one message through the bounded publisher, print its outcome"},
    {"relay", cmd_relay, "publish committed outbox effects to JetStream"},
    {"consume", cmd_consume, "exactly-once JetStream -> SQL sink through the inbox"},
    {"dlq", cmd_dlq, "list, show, replay or purge dead letters"},
    {"provision", cmd_provision, "create or reconcile streams and consumers from a topology file"},
    {"gc", cmd_gc, "remove retired outbox and inbox rows past a horizon"},
    {"outbox", cmd_outbox, "list, show or requeue pending and dead-lettered outbox effects"},
    {"verify", cmd_verify, "audit every receipt against its stream message; --repair lost ones"},
    {"doctor", cmd_doctor, "check a deployment's settings for loss or doubling (exit 78 on error)"},
    {"migrate", cmd_migrate, "create or upgrade a store's tables, print the schema version"},
    {"schema", cmd_schema, "print the store's DDL (--print) for a DBA's own migration tool"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: jsdurable COMMAND [OPTIONS]\n\n"
               "Durable, effectively-once messaging between a SQL store and NATS JetStream.\n\n"
               "Commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'jsdurable COMMAND --help' shows a command's options and an example.\n\n"
               "Common flags: -s URL or -sURL (same as --nats / --server), -j (same as --json:\n"
               "JSON output; for relay and consume, --log-format json), --context NAME,\n"
               "--log-level, --log-format.\n\n"
               "Environment: JSD_STORE (store URL), JSD_NATS_URL (servers), JSD_NATS_TOKEN,\n"
               "JSD_NATS_USER, JSD_NATS_PASSWORD (credentials; never printed). After them the\n"
               "nats CLI's NATS_URL, NATS_TOKEN, NATS_USER, NATS_PASSWORD, NATS_CREDS,\n"
               "NATS_NKEY, NATS_CERT, NATS_KEY, NATS_CA and NATS_CONTEXT, then the nats\n"
               "CLI's context (--context NAME, else $NATS_CONTEXT, else the selected one in\n"
               "${XDG_CONFIG_HOME:-~/.config}/nats/context.txt; --no-context skips it).\n\n"
               "Exit codes: 0 success; 1 operation failed; 64 usage; 65 bad input data;\n"
               "69 service unavailable; 70 internal error; 73 cannot open store; 74 I/O error;\n"
               "75 temporary failure or unknown outcome (retry with the same id);\n"
               "77 permission denied; 78 configuration refused.\n");
}

/* How each command takes -j/--json: its own --json flag (JSON output), or
 * none of its own because its output already is JSON lines (enqueue: the
 * flag is accepted and changes nothing), or log lines (relay, consume: the
 * flag means --log-format json, so every line they print is JSON). */
enum json_mode { JSON_OWN_FLAG, JSON_ALREADY, JSON_LOG_FORMAT };

static enum json_mode json_mode_of(const char *cmd)
{
    if (!strcmp(cmd, "enqueue"))
        return JSON_ALREADY;
    if (!strcmp(cmd, "relay") || !strcmp(cmd, "consume"))
        return JSON_LOG_FORMAT;
    return JSON_OWN_FLAG;
}

/* "--nats=URL" for -sURL, kept until the process ends (argv points at it;
 * each one is reachable from `kept`). NULL after a message. */
static char *keep_attached(const char *url)
{
    static char **kept;
    static size_t n;
    char **more = realloc(kept, (n + 1) * sizeof(*kept));
    char *flag = malloc(strlen(url) + sizeof("--nats="));
    if (more)
        kept = more;
    if (!more || !flag) {
        free(flag);
        fprintf(stderr, "jsdurable: out of memory\n");
        return NULL;
    }
    sprintf(flag, "--nats=%s", url);
    return kept[n++] = flag;
}

/* The flags every command shares are taken care of here, wherever they stand
 * before "--", so the commands' own getopt tables need not repeat them:
 *   --log-level / --log-format (also as --opt=VALUE) are taken out of argv
 *   and set JSD_LOG_LEVEL / JSD_LOG_FORMAT (the flag wins over the
 *   variable), so they combine in any order;
 *   -s (the nats CLI's short --server) becomes --nats, and -sURL (its value
 *   attached, as the nats CLI also takes it) --nats=URL;
 *   -j becomes --json, and --json itself is mapped as json_mode_of() says.
 * Returns argc after the changes, or -1 after a message on a bad value. */
static int take_common_flags(int argc, char **argv)
{
    enum json_mode jm = json_mode_of(argv[1]);
    int w = 2;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *val = NULL, *var = NULL;
        if (!strcmp(a, "--")) {
            while (i < argc)
                argv[w++] = argv[i++];
            break;
        }
        if (!strcmp(a, "-s")) {
            argv[w++] = (char *)"--nats";
            continue;
        }
        if (!strncmp(a, "-s", 2)) {
            char *flag = keep_attached(a + 2);
            if (!flag)
                return -1;
            argv[w++] = flag;
            continue;
        }
        if (!strcmp(a, "-j") || !strcmp(a, "--json")) {
            if (jm == JSON_OWN_FLAG)
                argv[w++] = (char *)"--json";
            else if (jm == JSON_LOG_FORMAT)
                setenv("JSD_LOG_FORMAT", "json", 1);
            continue;
        }
        if (!strncmp(a, "--log-level", 11) && (a[11] == '\0' || a[11] == '='))
            var = "JSD_LOG_LEVEL";
        else if (!strncmp(a, "--log-format", 12) && (a[12] == '\0' || a[12] == '='))
            var = "JSD_LOG_FORMAT";
        if (!var) {
            argv[w++] = argv[i];
            continue;
        }
        val = strchr(a, '=') ? strchr(a, '=') + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            fprintf(stderr, "jsdurable: %s needs a value\n", a);
            return -1;
        }
        bool level = !strcmp(var, "JSD_LOG_LEVEL");
        jsd_log_level lv;
        if (level ? jsd_log_level_parse(val, &lv) != JSD_OK
                  : strcmp(val, "text") != 0 && strcmp(val, "json") != 0) {
            fprintf(stderr, "jsdurable: %s takes %s, not \"%s\"\n",
                    level ? "--log-level" : "--log-format",
                    level ? "debug, info, warn, error or off" : "text or json", val);
            return -1;
        }
        setenv(var, val, 1);
    }
    argv[w] = NULL;
    return w;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("jsdurable %s (nats.c %s)\n", jsd_version(), jsd_nats_client_version());
        return CLI_OK;
    }
    if ((argc = take_common_flags(argc, argv)) < 0 || cli_log_apply() != 0)
        return CLI_USAGE;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(cmd, commands[i].name)) {
            int rc = commands[i].fn(argc - 1, argv + 1);
            /* the command closed its connections: let nats.c's threads end
             * before the exit handlers run (jsd_conn_shutdown) */
            (void)jsd_conn_shutdown(CLI_SHUTDOWN_WAIT_MS);
            return rc;
        }
    fprintf(stderr, "jsdurable: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_USAGE;
}
