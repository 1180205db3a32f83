/*
 * jsdurable relay — publish committed outbox effects to JetStream and record
 * their receipts (RELAY-1..4). Opens a store handle of its own (the relay owns
 * it) and one NATS connection, then runs the relay until SIGTERM/SIGINT, or
 * with --until-idle until nothing is due and nothing is in flight.
 *
 * A signal only sets the relay's stop flag: no new claims are made, the
 * publications in flight are settled and their receipts written, then the
 * process exits 0. --until-idle exits 0 only when everything it could reach
 * was published: a summary line and the exit status say what was left.
 */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "service.h"

static void stop_relay(void *r)
{
    jsd_relay_stop(r);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable relay --store URL --nats URL [OPTIONS]\n\n"
            "Publish committed outbox effects to JetStream with their stable Nats-Msg-Id,\n"
            "wait for each PubAck and record the receipt (stream, sequence, duplicate).\n"
            "Runs until SIGTERM/SIGINT (graceful: no new claims, in-flight publications\n"
            "settled, receipts written), or with --until-idle until nothing is due.\n\n"
            "Options:\n"
            "  --store URL            sqlite:PATH, a file path, or postgres://... (or $JSD_STORE)\n"
            "  --until-idle           exit once nothing is due and nothing is in flight\n"
            "  --batch N              effects per claim (default 256)\n"
            "  --atomic-min N         the fewest effects of a claim for one stream sent as\n"
            "                         one atomic batch where the stream allows them; fewer\n"
            "                         go one by one (1..1000, default 16)\n"
            "  --max-in-flight N      publications awaiting a PubAck (default 1024, max 1024)\n"
            "  --poll-ms N            query at least this often when idle (default 1000)\n"
            "  --lease-ms N           claim lease (default 30000; > deadline + 1000)\n"
            "  --deadline-ms N        per publication, PubAck included (default 5000)\n"
            "  --backoff-ms BASE:CAP  retry delay after a failure (default 500:60000;\n"
            "                         deadline + CAP + lease + poll must stay below the\n"
            "                         stream's duplicate window)\n"
            "  --budget N             failed attempts before dead-lettering (default 50)\n"
            "  --metrics ADDR         serve Prometheus metrics on ADDR (host:port)\n"
            "  --stats                print the relay's counters as one JSON line at exit\n"
            "  --write-each           write each publication to the socket at once, instead of\n"
            "                         gathering them for about 1 ms into large writes (the\n"
            "                         default: less CPU per effect, up to ~1 ms more latency)\n"
            "  --stream NAME          also check this stream at start (repeatable)\n"
            "  --monitor URL          the server's HTTP monitoring port: its fsync policy is\n"
            "                         checked at start (lazy fsync is a warning)\n"
            "  --allow-unsafe CHECK[,CHECK]  run although these start-up checks fail (\"all\":\n"
            "                         any); printed as a warning on every start\n\n"
            "At start the relay runs the checks of `jsdurable doctor` that concern it (the\n"
            "streams of the pending effects and --stream: storage, replicas, discard policy,\n"
            "duplicate window, max_msg_size; the store; the server's fsync with --monitor)\n"
            "and refuses to run (exit 78) on an error, naming the check and its fix.\n"
            "The relay refuses (exit 78) a target stream whose duplicate window is shorter\n"
            "than deadline + backoff cap + lease + poll: a retry after the window would be stored\n"
            "twice. It checks each stream when the first effect for it is claimed.\n\n"
            "Exit codes: 0 stopped by a signal, or --until-idle with everything published;\n"
            "  1  --until-idle, and this run dead-lettered effects (see `jsdurable status`);\n"
            "  75 --until-idle, and effects that failed wait for a retry (run it again);\n"
            "     or a stop that JSD_STOP_TIMEOUT_MS (default 5000) cut short (loses nothing);\n"
            "SIGHUP reopens a log file (stderr) after rotation and never stops the relay.\n"
            "  64 usage; 69 NATS unreachable; 73 store cannot be opened; 78 configuration\n"
            "  refused (e.g. a duplicate window shorter than the retry horizon).\n"
            "%s\n"
            "Example:\n"
            "  JSD_STORE=sqlite:app.db jsdurable relay --nats nats://127.0.0.1:4222 \\\n"
            "      --log-level info --until-idle\n",
            CLI_CONN_HELP);
}

static bool parse_num(const char *arg, long min, long max, int *out)
{
    long v = 0;
    if (!cli_parse_long(arg, min, max, &v))
        return false;
    *out = (int)v;
    return true;
}

