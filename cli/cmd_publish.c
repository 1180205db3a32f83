/*
 * jsdurable publish — publish one message from standard input through the
 * bounded publisher and print its outcome as one JSON line. The exit code
 * tells the outcome apart, so a script can retry UNKNOWN with the same --id.
 */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* An outcome without a sysexits code that fits. */
#define PUB_EXIT_RETRYABLE 3

#define PUB_STDIN_MAX ((size_t)64 * 1024 * 1024)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable publish --nats URL --stream NAME --subject SUBJECT --id ID\n"
            "                         [--header NAME:VALUE]... [--deadline-ms N] < payload\n\n"
            "Publish standard input to an existing JetStream stream with Nats-Msg-Id ID and\n"
            "Nats-Expected-Stream NAME, and print the outcome as one JSON line:\n"
            "  {\"outcome\":\"accepted\",\"stream\":\"ORDERS\",\"seq\":12,\"duplicate\":false}\n"
            "The stream must exist, use file storage, acknowledge publications and capture\n"
            "SUBJECT (an exact subject). Nothing is retried automatically.\n\n"
            "Options:\n"
            "  --stream NAME          the stream to bind to (required)\n"
            "  --subject SUBJECT      exact subject (required)\n"
            "  --id ID                message id, 1..256 bytes, unchanged (required)\n"
            "  --header NAME:VALUE    an attribute, sent as header " JSD_ATTR_PREFIX "NAME\n"
            "                         (at most 16; name <= 64, value <= 256 bytes)\n"
            "  --deadline-ms N        bound on the stream lookup and on the publish and its\n"
            "                         acknowledgement, 1..300000 (default 5000)\n"
            "  --max-payload N        payload cap in bytes (default 256 KiB, at most the\n"
            "                         server's max_payload)\n"
            "  --payload-json         the payload must be one JSON value nested at most 8 deep\n"
            "                         (formerly spelt --json)\n"
            "  -j, --json             JSON output: accepted for every command's sake; the\n"
            "                         outcome is always one JSON line\n"
            "%s\n"
            "Exit codes (one per outcome):\n"
            "  0  accepted: stored, or a duplicate of a stored message (\"duplicate\":true)\n"
            "  1  failed: the broker proved nothing was stored (no stream, 4xx, e.g. 10060)\n"
            "  3  retryable: admission full, nothing was sent\n"
            "  65 rejected: invalid input or a limit crossed, nothing was sent\n"
            "  69 unavailable: no connection before the write, nothing was sent\n"
            "  75 unknown: the message may be stored; retry with the same --id within the\n"
            "     stream's duplicate window\n"
            "  77 denied: the server refused publish permission\n"
            "  64 usage; 78 binding refused (memory storage, no_ack, subject not captured,\n"
            "     missing stream); 70 internal error\n\n"
            "Example:\n"
            "  echo '{\"id\":42}' | jsdurable publish --nats nats://127.0.0.1:4222 \\\n"
            "      --stream ORDERS --subject orders.created --id order-42\n",
            CLI_CONN_HELP);
}

static int exit_for_outcome(jsd_outcome o)
{
    switch (o) {
    case JSD_OUTCOME_ACCEPTED:
        return CLI_OK;
    case JSD_OUTCOME_RETRYABLE:
        return PUB_EXIT_RETRYABLE;
    case JSD_OUTCOME_REJECTED:
        return CLI_DATAERR;
    case JSD_OUTCOME_UNAVAILABLE:
        return CLI_UNAVAILABLE;
    case JSD_OUTCOME_DENIED:
        return CLI_NOPERM;
    case JSD_OUTCOME_FAILED:
        return CLI_FAILED;
    case JSD_OUTCOME_UNKNOWN:
        return CLI_TEMPFAIL;
    default:
        return CLI_SOFTWARE;
    }
}

