/*
 * jsdurable enqueue — commit outbox effects to a store from the shell.
 *
 * One effect: the payload comes from standard input, the effect is committed
 * in its own transaction, and one JSON line names it:
 *   {"owner":"order-42","id":"created","msg_id":"3f1c..."}
 * With --jsonl, standard input holds one JSON object per line and effects are
 * committed in transactions of up to --batch of them; each committed effect
 * prints its line. A bad line stops the run: every batch before it is
 * committed, the batch holding it is not, and the message names the line.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#define MAX_HEADERS JSD_HEADERS_MAX
#define PAYLOAD_MAX JSD_PAYLOAD_DEFAULT_CAP /* the store's and the relay's payload limit */

static void usage(FILE *f)
{
    fprintf(
        f, "usage: jsdurable enqueue --store URL --subject SUBJECT --id ID [--owner OWNER]\n"
           "                         [--header NAME:VALUE]... [--delay-ms N] [--order-key KEY]\n"
           "                         [--traceparent TP [--tracestate TS]] < PAYLOAD\n"
           "       jsdurable enqueue --store URL --jsonl [--batch N] < LINES\n\n"
           "Commit outbox effects to a store; a relay publishes them to JetStream with the\n"
           "Nats-Msg-Id printed here.\n\n"
           "  --store URL          sqlite:PATH, a file path, or postgres://... (or $JSD_STORE);\n"
           "                       ?namespace=NAME (or $JSD_STORE_NAMESPACE) sets the\n"
           "                       message-id namespace (default: the store id)\n"
           "  --subject SUBJECT    exact subject: [A-Za-z0-9_-] tokens separated by dots\n"
           "  --id ID              effect id, unique per owner (the identity is (owner, id))\n"
           "  --owner OWNER        owner id (default \"\")\n"
           "  --header NAME:VALUE  a message header (up to 16; names <= 64 bytes, values <= 256,\n"
           "                       3840 bytes together on the wire)\n"
           "  --delay-ms N         publish no earlier than N ms from now (a durable timer)\n"
           "  --order-key KEY      publish in commit order with other effects of KEY\n"
           "  --traceparent TP     W3C trace context, published as the traceparent header\n"
           "                       (00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>)\n"
           "  --tracestate TS      W3C tracestate to go with it (<= 512 bytes)\n"
           "  --jsonl              read one JSON object per line instead:\n"
           "                       {\"subject\":S, \"id\":I, \"owner\":O, \"headers\":{N:V,...},\n"
           "                        \"payload\":TEXT, \"delay_ms\":N, \"order_key\":K,\n"
           "                        \"traceparent\":TP, \"tracestate\":TS}\n"
           "  --batch N            effects per transaction with --jsonl (1..10000, default 256)\n\n"
           "Output: one JSON line per committed effect: {\"owner\",\"id\",\"msg_id\"}\n"
           "(-j/--json is accepted and changes nothing).\n"
           "Payloads are at most 256 KiB (262144 bytes), what the relay publishes; subjects\n"
           "starting with the reserved \"_INBOX\" token are refused.\n\n"
           "Exit codes: 0 committed; 65 bad input (over a limit, malformed line, an effect\n"
           "(owner, id) that already exists: nothing of its transaction committed);\n"
           "73 store cannot be opened; 74 store read-only or full; 78 store schema too new.\n\n"
           "Examples:\n"
           "  echo '{\"order\":42}' | jsdurable enqueue --store sqlite:app.db \\\n"
           "      --subject orders.created --owner order-42 --id created\n"
           "  printf '%%s\\n' '{\"subject\":\"orders.created\",\"id\":\"a\",\"payload\":\"x\"}' |\n"
           "      JSD_STORE=sqlite:app.db jsdurable enqueue --jsonl --batch 500\n");
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int exit_for(jsd_status s)
{
    return s == JSD_ERR_EXISTS ? CLI_DATAERR : cli_exit_for(s);
}

static void print_effect(jsd_store *store, const char *owner, const char *id)
{
    char mid[JSD_MSG_ID_MAX];
    if (jsd_effect_msg_id(jsd_store_namespace(store), owner, id, mid) != JSD_OK)
        mid[0] = '\0'; /* committed: the line still names the effect */
    json_t *o = json_pack("{s:s, s:s, s:s}", "owner", owner, "id", id, "msg_id", mid);
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (line)
        printf("%s\n", line);
    free(line);
    json_decref(o);
}

static jsd_status open_store(const char *url, jsd_store **out)
{
    jsd_error err;
    jsd_status s = jsd_store_open(out, url, &err);
    if (s != JSD_OK)
        cli_err("enqueue", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
    return s;
}

static int enqueue_one(const char *url, jsd_effect *e)
{
    size_t len = 0;
    bool too_big = false;
    char *payload = cli_read_all(stdin, PAYLOAD_MAX, &len, &too_big);
    if (!payload) {
        if (too_big)
            cli_err("enqueue",
                    "payload on standard input is over %d bytes, the payload limit (the "
                    "largest payload the relay publishes)",
                    PAYLOAD_MAX);
        else
            cli_err("enqueue", "cannot read the payload from standard input");
        return too_big ? CLI_DATAERR : CLI_IOERR;
    }
    e->payload = payload;
    e->len = len;
    jsd_store *store = NULL;
    jsd_tx *tx = NULL;
    int rc = CLI_OK;
    jsd_status s = open_store(url, &store);
    if (s != JSD_OK) {
        rc = cli_exit_for(s);
        goto done;
    }
    if ((s = jsd_tx_begin(&tx, store)) != JSD_OK || (s = jsd_tx_emit(tx, e)) != JSD_OK ||
        (s = jsd_tx_commit(tx)) != JSD_OK) {
        cli_err("enqueue", "%s; nothing was committed", jsd_store_errmsg(store));
        if (tx && s != JSD_OK)
            jsd_tx_rollback(tx);
        rc = exit_for(s);
        goto done;
    }
    print_effect(store, e->owner ? e->owner : "", e->id);
done:
    jsd_store_close(store);
    free(payload);
    return rc;
}

/* ---- --jsonl ----------------------------------------------------------------------------- */

typedef struct line_effect {
    json_t *obj; /* owns the strings the effect points to */
    jsd_effect e;
    jsd_header h[MAX_HEADERS];
    long lineno;
} line_effect;

/* Parse one line into le; false with a message in why. */
static bool parse_line(const char *text, long lineno, line_effect *le, char *why, size_t cap)
{
    json_error_t jerr;
    memset(le, 0, sizeof(*le));
    le->lineno = lineno;
    le->obj = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!le->obj) {
        snprintf(why, cap, "not valid JSON: %s", jerr.text);
        return false;
    }
    if (!json_is_object(le->obj)) {
        snprintf(why, cap, "a line must be a JSON object");
        return false;
    }
    const char *key;
    json_t *v;
    json_object_foreach(le->obj, key, v)
    {
        if (!strcmp(key, "subject") || !strcmp(key, "id") || !strcmp(key, "owner") ||
            !strcmp(key, "order_key") || !strcmp(key, "payload") || !strcmp(key, "traceparent") ||
            !strcmp(key, "tracestate")) {
            if (!json_is_string(v)) {
                snprintf(why, cap, "\"%s\" must be a string", key);
                return false;
            }
        } else if (!strcmp(key, "delay_ms")) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > 100LL * 365 * 86400000) {
                snprintf(why, cap, "\"delay_ms\" must be a non-negative integer of ms");
                return false;
            }
            le->e.not_before_ms = wall_ms() + (int64_t)json_integer_value(v);
        } else if (!strcmp(key, "headers")) {
            if (!json_is_object(v)) {
                snprintf(why, cap, "\"headers\" must be an object of name: string value");
                return false;
            }
            const char *hn;
            json_t *hv;
            json_object_foreach(v, hn, hv)
            {
                if (!json_is_string(hv)) {
                    snprintf(why, cap, "header \"%.64s\" must have a string value", hn);
                    return false;
                }
                if (le->e.n_headers == MAX_HEADERS) {
                    snprintf(why, cap, "more than %d headers", MAX_HEADERS);
                    return false;
                }
                le->h[le->e.n_headers].name = hn;
                le->h[le->e.n_headers].value = json_string_value(hv);
                le->e.n_headers++;
            }
            le->e.headers = le->h;
        } else {
            snprintf(why, cap,
                     "unknown key \"%.64s\" (subject, id, owner, headers, payload, "
                     "delay_ms, order_key, traceparent, tracestate)",
                     key);
            return false;
        }
    }
    json_t *p = json_object_get(le->obj, "payload");
    le->e.subject = json_string_value(json_object_get(le->obj, "subject"));
    le->e.id = json_string_value(json_object_get(le->obj, "id"));
    le->e.owner = json_string_value(json_object_get(le->obj, "owner"));
    le->e.order_key = json_string_value(json_object_get(le->obj, "order_key"));
    le->e.traceparent = json_string_value(json_object_get(le->obj, "traceparent"));
    le->e.tracestate = json_string_value(json_object_get(le->obj, "tracestate"));
    if (p) {
        le->e.payload = json_string_value(p);
        le->e.len = json_string_length(p);
    }
    if (!le->e.subject || !le->e.id) {
        snprintf(why, cap, "\"subject\" and \"id\" are required");
        return false;
    }
    return true;
}

