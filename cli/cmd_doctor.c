/*
 * jsdurable doctor — check a deployment's settings against what
 * effectively-once needs (include/jsdurable/doctor.h): each stream, durable
 * and dead-letter stream, the server's fsync policy through its monitoring
 * port, the store's durability and schema. Prints every check as ok /
 * unknown / warn / error with its fix (or one JSON document with --json) and
 * exits 78 when any check is an error.
 *
 * Also the start-up gate of `relay` and `consume` (cli_doctor_gate): they run
 * the checks that concern them and refuse to start on an error unless the
 * operator named the check in --allow-unsafe, which is then printed as a
 * warning on every start.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable doctor --store URL --nats URL [--topology FILE] [--stream S]...\n"
            "         [--durable STREAM:NAME]... [--monitor URL] [--json]\n\n"
            "Check that a deployment keeps effectively-once: file storage, replicas, discard\n"
            "policy, persist mode, duplicate window against the relay's retry horizon,\n"
            "max_msg_size, atomic batches; each durable's ack policy, effective ack wait,\n"
            "max_deliver and inbox retention; the dead-letter stream; the server's version and\n"
            "fsync policy; the store's durability and schema. To learn whether the server's\n"
            "atomic batches take message ids, it creates and deletes a memory stream\n"
            "JSD_PROBE_<random>.\n"
            "Streams checked: --stream, the topology's, the durables', and those capturing the\n"
            "subjects of the store's pending effects. docs/OPERATIONS.md lists every check.\n\n"
            "Options:\n"
            "  --store URL              sqlite:PATH or postgres://... (or $JSD_STORE)\n"
            "  --topology FILE          check the streams, consumers and dead-letter stream\n"
            "                           the topology file declares\n"
            "  --stream NAME            a stream to check (repeatable)\n"
            "  --durable STREAM:NAME    a durable to check (repeatable)\n"
            "  --dlq-subject SUBJ       the consumers' dead-letter subject (default\n"
            "                           jsd.dlq.<stream>.<durable>)\n"
            "  --monitor URL            the server's HTTP monitoring port (http://host:8222),\n"
            "                           read for its fsync policy; without it: unknown\n"
            "  --inbox-retention DUR    the retention `jsdurable gc` runs with (default 7d)\n"
            "  --deadline-ms N --lease-ms N --backoff-ms BASE:CAP --poll-ms N\n"
            "                           the relay's timings (its retry horizon), as given to\n"
            "                           `jsdurable relay` (defaults as there)\n"
            "  --json                   one JSON document instead of text\n\n"
            "Exit codes: 0 no error (warnings and unknowns are listed); 78 a check is an\n"
            "  error; 64 usage; 73 store cannot be opened; 69 NATS unreachable.\n"
            "%s\n"
            "Example:\n"
            "  jsdurable doctor --store sqlite:app.db --nats nats://127.0.0.1:4222 \\\n"
            "      --topology topology.json --monitor http://127.0.0.1:8222\n",
            CLI_CONN_HELP);
}

/* ---- printing --------------------------------------------------------------------------- */

static void print_text(FILE *f, const jsd_doctor_report *r)
{
    size_t counts[4] = {0};
    for (size_t i = 0; i < jsd_doctor_report_count(r); i++) {
        const jsd_doctor_result *x = jsd_doctor_report_at(r, i);
        counts[x->level]++;
        fprintf(f, "%-7s %-24s %s: %s\n", jsd_doctor_level_str(x->level), x->check, x->subject,
                x->message);
        if (x->level != JSD_DOCTOR_OK && x->fix[0])
            fprintf(f, "        fix: %s\n", x->fix);
    }
    fprintf(f, "doctor: %zu ok, %zu warn, %zu unknown, %zu error\n", counts[JSD_DOCTOR_OK],
            counts[JSD_DOCTOR_WARN], counts[JSD_DOCTOR_UNKNOWN], counts[JSD_DOCTOR_ERROR]);
}

static int print_json(const jsd_doctor_report *r, int rc)
{
    json_t *root = json_object(), *arr = json_array(), *sum = json_object();
    size_t counts[4] = {0};
    if (!root || !arr || !sum) {
        json_decref(root);
        json_decref(arr);
        json_decref(sum);
        return CLI_SOFTWARE;
    }
    for (size_t i = 0; i < jsd_doctor_report_count(r); i++) {
        const jsd_doctor_result *x = jsd_doctor_report_at(r, i);
        counts[x->level]++;
        json_array_append_new(arr, json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "check", x->check, "kind",
                                             jsd_doctor_kind_str(x->kind), "subject", x->subject,
                                             "level", jsd_doctor_level_str(x->level), "message",
                                             x->message, "fix", x->fix));
    }
    for (int l = JSD_DOCTOR_OK; l <= JSD_DOCTOR_ERROR; l++)
        json_object_set_new(sum, jsd_doctor_level_str((jsd_doctor_level)l),
                            json_integer((json_int_t)counts[l]));
    json_object_set_new(root, "results", arr);
    json_object_set_new(root, "summary", sum);
    json_object_set_new(root, "exit", json_integer(rc));
    char *s = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!s)
        return CLI_SOFTWARE;
    printf("%s\n", s);
    free(s);
    return rc;
}