static void print_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s) {
        puts(s);
        free(s);
    } else {
        puts("{\"outcome\":\"unknown\",\"reason\":\"cannot format the result\"}");
    }
    fflush(stdout);
    json_decref(o);
}

static int print_outcome(const jsd_publish_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "outcome", json_string(jsd_outcome_str(r->outcome)));
    if (r->outcome == JSD_OUTCOME_ACCEPTED) {
        json_object_set_new(o, "stream", json_string(r->receipt.stream));
        json_object_set_new(o, "seq", json_integer((json_int_t)r->receipt.seq));
        json_object_set_new(o, "duplicate", json_boolean(r->receipt.duplicate));
        json_object_set_new(o, "accepted_at_ms", json_integer(r->receipt.accepted_at_ms));
    } else {
        json_object_set_new(o, "reason", json_string(r->reason));
        if (r->status_code)
            json_object_set_new(o, "code", json_integer(r->status_code));
        if (r->js_err_code)
            json_object_set_new(o, "err_code", json_integer(r->js_err_code));
    }
    print_json(o);
    return exit_for_outcome(r->outcome);
}

/* An outcome decided by the tool itself (before the publisher ran). */
static int print_local(jsd_outcome outcome, const char *reason)
{
    json_t *o = json_object();
    json_object_set_new(o, "outcome", json_string(jsd_outcome_str(outcome)));
    json_object_set_new(o, "reason", json_string(reason));
    print_json(o);
    return exit_for_outcome(outcome);
}

static int print_error(const char *what, const jsd_error *err, jsd_status s)
{
    json_t *o = json_object();
    json_object_set_new(o, "error", json_string(what));
    json_object_set_new(o, "status", json_string(jsd_status_name(s)));
    json_object_set_new(o, "reason", json_string(err->msg[0] ? err->msg : jsd_status_str(s)));
    print_json(o);
    cli_err("publish", "%s", err->msg[0] ? err->msg : jsd_status_str(s));
    return cli_exit_for(s);
}

