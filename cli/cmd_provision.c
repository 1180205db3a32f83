/*
 * jsdurable provision — create or reconcile the streams and durable consumers
 * a topology file declares (TOPO-1,2). One line per object:
 *
 *   stream ORDERS: created
 *   stream JSD_DLQ: unchanged
 *   stream ORDERS: kept (max_msgs: server 5000, file unlimited)
 *   consumer ORDERS/shipping: updated (ack_wait: server 10s, file 30s)
 *
 * With --dry-run the same lines read "would create" / "would update" and
 * nothing changes on the server. With -j/--json the plan and what was applied
 * come as one JSON document instead.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: jsdurable provision --file FILE [--policy create|reconcile] [--dry-run]\n"
        "                           [--nats URL] [--timeout-ms N] [connection flags]\n\n"
        "Create or reconcile the JetStream streams, durable pull consumers and the\n"
        "dead-letter stream declared in a topology file (docs/TOPOLOGY.md).\n\n"
        "  --file FILE          the topology (JSON); validated before the server is contacted\n"
        "  --policy create      create what is missing; keep existing objects as an operator\n"
        "                       tuned them, reporting their differences as \"kept\" (default)\n"
        "  --policy reconcile   create what is missing and update what differs; a field\n"
        "                       JetStream cannot change (storage, retention, a consumer's\n"
        "                       deliver or ack policy) is refused, never deleted and re-created\n"
        "  --dry-run            print the plan and change nothing\n"
        "  --check              only validate the file (no server needed)\n"
        "  -j, --json           one JSON document: {\"file\",\"policy\",\"dry_run\",\n"
        "                       \"objects\":[{\"kind\",\"name\",\"action\",\"changes\":[...]}],\n"
        "                       \"objects_total\",\"changed\",\"ok\"[,\"error\"]}\n"
        "  --timeout-ms N       deadline of each JetStream request (default: the\n"
        "                       connection's request timeout, 5000)\n\n" CLI_CONN_HELP
        "\nOutput: one line per object: created, unchanged, kept or updated, with the\n"
        "fields that differ (server value, file value).\n\n"
        "Exit codes: 0 done; 78 file or plan refused (nothing changed); 65 file too large;\n"
        "69 server unreachable; 74 file unreadable; 1 the server refused a change.\n\n"
        "Example:\n"
        "  jsdurable provision --nats nats://127.0.0.1:4222 --file examples/topology.json \\\n"
        "      --policy reconcile --dry-run\n");
}

typedef struct prov_out {
    int n_objects;
    int n_changed;
    json_t *objects; /* -j/--json: the reports, else NULL */
} prov_out;

static void on_report(const jsd_topology_report *r, void *user)
{
    prov_out *po = user;
    const char *word = jsd_topology_action_str(r->action);
    if (r->dry_run && r->action == JSD_TOPOLOGY_CREATED)
        word = "would create";
    else if (r->dry_run && r->action == JSD_TOPOLOGY_UPDATED)
        word = "would update";
    po->n_objects++;
    if (r->action == JSD_TOPOLOGY_CREATED || r->action == JSD_TOPOLOGY_UPDATED)
        po->n_changed++;
    if (po->objects) {
        json_t *o = json_object(), *ch = json_array();
        json_object_set_new(o, "kind", cli_json_str(r->kind));
        json_object_set_new(o, "name", cli_json_str(r->name));
        json_object_set_new(o, "action", cli_json_str(jsd_topology_action_str(r->action)));
        for (size_t i = 0; i < r->n_changes; i++)
            json_array_append_new(ch, json_pack("{s:o, s:o, s:o}", "field",
                                                cli_json_str(r->changes[i].field), "server",
                                                cli_json_str(r->changes[i].server), "file",
                                                cli_json_str(r->changes[i].file)));
        json_object_set_new(o, "changes", ch);
        json_array_append_new(po->objects, o);
        return;
    }
    printf("%s %s: %s", r->kind, r->name, word);
    if (r->n_changes) {
        printf(" (");
        for (size_t i = 0; i < r->n_changes; i++)
            printf("%s%s: server %s, file %s", i ? "; " : "", r->changes[i].field,
                   r->changes[i].server, r->changes[i].file);
        printf(")");
    }
    printf("\n");
    fflush(stdout);
}

