/*
 * Shared pieces of the jsdurable tool: the subcommand entry points, the
 * connection flags every NATS-facing command accepts, environment fallbacks
 * (JSD_NATS_URL, JSD_STORE, JSD_NATS_TOKEN, JSD_NATS_USER, JSD_NATS_PASSWORD),
 * exit codes and JSON output. The tool uses only include/jsdurable.h.
 */
#ifndef JSD_CLI_H
#define JSD_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "jsdurable.h"

/* Exit codes (sysexits.h where one fits), documented in `jsdurable --help`
 * and docs/OPERATIONS.md. */
enum {
    CLI_OK = 0,
    CLI_FAILED = 1,       /* the operation ran and failed (e.g. outcome failed) */
    CLI_USAGE = 64,       /* EX_USAGE: bad flags */
    CLI_DATAERR = 65,     /* EX_DATAERR: bad input data (rejected) */
    CLI_NOPERM = 77,      /* EX_NOPERM: denied / authorization */
    CLI_UNAVAILABLE = 69, /* EX_UNAVAILABLE: service unreachable */
    CLI_SOFTWARE = 70,    /* EX_SOFTWARE: internal error */
    CLI_CANTCREAT = 73,   /* EX_CANTCREAT: cannot open/create the store */
    CLI_IOERR = 74,       /* EX_IOERR */
    CLI_TEMPFAIL = 75,    /* EX_TEMPFAIL: retryable / unknown outcome: try again with the same id */
    CLI_CONFIG = 78,      /* EX_CONFIG: configuration refused */
};

typedef int (*cli_cmd_fn)(int argc, char **argv);