/* ---- the start-up gate of relay and consume ---------------------------------------------- */

int cli_doctor_gate(const char *cmd, jsd_store *store, jsd_conn *conn, const jsd_doctor_opts *o,
                    const char *allow)
{
    jsd_doctor_report *r = NULL;
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd_doctor_run(&r, store, conn, o, &err);
    if (s != JSD_OK) {
        cli_err(cmd, "start-up checks: %s", err.msg[0] ? err.msg : jsd_status_str(s));
        return cli_exit_for(s);
    }
    size_t refused = 0;
    for (size_t i = 0; i < jsd_doctor_report_count(r); i++) {
        const jsd_doctor_result *x = jsd_doctor_report_at(r, i);
        if (x->level == JSD_DOCTOR_ERROR && !jsd_doctor_allowed(allow, x->check)) {
            refused++;
            cli_err(cmd, "refused by check %s (%s): %s; fix: %s", x->check, x->subject, x->message,
                    x->fix);
        } else if (x->level == JSD_DOCTOR_ERROR) {
            /* cli_say: a JSON line in a JSON-mode run, like every other */
            cli_say(cmd, "warn",
                    "WARNING: running although check %s fails (%s), because --allow-unsafe "
                    "names it: %s",
                    x->check, x->subject, x->message);
        } else if (x->level == JSD_DOCTOR_WARN) {
            cli_say(cmd, "warn", "warning: %s (%s): %s; fix: %s", x->check, x->subject, x->message,
                    x->fix);
        }
    }
    jsd_doctor_report_destroy(r);
    if (refused) {
        cli_err(cmd,
                "%zu start-up check(s) failed (see `jsdurable doctor`); fix them, or name them "
                "in --allow-unsafe CHECK[,CHECK] to run anyway",
                refused);
        return CLI_CONFIG;
    }
    return 0;
}

int cli_doctor_allow_check(const char *cmd, const char *allow)
{
    char bad[256] = "";
    if (allow && !jsd_doctor_allow_valid(allow, bad, sizeof(bad))) {
        cli_err(cmd,
                "--allow-unsafe: unknown check \"%s\" (see docs/OPERATIONS.md, \"doctor\"; "
                "or \"all\")",
                bad);
        return CLI_USAGE;
    }
    if (allow && *allow)
        cli_say(cmd, "warn",
                "WARNING: --allow-unsafe %s: these start-up checks do not stop this process; "
                "its deployment may lose or double messages",
                allow);
    return 0;
}

/* ---- the command ------------------------------------------------------------------------- */

enum {
    OPT_STORE = 1,
    OPT_TOPOLOGY,
    OPT_STREAM,
    OPT_DURABLE,
    OPT_DLQ,
    OPT_MONITOR,
    OPT_RETENTION,
    OPT_DEADLINE,
    OPT_LEASE,
    OPT_BACKOFF,
    OPT_POLL,
    OPT_JSON,
    OPT_HELP
};

#define MAX_NAMED 64