int cmd_publish(int argc, char **argv)
{
    enum {
        OPT_STREAM = 1,
        OPT_SUBJECT,
        OPT_ID,
        OPT_HEADER,
        OPT_DEADLINE,
        OPT_MAXPAY,
        OPT_JSON,
        OPT_JSON_OUT
    };
    static const struct option longopts[] = {{"stream", required_argument, NULL, OPT_STREAM},
                                             {"subject", required_argument, NULL, OPT_SUBJECT},
                                             {"id", required_argument, NULL, OPT_ID},
                                             {"header", required_argument, NULL, OPT_HEADER},
                                             {"deadline-ms", required_argument, NULL, OPT_DEADLINE},
                                             {"max-payload", required_argument, NULL, OPT_MAXPAY},
                                             {"payload-json", no_argument, NULL, OPT_JSON},
                                             {"json", no_argument, NULL, OPT_JSON_OUT},
                                             {"help", no_argument, NULL, 'h'},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    cli_conn cc;
    jsd_publisher_opts po;
    const char *id = NULL;
    char *hname[JSD_ATTRS_MAX + 1] = {0}, *hvalue[JSD_ATTRS_MAX + 1] = {0};
    jsd_header attrs[JSD_ATTRS_MAX + 1];
    size_t n_attrs = 0;
    bool too_many = false;
    char *payload = NULL;
    size_t len = 0;
    jsd_conn *conn = NULL;
    jsd_publisher *pub = NULL;
    int rc = CLI_USAGE, opt;

    cli_conn_init(&cc);
    jsd_publisher_opts_init(&po);
    po.admission = 1;
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        long v;
        switch (opt) {
        case OPT_STREAM:
            po.stream = optarg;
            break;
        case OPT_SUBJECT:
            po.subject = optarg;
            break;
        case OPT_ID:
            id = optarg;
            break;
        case OPT_HEADER:
            if (n_attrs > JSD_ATTRS_MAX) {
                too_many = true;
                break;
            }
            if (!cli_split_header(optarg, &hname[n_attrs], &hvalue[n_attrs])) {
                cli_err("publish", "--header takes NAME:VALUE");
                goto done;
            }
            n_attrs++;
            break;
        case OPT_DEADLINE:
            if (!cli_parse_long(optarg, 1, JSD_DEADLINE_MAX_MS, &v)) {
                cli_err("publish", "--deadline-ms takes 1..%d", JSD_DEADLINE_MAX_MS);
                goto done;
            }
            po.deadline_ms = (int)v;
            break;
        case OPT_MAXPAY:
            if (!cli_parse_long(optarg, 1, LONG_MAX, &v)) {
                cli_err("publish", "--max-payload takes a positive number of bytes");
                goto done;
            }
            po.max_payload = (size_t)v;
            break;
        case OPT_JSON:
            po.json_payloads = true;
            break;
        case OPT_JSON_OUT: /* the outcome is printed as JSON anyway */
            break;
        case 'h':
            usage(stdout);
            rc = CLI_OK;
            goto done;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                int r = cli_conn_flag(&cc, opt, optarg);
                if (r) {
                    rc = r;
                    goto done;
                }
                break;
            }
            usage(stderr);
            goto done;
        }
    }
    if (optind < argc) {
        cli_err("publish", "unexpected argument \"%s\"", argv[optind]);
        goto done;
    }
    if (!po.stream || !po.subject || !id) {
        cli_err("publish", "--stream, --subject and --id are required (see --help)");
        goto done;
    }
    if ((rc = cli_conn_finish(&cc, "publish")) != 0)
        goto done;
    if (too_many) {
        char reason[96];
        snprintf(reason, sizeof(reason), "more than %d --header attributes; nothing was sent",
                 JSD_ATTRS_MAX);
        rc = print_local(JSD_OUTCOME_REJECTED, reason);
        goto done;
    }

    bool too_big = false;
    payload = cli_read_all(stdin, PUB_STDIN_MAX, &len, &too_big);
    if (!payload) {
        rc = print_local(JSD_OUTCOME_REJECTED, too_big ? "standard input is larger than 64 MiB; "
                                                         "nothing was sent"
                                                       : "cannot read standard input");
        goto done;
    }
    for (size_t i = 0; i < n_attrs; i++) {
        attrs[i].name = hname[i];
        attrs[i].value = hvalue[i];
    }

    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd_conn_open(&conn, &cc.opts, &err);
    if (s != JSD_OK) {
        if (s == JSD_ERR_CONNECT || s == JSD_ERR_TIMEOUT) {
            char reason[JSD_ERRMSG_MAX + 40];
            snprintf(reason, sizeof(reason), "%s; nothing was sent", err.msg);
            rc = print_local(JSD_OUTCOME_UNAVAILABLE, reason);
        } else {
            rc = print_error("connect", &err, s);
        }
        goto done;
    }
    s = jsd_publisher_bind(&pub, conn, &po, &err);
    if (s != JSD_OK) {
        if (s == JSD_ERR_INVALID) /* bad --stream/--subject: the input, not the stream */
            rc = print_local(JSD_OUTCOME_REJECTED, err.msg);
        else if (s == JSD_ERR_NOT_FOUND)
            rc = print_error("bind", &err, JSD_ERR_BIND);
        else
            rc = print_error("bind", &err, s);
        goto done;
    }
    jsd_publish_result res;
    jsd_publish(pub, id, payload, len, attrs, n_attrs, &res);
    rc = print_outcome(&res);

done:
    jsd_publisher_destroy(pub);
    jsd_conn_close(conn);
    for (size_t i = 0; i <= JSD_ATTRS_MAX; i++) {
        free(hname[i]);
        free(hvalue[i]);
    }
    free(payload);
    cli_conn_free(&cc);
    return rc;
}
