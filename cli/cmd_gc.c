/*
 * jsdurable gc — retention (STORE-4): remove published outbox effects and
 * inbox rows older than a horizon, in bounded transactions, printing progress.
 *
 * The horizon must not be shorter than the stream's duplicate window: a
 * retired effect republished after its row is gone would not be recognised,
 * and an inbox row removed while the broker may still redeliver would let a
 * delivery apply twice. gc refuses a horizon under the longest duplicate
 * window of the account's streams, read from the server with --nats (or
 * $JSD_NATS_URL), or under --dedup-window when the operator states it; with
 * neither it refuses to guess. --min-horizon is the operator's own floor
 * (e.g. ack_wait x max_deliver + backoff). Dead-lettered effects and poison
 * records are evidence and are never removed. With -j/--json the result (rows
 * removed, the horizon and the window it was checked against) is one JSON
 * document on stdout.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: jsdurable gc --store URL --older-than DURATION [--batch N]\n"
        "                    (--nats URL | --dedup-window DURATION)\n"
        "                    [--min-horizon DURATION]\n\n"
        "Remove published outbox effects and inbox rows older than DURATION, at most\n"
        "N of each per transaction. Durations: 250ms, 30s, 5m, 2h, 7d.\n\n"
        "  --store URL              sqlite:PATH, a file path, or postgres://... ($JSD_STORE)\n"
        "  --older-than DURATION    the horizon (required)\n"
        "  --batch N                rows per transaction, 1..100000 (default 1000)\n"
        "  --nats URL               read every stream's duplicate window from the server\n"
        "                           (or $JSD_NATS_URL); a horizon under the longest one\n"
        "                           is refused\n"
        "  --dedup-window DURATION  without a server: the longest duplicate window of\n"
        "                           your streams, as you know it; a shorter horizon is\n"
        "                           refused (with --nats, the larger of the two counts)\n"
        "  --min-horizon DURATION   refuse any horizon shorter than this too (e.g. the\n"
        "                           longest redelivery time of your consumers)\n"
        "  -j, --json               one JSON document: {\"ok\",\"removed\",\"horizon_ms\",\n"
        "                           \"duplicate_window_ms\",\"window_from\",\"min_horizon_ms\",\n"
        "                           \"store\"[,\"error\"]}\n\n"
        "One of --nats or --dedup-window is required: gc does not guess the window.\n"
        "Dead-lettered effects and poison records are kept.\n\n"
        "Exit codes: 0 done; 78 horizon refused or window unknown (nothing removed);\n"
        "69 NATS unreachable; 73 store cannot be opened; 74 store read-only or full.\n\n"
        "%s\n"
        "Example:\n"
        "  jsdurable gc --store sqlite:app.db --nats nats://127.0.0.1:4222 --older-than 7d\n",
        CLI_CONN_HELP);
}

static bool parse_dur(const char *what, const char *arg, int64_t *out)
{
    if (!cli_parse_duration_ms(arg, out)) {
        cli_err("gc", "%s takes a duration such as 30s, 5m, 2h or 7d, not \"%s\"", what, arg);
        return false;
    }
    return true;
}

/* The longest duplicate window of the account's streams, into *window when
 * it is larger; from names the stream it came from. */
static int server_window(cli_conn *cc, int64_t *window, char *from, size_t cap)
{
    jsd_conn *conn = NULL;
    int rc = cli_conn_open(cc, &conn);
    if (rc != 0)
        return rc;
    jsd_stream_state *st = NULL;
    size_t n = 0;
    jsd_error err;
    jsd_error_clear(&err);
    if (*window < 0) {
        *window = 0;
        snprintf(from, cap, "no stream on the server");
    }
    jsd_status s = jsd_stream_states_list(conn, &st, &n, &err);
    jsd_conn_close(conn);
    if (s != JSD_OK) {
        cli_err("gc", "reading the streams' duplicate windows: %s",
                err.msg[0] ? err.msg : jsd_status_str(s));
        return cli_exit_for(s);
    }
    for (size_t i = 0; i < n; i++) {
        if (st[i].duplicate_window_ms > *window) {
            *window = st[i].duplicate_window_ms;
            snprintf(from, cap, "stream %s", st[i].name);
        }
    }
    jsd_stream_states_free(st, n);
    return 0;
}

/* -j/--json: the one document, printed at every exit after the flags. */
static int gc_done(bool json, int rc, int64_t removed, int64_t older, int64_t window,
                   const char *from, int64_t floor_ms, const char *url, const char *error)
{
    if (!json)
        return rc;
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_boolean(rc == CLI_OK));
    json_object_set_new(o, "removed", json_integer(removed));
    json_object_set_new(o, "horizon_ms", json_integer(older));
    json_object_set_new(o, "duplicate_window_ms", window >= 0 ? json_integer(window) : json_null());
    json_object_set_new(o, "window_from", window >= 0 ? cli_json_str(from) : json_null());
    json_object_set_new(o, "min_horizon_ms", json_integer(floor_ms));
    if (url) /* only an open store's redacted URL: the given one may hold a password */
        json_object_set_new(o, "store", cli_json_str(url));
    if (error)
        json_object_set_new(o, "error", cli_json_str(error));
    cli_json_print(o);
    return rc;
}