int cmd_doctor(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"store", required_argument, NULL, OPT_STORE},
        {"topology", required_argument, NULL, OPT_TOPOLOGY},
        {"stream", required_argument, NULL, OPT_STREAM},
        {"durable", required_argument, NULL, OPT_DURABLE},
        {"dlq-subject", required_argument, NULL, OPT_DLQ},
        {"monitor", required_argument, NULL, OPT_MONITOR},
        {"inbox-retention", required_argument, NULL, OPT_RETENTION},
        {"deadline-ms", required_argument, NULL, OPT_DEADLINE},
        {"lease-ms", required_argument, NULL, OPT_LEASE},
        {"backoff-ms", required_argument, NULL, OPT_BACKOFF},
        {"poll-ms", required_argument, NULL, OPT_POLL},
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, OPT_HELP},
        CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    cli_conn cc;
    jsd_doctor_opts o;
    jsd_relay_opts ro;
    const char *store_flag = NULL, *topo_file = NULL, *dlq = NULL;
    const char *streams[MAX_NAMED];
    jsd_doctor_durable durables[MAX_NAMED];
    char *durable_bufs[MAX_NAMED];
    size_t n_streams = 0, n_durables = 0;
    bool json = false;
    int rc = CLI_OK, opt;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    jsd_topology *topo = NULL;
    jsd_doctor_report *rep = NULL;
    jsd_error err;

    cli_conn_init(&cc);
    jsd_doctor_opts_init(&o);
    jsd_relay_opts_init(&ro);
    jsd_error_clear(&err);
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        if (opt >= CLI_CONN_OPT_BASE) {
            if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0)
                goto out;
            continue;
        }
        long v = 0;
        bool ok = true;
        switch (opt) {
        case OPT_STORE:
            store_flag = optarg;
            break;
        case OPT_TOPOLOGY:
            topo_file = optarg;
            break;
        case OPT_STREAM:
            ok = n_streams < MAX_NAMED;
            if (ok)
                streams[n_streams++] = optarg;
            break;
        case OPT_DURABLE: {
            const char *colon = strchr(optarg, ':');
            ok = n_durables < MAX_NAMED && colon && colon > optarg && colon[1];
            if (ok) {
                char *b = strdup(optarg);
                if (!b) {
                    rc = CLI_SOFTWARE;
                    goto out;
                }
                b[colon - optarg] = '\0';
                durable_bufs[n_durables] = b;
                durables[n_durables++] = (jsd_doctor_durable){b, b + (colon - optarg) + 1, NULL, 0};
            }
            break;
        }
        case OPT_DLQ:
            dlq = optarg;
            break;
        case OPT_MONITOR:
            o.monitor_url = optarg;
            break;
        case OPT_RETENTION:
            ok = cli_parse_duration_ms(optarg, &o.inbox_retention_ms);
            break;
        case OPT_DEADLINE:
            ok = cli_parse_long(optarg, 1, 300000, &v);
            ro.publish_deadline_ms = (int)v;
            break;
        case OPT_LEASE:
            ok = cli_parse_long(optarg, 1, 86400000, &v);
            ro.lease_ms = (int)v;
            break;
        case OPT_POLL:
            ok = cli_parse_long(optarg, 1, 3600000, &v);
            ro.poll_interval_ms = (int)v;
            break;
        case OPT_BACKOFF: {
            const char *colon = strchr(optarg, ':');
            long cap = 0;
            ok = colon && cli_parse_long(colon + 1, 1, 86400000, &cap);
            ro.backoff_cap_ms = (int)cap;
            break;
        }
        case OPT_JSON:
            json = true;
            break;
        case 'h':
        case OPT_HELP:
            usage(stdout);
            goto out;
        default:
            usage(stderr);
            rc = CLI_USAGE;
            goto out;
        }
        if (!ok) {
            cli_err("doctor", "bad value '%s' for --%s (see --help)", optarg,
                    longopts[opt - 1].name);
            rc = CLI_USAGE;
            goto out;
        }
    }
    if (optind < argc) {
        cli_err("doctor", "unexpected argument '%s'", argv[optind]);
        rc = CLI_USAGE;
        goto out;
    }
    for (size_t i = 0; i < n_durables; i++)
        durables[i].dlq_subject = dlq;
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("doctor", "no store: give --store URL or set JSD_STORE");
        rc = CLI_USAGE;
        goto out;
    }
    if ((rc = cli_conn_finish(&cc, "doctor")) != 0)
        goto out;
    if (topo_file) {
        jsd_status s = jsd_topology_load(&topo, topo_file, &err);
        if (s != JSD_OK) {
            cli_err("doctor", "%s", err.msg);
            rc = s == JSD_ERR_IO ? CLI_IOERR : CLI_CONFIG;
            goto out;
        }
    }
    /* Opening applies the library's migrations, as every command does; a
     * schema newer than this binary is refused, and is the doctor's error. */
    jsd_status s = jsd_store_open(&store, url, &err);
    if (s == JSD_ERR_SCHEMA) {
        cli_err("doctor", "error store.schema: %s; fix: upgrade jsdurable to the store's version",
                err.msg);
        rc = CLI_CONFIG;
        goto out;
    }
    if (s != JSD_OK) {
        cli_err("doctor", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        rc = cli_exit_for(s);
        goto out;
    }
    if ((rc = cli_conn_open(&cc, &conn)) != 0)
        goto out;

    o.relay = &ro;
    o.streams = streams;
    o.n_streams = n_streams;
    o.durables = durables;
    o.n_durables = n_durables;
    o.topology = topo;
    o.outbox_streams = true;
    s = jsd_doctor_run(&rep, store, conn, &o, &err);
    if (s != JSD_OK) {
        cli_err("doctor", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        rc = cli_exit_for(s);
        goto out;
    }
    rc = jsd_doctor_report_worst(rep) == JSD_DOCTOR_ERROR ? CLI_CONFIG : CLI_OK;
    if (json)
        rc = print_json(rep, rc);
    else
        print_text(stdout, rep);

out:
    jsd_doctor_report_destroy(rep);
    jsd_topology_destroy(topo);
    jsd_conn_close(conn);
    jsd_store_close(store);
    for (size_t i = 0; i < n_durables; i++)
        free(durable_bufs[i]);
    cli_conn_free(&cc);
    return rc;
}