static void free_batch(line_effect *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_decref(b[i].obj);
}

/* Commit one batch; on failure report the offending line. */
static jsd_status commit_batch(jsd_store *store, line_effect *b, size_t n, jsd_effect *arr)
{
    jsd_tx *tx = NULL;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        arr[i] = b[i].e;
    jsd_status s = jsd_tx_begin(&tx, store);
    if (s == JSD_OK && (s = jsd_tx_emit_batch(tx, arr, n, &bad)) != JSD_OK) {
        cli_err("enqueue", "line %ld: %s", b[bad < n ? bad : 0].lineno, jsd_store_errmsg(store));
        jsd_tx_rollback(tx);
        return s;
    }
    if (s == JSD_OK)
        s = jsd_tx_commit(tx);
    if (s != JSD_OK)
        cli_err("enqueue", "lines %ld..%ld: %s", b[0].lineno, b[n - 1].lineno,
                jsd_store_errmsg(store));
    return s;
}

static int enqueue_jsonl(const char *url, long batch)
{
    jsd_store *store = NULL;
    jsd_status s = open_store(url, &store);
    if (s != JSD_OK)
        return cli_exit_for(s);
    line_effect *b = calloc((size_t)batch, sizeof(*b));
    jsd_effect *arr = calloc((size_t)batch, sizeof(*arr));
    char *line = NULL;
    size_t cap = 0, n = 0;
    long lineno = 0, committed = 0, first_pending = 1;
    int rc = CLI_OK;
    if (!b || !arr) {
        cli_err("enqueue", "out of memory");
        rc = CLI_SOFTWARE;
        goto done;
    }
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) != -1) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if ((size_t)got > 2 * PAYLOAD_MAX + 65536) {
            cli_err("enqueue", "line %ld is over the line limit", lineno);
            rc = CLI_DATAERR;
            break;
        }
        char why[256];
        if (!parse_line(line, lineno, &b[n], why, sizeof(why))) {
            json_decref(b[n].obj);
            cli_err("enqueue", "line %ld: %s", lineno, why);
            rc = CLI_DATAERR;
            break;
        }
        if (n == 0)
            first_pending = lineno;
        if (++n == (size_t)batch) {
            if ((s = commit_batch(store, b, n, arr)) != JSD_OK) {
                rc = exit_for(s);
                break;
            }
            for (size_t i = 0; i < n; i++)
                print_effect(store, b[i].e.owner ? b[i].e.owner : "", b[i].e.id);
            committed += (long)n;
            free_batch(b, n);
            n = 0;
            if (committed % 10000 < (long)batch)
                cli_say("enqueue", "info", "%ld effects committed", committed);
        }
    }
    if (rc == CLI_OK && ferror(stdin)) {
        cli_err("enqueue", "cannot read standard input");
        rc = CLI_IOERR;
    }
    if (rc == CLI_OK && n > 0) {
        if ((s = commit_batch(store, b, n, arr)) != JSD_OK) {
            rc = exit_for(s);
        } else {
            for (size_t i = 0; i < n; i++)
                print_effect(store, b[i].e.owner ? b[i].e.owner : "", b[i].e.id);
            committed += (long)n;
        }
    }
    if (rc != CLI_OK)
        cli_err("enqueue", "%ld effects committed before the failure; lines from %ld on were not",
                committed, n ? first_pending : lineno);
    else
        cli_say("enqueue", "info", "%ld effects committed", committed);
    free_batch(b, n);