enum {
    OPT_STORE = 1,
    OPT_UNTIL_IDLE,
    OPT_BATCH,
    OPT_ATOMIC_MIN,
    OPT_INFLIGHT,
    OPT_POLL,
    OPT_LEASE,
    OPT_DEADLINE,
    OPT_BACKOFF,
    OPT_BUDGET,
    OPT_METRICS,
    OPT_STATS,
    OPT_STREAM,
    OPT_MONITOR,
    OPT_ALLOW,
    OPT_WRITE_EACH,
    OPT_HELP
};

#define RELAY_STREAMS_MAX 64

/* /readyz: NATS is checked by the server itself; this adds the store. */
static bool relay_ready(void *user, char *why, size_t cap)
{
    jsd_relay_stats st;
    jsd_relay_stats_get(user, &st);
    if (!st.store_down)
        return true;
    snprintf(why, cap, "store: not answering (claims paused, receipts held)");
    return false;
}

int cmd_relay(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"store", required_argument, NULL, OPT_STORE},
        {"until-idle", no_argument, NULL, OPT_UNTIL_IDLE},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"atomic-min", required_argument, NULL, OPT_ATOMIC_MIN},
        {"max-in-flight", required_argument, NULL, OPT_INFLIGHT},
        {"poll-ms", required_argument, NULL, OPT_POLL},
        {"lease-ms", required_argument, NULL, OPT_LEASE},
        {"deadline-ms", required_argument, NULL, OPT_DEADLINE},
        {"backoff-ms", required_argument, NULL, OPT_BACKOFF},
        {"budget", required_argument, NULL, OPT_BUDGET},
        {"metrics", required_argument, NULL, OPT_METRICS},
        {"stats", no_argument, NULL, OPT_STATS},
        {"stream", required_argument, NULL, OPT_STREAM},
        {"monitor", required_argument, NULL, OPT_MONITOR},
        {"allow-unsafe", required_argument, NULL, OPT_ALLOW},
        {"write-each", no_argument, NULL, OPT_WRITE_EACH},
        {"help", no_argument, NULL, OPT_HELP},
        CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    cli_conn cc;
    jsd_relay_opts ro;
    const char *store_flag = NULL, *metrics_addr = NULL, *monitor = NULL, *allow = NULL;
    const char *streams[RELAY_STREAMS_MAX];
    size_t n_streams = 0;
    bool until_idle = false, print_stats = false, write_each = false;
    int rc = CLI_OK;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    jsd_relay *relay = NULL;
    jsd_metrics *metrics = NULL;
    jsd_metrics_server *msrv = NULL;
    jsd_error err;

    cli_conn_init(&cc);
    jsd_relay_opts_init(&ro);
    jsd_error_clear(&err);
    if (cli_log_default(JSD_LOG_INFO) != 0)
        return CLI_USAGE;

    optind = 1;
    int opt;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        bool ok = true;
        switch (opt) {
        case OPT_STORE:
            store_flag = optarg;
            break;
        case OPT_UNTIL_IDLE:
            until_idle = true;
            break;
        case OPT_BATCH:
            ok = parse_num(optarg, 1, 4096, &ro.batch_size);
            break;
        case OPT_ATOMIC_MIN:
            ok = parse_num(optarg, 1, 1000, &ro.atomic_min);
            break;
        case OPT_INFLIGHT:
            ok = parse_num(optarg, 1, 1024, &ro.max_in_flight);
            break;
        case OPT_POLL:
            ok = parse_num(optarg, 1, 3600000, &ro.poll_interval_ms);
            break;
        case OPT_LEASE:
            ok = parse_num(optarg, 1, 86400000, &ro.lease_ms);
            break;
        case OPT_DEADLINE:
            ok = parse_num(optarg, 1, 300000, &ro.publish_deadline_ms);
            break;
        case OPT_BACKOFF: {
            const char *colon = strchr(optarg, ':');
            char base[32];
            size_t n = colon ? (size_t)(colon - optarg) : 0;
            ok = colon && n > 0 && n < sizeof(base);
            if (ok) {
                memcpy(base, optarg, n);
                base[n] = '\0';
                ok = parse_num(base, 1, 86400000, &ro.backoff_base_ms) &&
                     parse_num(colon + 1, 1, 86400000, &ro.backoff_cap_ms);
            }
            break;
        }
        case OPT_BUDGET:
            ok = parse_num(optarg, 1, 100000, &ro.attempt_budget);
            break;
        case OPT_METRICS:
            metrics_addr = optarg;
            break;
        case OPT_STATS:
            print_stats = true;
            break;
        case OPT_STREAM:
            ok = n_streams < RELAY_STREAMS_MAX;
            if (ok)
                streams[n_streams++] = optarg;
            break;
        case OPT_MONITOR:
            monitor = optarg;
            break;
        case OPT_ALLOW:
            allow = optarg;
            break;
        case OPT_WRITE_EACH:
            write_each = true;
            break;
        case 'h':
        case OPT_HELP:
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
        if (!ok) {
            cli_err("relay", "bad value '%s' for --%s (see --help)", optarg,
                    longopts[opt - 1].name);
            cli_conn_free(&cc);
            return CLI_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("relay", "unexpected argument '%s'", argv[optind]);
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    if ((rc = cli_doctor_allow_check("relay", allow)) != 0) {
        cli_conn_free(&cc);
        return rc;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("relay", "no store: give --store URL or set JSD_STORE");
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    if ((rc = cli_conn_finish(&cc, "relay")) != 0) {
        cli_conn_free(&cc);
        return rc;
    }
    /* Signals and sd_notify (cli/service.h): before any thread exists. */
    if ((rc = cli_service_start("relay", &cc)) != 0) {
        cli_conn_free(&cc);
        return rc;
    }
    /* The relay owns this store handle: nobody else uses it. */
    if ((rc = cli_store_open("relay", url, &store)) != 0)
        goto out;
    /* A relay publishes many effects at a time: gathering them into large
     * socket writes halves its CPU per effect (docs/PERFORMANCE.md). */
    cc.opts.coalesce_writes = write_each ? 0 : 1;
    if ((rc = cli_conn_open(&cc, &conn)) != 0)
        goto out;
    /* The start-up checks: what would make this relay lose or double. */
    jsd_doctor_opts dop;
    jsd_doctor_opts_init(&dop);
    dop.checks = JSD_DOCTOR_CHECK_STREAMS | JSD_DOCTOR_CHECK_RELAY | JSD_DOCTOR_CHECK_STORE |
                 (monitor ? JSD_DOCTOR_CHECK_SERVER : 0u);
    dop.relay = &ro;
    dop.streams = streams;
    dop.n_streams = n_streams;
    dop.outbox_streams = true;
    dop.monitor_url = monitor;
    if ((rc = cli_doctor_gate("relay", store, conn, &dop, allow)) != 0)
        goto out;
    if (metrics_addr) {
        if ((rc = cli_metrics_start("relay", metrics_addr, conn, &metrics, &msrv)) != 0)
            goto out;
        ro.metrics = metrics;
    }
    jsd_status s = jsd_relay_create(&relay, store, conn, &ro, &err);
    if (s != JSD_OK) {
        cli_err("relay", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        rc = cli_exit_for(s);
        goto out;
    }
    if (msrv)
        jsd_metrics_server_set_ready(msrv, relay_ready, relay);

    signal(SIGPIPE, SIG_IGN);
    cli_service_ready(stop_relay, relay);
    s = until_idle ? jsd_relay_run_until_idle(relay) : jsd_relay_run(relay);
    cli_service_stopping();
    if (s != JSD_OK) {
        cli_err("relay", "%s", jsd_relay_errmsg(relay));
        rc = cli_exit_for(s);
    }
    jsd_relay_stats st;
    jsd_relay_stats_get(relay, &st);
    if (s == JSD_OK && until_idle) {
        if (st.dead_lettered > 0)
            rc = CLI_FAILED;
        else if (st.left_failing != 0) /* > 0, or -1: could not be counted */
            rc = CLI_TEMPFAIL;
        cli_say("relay", rc == CLI_OK ? "info" : "warn",
                "%s: published %llu, dead-lettered %llu by this run; left "
                "unpublished after failures: %lld; dead-lettered in the store: %lld",
                rc == CLI_OK ? "done" : "not everything was published",
                (unsigned long long)st.published, (unsigned long long)st.dead_lettered,
                (long long)st.left_failing, (long long)st.left_dead_lettered);
    }
    if (print_stats) {
        printf("{\"published\":%llu,\"duplicates\":%llu,\"errors\":%llu,\"dead_lettered\":%llu,"
               "\"batches\":%llu,\"lease_lost\":%llu,\"store_errors\":%llu,"
               "\"first_attempt_duplicates\":%llu,\"left_failing\":%lld,"
               "\"left_dead_lettered\":%lld,\"atomic_batches\":%llu,\"atomic_effects\":%llu}\n",
               (unsigned long long)st.published, (unsigned long long)st.duplicates,
               (unsigned long long)st.errors, (unsigned long long)st.dead_lettered,
               (unsigned long long)st.batches, (unsigned long long)st.lease_lost,
               (unsigned long long)st.store_errors, (unsigned long long)st.first_attempt_duplicates,
               (long long)st.left_failing, (long long)st.left_dead_lettered,
               (unsigned long long)st.atomic_batches, (unsigned long long)st.atomic_effects);
        fflush(stdout);
    }

out:
    jsd_metrics_server_destroy(msrv);
    jsd_relay_destroy(relay);
    jsd_metrics_destroy(metrics);
    jsd_conn_close(conn);
    jsd_store_close(store);
    cli_conn_free(&cc);
    return rc;
}