int cmd_enqueue(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_publish(int argc, char **argv);
int cmd_relay(int argc, char **argv);
int cmd_consume(int argc, char **argv);
int cmd_dlq(int argc, char **argv);
int cmd_provision(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_outbox(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_doctor(int argc, char **argv);

/* cmd_doctor.c: the start-up checks of relay and consume. Runs o's checks,
 * prints every warning and every error (with its fix) to stderr, and returns
 * 0 to go on or CLI_CONFIG when an error's check is not named in allow (the
 * --allow-unsafe list, NULL: none); errors it names are printed as loud
 * warnings. */
int cli_doctor_gate(const char *cmd, jsd_store *store, jsd_conn *conn, const jsd_doctor_opts *o,
                    const char *allow);
/* 0 when every name of an --allow-unsafe list is a check name (or "all"),
 * else CLI_USAGE after a message naming the unknown one. A non-empty list is
 * announced as a loud warning (once per start). */
int cli_doctor_allow_check(const char *cmd, const char *allow);
int cmd_migrate(int argc, char **argv);
int cmd_schema(int argc, char **argv);

/* ---- connection flags ----------------------------------------------------------
 * Add CLI_CONN_LONGOPTS to a getopt_long table, and pass every option value
 * >= CLI_CONN_OPT_BASE to cli_conn_flag(). Secrets are taken from files or the
 * environment, never from argv (argv is visible to every user). The nats
 * CLI's spellings are aliases: --server (and -s, mapped in main.c) for
 * --nats, --tlsca/--tlscert/--tlskey for --tls-ca/--tls-cert/--tls-key. */
#define CLI_CONN_OPT_BASE 1000
#define CLI_CONN_LONGOPTS                                                                          \
    {"nats", required_argument, NULL, CLI_CONN_OPT_BASE + 0},                                      \
        {"server", required_argument, NULL, CLI_CONN_OPT_BASE + 0},                                \
        {"token-file", required_argument, NULL, CLI_CONN_OPT_BASE + 1},                            \
        {"user", required_argument, NULL, CLI_CONN_OPT_BASE + 2},                                  \
        {"password-file", required_argument, NULL, CLI_CONN_OPT_BASE + 3},                         \
        {"creds", required_argument, NULL, CLI_CONN_OPT_BASE + 4},                                 \
        {"nkey", required_argument, NULL, CLI_CONN_OPT_BASE + 5},                                  \
        {"tls-ca", required_argument, NULL, CLI_CONN_OPT_BASE + 6},                                \
        {"tlsca", required_argument, NULL, CLI_CONN_OPT_BASE + 6},                                 \
        {"tls-cert", required_argument, NULL, CLI_CONN_OPT_BASE + 7},                              \
        {"tlscert", required_argument, NULL, CLI_CONN_OPT_BASE + 7},                               \
        {"tls-key", required_argument, NULL, CLI_CONN_OPT_BASE + 8},                               \
        {"tlskey", required_argument, NULL, CLI_CONN_OPT_BASE + 8},                                \
        {"tls-hostname", required_argument, NULL, CLI_CONN_OPT_BASE + 9},                          \
        {"tls-required", no_argument, NULL, CLI_CONN_OPT_BASE + 10},                               \
        {"connect-timeout-ms", required_argument, NULL, CLI_CONN_OPT_BASE + 11},                   \
        {"startup-budget-ms", required_argument, NULL, CLI_CONN_OPT_BASE + 12},                    \
        {"log-level", required_argument, NULL, CLI_CONN_OPT_BASE + 13},                            \
        {"log-format", required_argument, NULL, CLI_CONN_OPT_BASE + 14},                           \
        {"context", required_argument, NULL, CLI_CONN_OPT_BASE + 15},                              \
        {"no-context", no_argument, NULL, CLI_CONN_OPT_BASE + 16},                                 \
        {"js-domain", required_argument, NULL, CLI_CONN_OPT_BASE + 17},                            \
    {                                                                                              \
        "js-api-prefix", required_argument, NULL, CLI_CONN_OPT_BASE + 18                           \
    }

#define CLI_CONN_HELP                                                                              \
    "Connection (NATS):\n"                                                                         \
    "  -s, --nats, --server URL[,URL...]  servers (default: $JSD_NATS_URL, then $NATS_URL)\n"      \
    "  --token-file FILE          auth token from FILE (or $JSD_NATS_TOKEN, $NATS_TOKEN)\n"        \
    "  --user NAME                user (or $JSD_NATS_USER, $NATS_USER); password from\n"           \
    "  --password-file FILE       FILE (or $JSD_NATS_PASSWORD, $NATS_PASSWORD)\n"                  \
    "  --creds FILE | --nkey FILE credentials file or NKey seed file ($NATS_CREDS, $NATS_NKEY)\n"  \
    "  --tls-ca FILE --tls-cert FILE --tls-key FILE   (also --tlsca, --tlscert, --tlskey;\n"       \
    "                             $NATS_CA, $NATS_CERT, $NATS_KEY)\n"                              \
    "  --tls-hostname NAME --tls-required\n"                                                       \
    "  --context NAME             a nats CLI context (~/.config/nats/context/NAME.json; default\n" \
    "                             $NATS_CONTEXT, else the nats CLI's selected one); flags and\n"   \
    "                             variables win over it. --no-context: use none\n"                 \
    "  --js-domain NAME | --js-api-prefix PREFIX   JetStream domain or API prefix\n"               \
    "  --connect-timeout-ms N     one connect attempt (default 2000)\n"                            \
    "  --startup-budget-ms N      keep retrying the first connect this long (default 10000)\n"     \
    "Logging:\n"                                                                                   \
    "  --log-level debug|info|warn|error   --log-format text|json\n"

typedef struct cli_conn {
    jsd_conn_opts opts;
    char *secret_token;    /* owned, wiped */
    char *secret_password; /* owned, wiped */
    bool have_url;
    const char *context;       /* --context NAME (or a path to a .json file) */
    bool no_context;           /* --no-context */
    void *context_doc;         /* the context's parsed JSON (secrets in it wiped) */
    char *context_expanded[5]; /* context file paths with "~/" expanded */
} cli_conn;

void cli_conn_init(cli_conn *c);
/* Configure logging from JSD_LOG_LEVEL / JSD_LOG_FORMAT (default: the
 * command's level, text); 0, or CLI_USAGE after a message naming the bad
 * value. cli_log_default sets the command's level (warn unless a daemon says
 * info) and applies. */
int cli_log_apply(void);
int cli_log_default(jsd_log_level level);
/* Handle one connection/logging flag; returns 0, or an exit code on error. */
int cli_conn_flag(cli_conn *c, int opt, const char *arg);
/* getopt_long(argc, argv, shortopts, longopts, NULL) without its prefix
 * matching: on the first call every "--name" must be a whole long option's
 * name, else the command stops (exit CLI_USAGE) with "unknown option --name;
 * did you mean --other?", never echoing the value (it may be a secret). */
int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *longopts);
/* Apply the fallbacks after the flags: JSD_* variables, then the nats CLI's
 * NATS_* variables, then its context (see cli_context.c); CLI_USAGE when no
 * URL is given anywhere, CLI_CONFIG for a context that cannot be used. */
int cli_conn_finish(cli_conn *c, const char *prog);
/* Whether the user asked for NATS at all, for commands where it is
 * optional (status, gc): a -s/--nats flag, JSD_NATS_URL, NATS_URL, or a
 * --context / $NATS_CONTEXT (not the nats CLI's mere selection). */
bool cli_conn_wanted(const cli_conn *c);
/* true once any authentication method is set (token, user, password, creds,
 * NKey). */
bool cli_conn_has_auth(const cli_conn *c);
/* context.c: fill what is still unset from the nats CLI's context: the one
 * --context names, else $NATS_CONTEXT, else the selected one (context.txt),
 * none with --no-context. 0, CLI_USAGE for a bad name, CLI_CONFIG for a file
 * that is missing, malformed or asks for what this tool cannot do (the
 * message names the file and the key, never a value). cli_context_free
 * releases (and wipes) what it kept. */
int cli_context_apply(cli_conn *c, const char *prog);
void cli_context_free(cli_conn *c);
/* strdup or exit(70); free with wipe for secrets. */
char *cli_strdup(const char *s);
void cli_wipe_free(char *s);
/* Open; on failure prints the error and returns the exit code. */
int cli_conn_open(cli_conn *c, jsd_conn **out);
/* jsd_store_open(url): 0, or the exit code after printing the store's error
 * as cmd's. */
int cli_store_open(const char *cmd, const char *url, jsd_store **out);
void cli_conn_free(cli_conn *c);

/* --store URL or $JSD_STORE, with "namespace=$JSD_STORE_NAMESPACE" added when
 * that is set and the URL names no namespace; NULL when no URL is given. */
const char *cli_store_url(const char *flag);

/* Map a status to an exit code. */
int cli_exit_for(jsd_status s);
/* A line of the command's own to stderr (progress, summaries, errors), in
 * the log format in force: "jsdurable CMD: message" as text, or with
 * --log-format json / JSD_LOG_FORMAT=json one JSON object with the library's
 * keys ({"ts","level","component":"cli.CMD","msg"}), so every line of a JSON
 * run parses. Printed whatever the log level: it is the command's output.
 * cli_err is cli_say at level "error". */
void cli_say(const char *cmd, const char *level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void cli_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --metrics ADDR: serve reg over HTTP (with conn for /readyz) and say where.
 * With *reg NULL a registry of the command's own is made into *reg; give
 * jsd_metrics_default() to serve that one. 0, or the exit code after an
 * error naming the flag. */
int cli_metrics_start(const char *cmd, const char *addr, jsd_conn *conn, jsd_metrics **reg,
                      jsd_metrics_server **srv);

/* JSON output (-j/--json): a string value that is never NULL (invalid UTF-8
 * becomes "?" per byte, NULL becomes null), the bytes as "payload" when
 * they are UTF-8 else as "payload_base64", and one document on stdout
 * (compact, one line; the reference is taken). */
struct json_t;
struct json_t *cli_json_str(const char *s);
void cli_json_set_bytes(struct json_t *o, const void *data, size_t len);
void cli_json_print(struct json_t *o);

/* Read all of a stream into a buffer (bounded by max); NULL on error or over
 * the bound (sets *too_big). */
char *cli_read_all(FILE *f, size_t max, size_t *len, bool *too_big);
/* Read a whole small file (secrets: caller wipes). Trailing newline removed. */
char *cli_read_secret_file(const char *path);

/* The CLI's number flags, parsed one way everywhere: a whole decimal number
 * in [lo, hi] with nothing after it (no sign games, no overflow: ERANGE fails). */
bool cli_parse_long(const char *s, long lo, long hi, long *out);
/* A duration "250ms", "30s", "5m", "2h", "7d" or plain milliseconds, >= 0,
 * in milliseconds; false on anything else or on overflow. */
bool cli_parse_duration_ms(const char *s, int64_t *out);

/* Parse "NAME:VALUE" into name/value (pointers into a copy the caller frees). */
bool cli_split_header(const char *arg, char **name, char **value);

#endif