done:
    free(line);
    free(b);
    free(arr);
    jsd_store_close(store);
    return rc;
}

int cmd_enqueue(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"subject", required_argument, NULL, 'S'},
                                             {"id", required_argument, NULL, 'i'},
                                             {"owner", required_argument, NULL, 'o'},
                                             {"header", required_argument, NULL, 'H'},
                                             {"delay-ms", required_argument, NULL, 'd'},
                                             {"order-key", required_argument, NULL, 'k'},
                                             {"traceparent", required_argument, NULL, 'T'},
                                             {"tracestate", required_argument, NULL, 'U'},
                                             {"jsonl", no_argument, NULL, 'j'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    jsd_effect e;
    jsd_header h[MAX_HEADERS];
    char *hname[MAX_HEADERS + 1] = {0}, *hvalue[MAX_HEADERS + 1] = {0};
    size_t nh = 0;
    bool jsonl = false;
    long batch = 256, v;
    int rc = CLI_OK, opt;
    memset(&e, 0, sizeof(e));
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'S':
            e.subject = optarg;
            break;
        case 'i':
            e.id = optarg;
            break;
        case 'o':
            e.owner = optarg;
            break;
        case 'k':
            e.order_key = optarg;
            break;
        case 'T':
            e.traceparent = optarg;
            break;
        case 'U':
            e.tracestate = optarg;
            break;
        case 'H':
            if (nh == MAX_HEADERS) {
                cli_err("enqueue", "more than %d --header flags", MAX_HEADERS);
                rc = CLI_DATAERR;
                goto done;
            }
            if (!cli_split_header(optarg, &hname[nh], &hvalue[nh])) {
                cli_err("enqueue", "--header takes NAME:VALUE, not \"%s\"", optarg);
                rc = CLI_USAGE;
                goto done;
            }
            h[nh].name = hname[nh];
            h[nh].value = hvalue[nh];
            nh++;
            break;
        case 'd':
            if (!cli_parse_long(optarg, 0, 100L * 365 * 86400000, &v)) {
                cli_err("enqueue", "--delay-ms takes a non-negative number of milliseconds");
                rc = CLI_USAGE;
                goto done;
            }
            e.not_before_ms = wall_ms() + v;
            break;
        case 'j':
            jsonl = true;
            break;
        case 'b':
            if (!cli_parse_long(optarg, 1, 10000, &batch)) {
                cli_err("enqueue", "--batch takes 1..10000");
                rc = CLI_USAGE;
                goto done;
            }
            break;
        case 'h':
            usage(stdout);
            goto done;
        default:
            usage(stderr);
            rc = CLI_USAGE;
            goto done;
        }
    }
    if (optind < argc) {
        cli_err("enqueue", "unexpected argument \"%s\"", argv[optind]);
        rc = CLI_USAGE;
        goto done;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("enqueue", "--store URL (or $JSD_STORE) is required");
        rc = CLI_USAGE;
        goto done;
    }
    if (jsonl) {
        if (e.subject || e.id || e.owner || nh || e.order_key || e.not_before_ms || e.traceparent ||
            e.tracestate) {
            cli_err("enqueue", "--jsonl takes every field from the lines; drop the other flags");
            rc = CLI_USAGE;
            goto done;
        }
        rc = enqueue_jsonl(url, batch);
        goto done;
    }
    if (!e.subject || !e.id) {
        cli_err("enqueue", "--subject and --id are required (or --jsonl)");
        rc = CLI_USAGE;
        goto done;
    }
    e.headers = nh ? h : NULL;
    e.n_headers = nh;
    rc = enqueue_one(url, &e);
done:
    for (size_t i = 0; i < nh; i++) {
        free(hname[i]);
        free(hvalue[i]);
    }
    return rc;
}