int cmd_gc(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"older-than", required_argument, NULL, 'o'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"dedup-window", required_argument, NULL, 'w'},
                                             {"min-horizon", required_argument, NULL, 'm'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"json", no_argument, NULL, 'j'},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    int64_t older = -1, window = -1, floor_ms = 0;
    cli_conn cc;
    cli_conn_init(&cc);
    cc.opts.startup_budget_ms = 2000;
    long batch = 1000;
    bool json = false;
    int opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'o':
            if (!parse_dur("--older-than", optarg, &older))
                return CLI_USAGE;
            break;
        case 'w':
            if (!parse_dur("--dedup-window", optarg, &window))
                return CLI_USAGE;
            break;
        case 'm':
            if (!parse_dur("--min-horizon", optarg, &floor_ms))
                return CLI_USAGE;
            break;
        case 'b':
            if (!cli_parse_long(optarg, 1, 100000, &batch)) {
                cli_err("gc", "--batch takes 1..100000");
                return CLI_USAGE;
            }
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            usage(stdout);
            cli_conn_free(&cc);
            return CLI_OK;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                int r = cli_conn_flag(&cc, opt, optarg);
                if (r) {
                    cli_conn_free(&cc);
                    return r;
                }
                break;
            }
            usage(stderr);
            cli_conn_free(&cc);
            return CLI_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("gc", "unexpected argument \"%s\"", argv[optind]);
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url || older < 0) {
        cli_err("gc", "--store URL (or $JSD_STORE) and --older-than DURATION are required");
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    char from[160] = "--dedup-window";
    if (cli_conn_wanted(&cc)) {
        int rc = cli_conn_finish(&cc, "gc");
        if (rc == 0)
            rc = server_window(&cc, &window, from, sizeof(from));
        if (rc != 0) {
            cli_conn_free(&cc);
            return gc_done(json, rc, 0, older, -1, from, floor_ms, NULL,
                           "the duplicate windows could not be read from NATS");
        }
    }
    cli_conn_free(&cc);
    char why[400];
#define GC_REFUSE(...)                                                                             \
    do {                                                                                           \
        snprintf(why, sizeof(why), __VA_ARGS__);                                                   \
        cli_err("gc", "%s", why);                                                                  \
        return gc_done(json, CLI_CONFIG, 0, older, window, from, floor_ms, NULL, why);             \
    } while (0)
    if (window < 0)
        GC_REFUSE("the duplicate window is unknown: give --nats URL to read it from the "
                  "streams, or --dedup-window DURATION; nothing removed");
    if (older < window)
        GC_REFUSE("--older-than %lld ms is shorter than the duplicate window (%lld ms, %s): a "
                  "republished effect or a redelivery could then apply twice; nothing removed",
                  (long long)older, (long long)window, from);
    if (older < floor_ms)
        GC_REFUSE("--older-than %lld ms is shorter than --min-horizon %lld ms; nothing removed",
                  (long long)older, (long long)floor_ms);
#undef GC_REFUSE
    jsd_store *s = NULL;
    jsd_error err;
    jsd_status st = jsd_store_open(&s, url, &err);
    if (st != JSD_OK) {
        cli_err("gc", "%s", err.msg[0] ? err.msg : jsd_status_str(st));
        return gc_done(json, cli_exit_for(st), 0, older, window, from, floor_ms, NULL,
                       err.msg[0] ? err.msg : jsd_status_str(st));
    }
    int64_t total = 0, k = 0;
    int steps = 0;
    do {
        st = jsd_store_gc_step(s, older, (int)batch, &k);
        if (st != JSD_OK) {
            cli_err("gc", "%s (%lld rows removed before this)", jsd_store_errmsg(s),
                    (long long)total);
            char where[512];
            snprintf(why, sizeof(why), "%s", jsd_store_errmsg(s));
            snprintf(where, sizeof(where), "%s", jsd_store_url(s));
            jsd_store_close(s);
            return gc_done(json, cli_exit_for(st), total, older, window, from, floor_ms, where,
                           why);
        }
        total += k;
        if (k > 0 && ++steps % 10 == 0)
            cli_say("gc", "info", "%lld rows removed so far", (long long)total);
    } while (k > 0);
    if (!json)
        printf("removed %lld rows (published effects and inbox rows older than %lld ms) from %s\n",
               (long long)total, (long long)older, jsd_store_url(s));
    else
        gc_done(json, CLI_OK, total, older, window, from, floor_ms, jsd_store_url(s), NULL);
    jsd_store_close(s);
    return CLI_OK;
}