int cmd_provision(int argc, char **argv)
{
    static const struct option longopts[] = {{"file", required_argument, NULL, 'f'},
                                             {"policy", required_argument, NULL, 'p'},
                                             {"dry-run", no_argument, NULL, 'n'},
                                             {"check", no_argument, NULL, 'c'},
                                             {"timeout-ms", required_argument, NULL, 't'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"json", no_argument, NULL, 'j'},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    cli_conn cc;
    const char *file = NULL;
    bool check_only = false, json = false;
    json_t *doc = NULL;
    prov_out po = {0, 0, NULL};
    jsd_topology_apply_opts ao;
    jsd_topology *topo = NULL;
    jsd_conn *conn = NULL;
    jsd_error err;
    int rc = CLI_OK, opt;

    cli_conn_init(&cc);
    jsd_topology_apply_opts_init(&ao);
    jsd_error_clear(&err);
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 'f':
            file = optarg;
            break;
        case 'p':
            if (!strcmp(optarg, "create")) {
                ao.policy = JSD_TOPOLOGY_CREATE;
            } else if (!strcmp(optarg, "reconcile")) {
                ao.policy = JSD_TOPOLOGY_RECONCILE;
            } else {
                cli_err("provision", "--policy takes create or reconcile, not \"%s\"", optarg);
                rc = CLI_USAGE;
                goto done;
            }
            break;
        case 'n':
            ao.dry_run = true;
            break;
        case 'c':
            check_only = true;
            break;
        case 'j':
            json = true;
            break;
        case 't': {
            long v;
            if (!cli_parse_long(optarg, 1, 600000, &v)) {
                cli_err("provision", "--timeout-ms takes 1..600000 milliseconds");
                rc = CLI_USAGE;
                goto done;
            }
            ao.timeout_ms = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            goto done;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0)
                    goto done;
                break;
            }
            usage(stderr);
            rc = CLI_USAGE;
            goto done;
        }
    }
    if (optind < argc) {
        cli_err("provision", "unexpected argument \"%s\"", argv[optind]);
        rc = CLI_USAGE;
        goto done;
    }
    if (!file) {
        cli_err("provision", "--file FILE is required (see jsdurable provision --help)");
        rc = CLI_USAGE;
        goto done;
    }
    if (json) {
        doc = json_object();
        json_object_set_new(doc, "file", cli_json_str(file));
    }
    jsd_status s = jsd_topology_load(&topo, file, &err);
    if (s != JSD_OK) {
        cli_err("provision", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        rc = cli_exit_for(s);
        json_object_set_new(doc, "valid", json_false());
        json_object_set_new(doc, "error", cli_json_str(err.msg[0] ? err.msg : jsd_status_str(s)));
        goto done;
    }
    if (check_only) {
        if (json) {
            json_object_set_new(doc, "valid", json_true());
            json_object_set_new(doc, "streams",
                                json_integer((json_int_t)jsd_topology_stream_count(topo)));
            json_object_set_new(doc, "consumers",
                                json_integer((json_int_t)jsd_topology_consumer_count(topo)));
        } else {
            printf("%s: valid (%zu streams, %zu consumers)\n", file,
                   jsd_topology_stream_count(topo), jsd_topology_consumer_count(topo));
        }
        goto done;
    }
    if (json) {
        json_object_set_new(doc, "valid", json_true());
        json_object_set_new(
            doc, "policy",
            json_string(ao.policy == JSD_TOPOLOGY_RECONCILE ? "reconcile" : "create"));
        json_object_set_new(doc, "dry_run", json_boolean(ao.dry_run));
        po.objects = json_array();
        json_object_set_new(doc, "objects", po.objects);
    }
    if ((rc = cli_conn_finish(&cc, "provision")) != 0)
        goto done;
    if ((rc = cli_conn_open(&cc, &conn)) != 0)
        goto done;

    ao.report = on_report;
    ao.user = &po;
    s = jsd_topology_apply(conn, topo, &ao, &err);
    if (s != JSD_OK) {
        cli_err("provision", "%s%s", err.msg[0] ? err.msg : jsd_status_str(s),
                s == JSD_ERR_CONFIG ? " (nothing was changed)" : "");
        rc = s == JSD_ERR_NATS ? CLI_FAILED : cli_exit_for(s);
        json_object_set_new(doc, "error", cli_json_str(err.msg[0] ? err.msg : jsd_status_str(s)));
        goto done;
    }
    if (json)
        goto done;
    printf("%s: %d objects, %d %s (%s policy)\n", ao.dry_run ? "dry run" : "done", po.n_objects,
           po.n_changed, ao.dry_run ? "would change" : "changed",
           ao.policy == JSD_TOPOLOGY_RECONCILE ? "reconcile" : "create");
done:
    if (doc && topo && !check_only) {
        json_object_set_new(doc, "objects_total", json_integer(po.n_objects));
        json_object_set_new(doc, "changed", json_integer(po.n_changed));
    }
    if (doc) {
        json_object_set_new(doc, "ok", json_boolean(rc == CLI_OK));
        cli_json_print(doc);
    }
    jsd_conn_close(conn);
    jsd_topology_destroy(topo);
    cli_conn_free(&cc);
    return rc;
}
