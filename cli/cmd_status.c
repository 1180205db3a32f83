/*
 * jsdurable status — the store's counts for operators and scripts: outbox
 * backlog (and how much of it is due, and how long the oldest effect past its
 * not_before has waited, retries included), published and dead-lettered
 * effects, inbox rows, poison records, replay requests not yet applied
 * (pending, and failed with their reasons).
 *
 * Text by default, one JSON object with --json. With a NATS server (--nats or
 * $JSD_NATS_URL) it adds the NATS side: each stream's depth, its durable
 * consumers' lag and ack pending, and the dead-letter depth. Either side may
 * be shown alone.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable status [--store URL] [--nats URL] [--stream NAME]... [--json]\n\n"
            "Show the store's counts and, with a NATS server, the streams and consumers.\n\n"
            "  --store URL     sqlite:PATH, a file path, or postgres://... (or $JSD_STORE)\n"
            "  -s, --nats URL  also show the NATS side (or $JSD_NATS_URL, $NATS_URL, --context)\n"
            "  --stream NAME   only this stream (repeatable; default: every stream)\n"
            "  --json          one JSON object instead of text\n\n"
            "Counts: backlog (unpublished, not dead-lettered effects), due (of those, due\n"
            "now), oldest_due_age_ms (how long the oldest effect past its not_before has\n"
            "waited, retries included), published\n"
            "(effects with a receipt, until gc removes them), dead_lettered (attempt budget\n"
            "spent or permanent failure), inbox_rows, poison_records, poison_unpublished (of\n"
            "those, not yet published to the dead-letter stream), replay_pending and\n"
            "replay_failed (`jsdurable dlq replay --store` requests their durable has not\n"
            "applied yet, or whose handler failed again; the first ones are listed with\n"
            "their reasons). Relay: failing\n"
            "(unpublished effects that failed at least once), first_attempt_duplicates\n"
            "(dead-lettered: the stream already held another producer's message with\n"
            "their id), dead_reasons (the five most frequent dead-letter reasons with\n"
            "their counts; `jsdurable outbox` lists and requeues them).\n\n"
            "NATS side: per stream its messages, bytes and sequences (a stream under\n"
            "jsd.dlq. is marked dead-letter: its messages are the dead-letter depth), per\n"
            "durable its pending (lag), ack_pending and redelivered counts.\n\n"
            "Exit codes: 0 shown; 64 usage; 69 NATS unreachable; 73 store cannot be opened;\n"
            "78 store schema too new; 1 a named stream does not exist.\n\n"
            "%s\n"
            "Example:\n"
            "  jsdurable status --store sqlite:app.db --nats nats://127.0.0.1:4222 --json\n",
            CLI_CONN_HELP);
}

static const char *backend_name(jsd_store *s)
{
    return jsd_store_backend_of(s) == JSD_STORE_POSTGRES ? "postgres" : "sqlite";
}

/* The NATS side as JSON: {"streams":[{...,"durables":[...]}], "dead_letters": N}. */
static json_t *nats_json(const jsd_stream_state *st, size_t n)
{
    json_t *streams = json_array();
    json_int_t dead = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *durables = json_array();
        for (size_t k = 0; k < st[i].n_durables; k++) {
            const jsd_durable_state *d = &st[i].durables[k];
            json_array_append_new(durables,
                                  json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "name", d->name,
                                            "pending", (json_int_t)d->pending, "ack_pending",
                                            (json_int_t)d->ack_pending, "redelivered",
                                            (json_int_t)d->redelivered, "delivered_seq",
                                            (json_int_t)d->delivered_seq, "ack_floor_seq",
                                            (json_int_t)d->ack_floor_seq));
            json_t *dj = json_array_get(durables, json_array_size(durables) - 1);
            json_object_set_new(dj, "ahead_of_stream", json_boolean(d->ahead));
            if (d->inbox_high || d->inbox_behind_from) {
                json_object_set_new(dj, "inbox_high", json_integer((json_int_t)d->inbox_high));
                json_object_set_new(dj, "inbox_behind_from",
                                    d->inbox_behind_from
                                        ? json_integer((json_int_t)d->inbox_behind_from)
                                        : json_null());
            }
        }
        if (st[i].dead_letter)
            dead += (json_int_t)st[i].messages;
        json_array_append_new(
            streams,
            json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:b, s:I, s:i, s:s, s:o}", "name", st[i].name,
                      "subjects", st[i].subjects, "messages", (json_int_t)st[i].messages, "bytes",
                      (json_int_t)st[i].bytes, "first_seq", (json_int_t)st[i].first_seq, "last_seq",
                      (json_int_t)st[i].last_seq, "dead_letter", st[i].dead_letter,
                      "duplicate_window_ms", (json_int_t)st[i].duplicate_window_ms, "replicas",
                      st[i].replicas, "leader", st[i].leader, "durables", durables));
    }
    return json_pack("{s:o, s:I}", "streams", streams, "dead_letters", dead);
}

static void nats_text(const jsd_stream_state *st, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        printf("stream %-10s %llu messages, %llu bytes, seq %llu..%llu%s%s%s\n", st[i].name,
               (unsigned long long)st[i].messages, (unsigned long long)st[i].bytes,
               (unsigned long long)st[i].first_seq, (unsigned long long)st[i].last_seq,
               st[i].dead_letter ? " (dead letters)" : "", st[i].leader[0] ? ", leader " : "",
               st[i].leader);
        for (size_t k = 0; k < st[i].n_durables; k++) {
            const jsd_durable_state *d = &st[i].durables[k];
            printf("  durable %-10s lag %llu, ack pending %lld, redelivered %lld\n", d->name,
                   (unsigned long long)d->pending, (long long)d->ack_pending,
                   (long long)d->redelivered);
            if (d->ahead)
                printf("    AHEAD OF ITS STREAM: ack floor %llu, delivered %llu, the stream ends "
                       "at %llu (the server lost its tail; `jsdurable consume --topology FILE` "
                       "re-creates the durable)\n",
                       (unsigned long long)d->ack_floor_seq, (unsigned long long)d->delivered_seq,
                       (unsigned long long)st[i].last_seq);
            if (d->inbox_behind_from)
                printf("    INBOX BEHIND: the inbox holds up to %llu, the durable acknowledged up "
                       "to %llu, sequence %llu in between is not in the store (restored from an "
                       "older backup?); `jsdurable consume --redeliver-from-inbox` applies it "
                       "again\n",
                       (unsigned long long)d->inbox_high, (unsigned long long)d->ack_floor_seq,
                       (unsigned long long)d->inbox_behind_from);
        }
    }
}

/* Collect the states of the named streams, or of all. */
/* With the store: each durable's inbox against its ack floor. */
static void inbox_positions(jsd_conn *conn, jsd_store *store, jsd_stream_state *st, size_t n)
{
    for (size_t i = 0; store && i < n; i++) {
        if (st[i].dead_letter)
            continue;
        for (size_t k = 0; k < st[i].n_durables; k++) {
            jsd_durable_state *d = &st[i].durables[k];
            jsd_durable_position p;
            jsd_error e;
            if (jsd_durable_position_get(conn, store, st[i].name, d->name, &p, &e) != JSD_OK)
                continue;
            d->inbox_high = p.inbox_high;
            d->inbox_behind_from = p.behind_from;
        }
    }
}

static int nats_states(cli_conn *cc, jsd_store *store, const char **names, size_t n_names,
                       jsd_stream_state **out, size_t *n)
{
    jsd_conn *conn = NULL;
    int rc = cli_conn_open(cc, &conn);
    if (rc != 0)
        return rc;
    jsd_error err;
    jsd_status st = JSD_OK;
    if (n_names == 0) {
        st = jsd_stream_states_list(conn, out, n, &err);
    } else {
        *out = calloc(n_names, sizeof(**out));
        *n = 0;
        if (!*out)
            st = JSD_ERR_NOMEM;
        for (size_t i = 0; st == JSD_OK && i < n_names; i++) {
            st = jsd_stream_state_get(conn, names[i], &(*out)[i], &err);
            if (st == JSD_OK)
                (*n)++;
        }
        if (st != JSD_OK) {
            for (size_t i = 0; i < *n; i++)
                jsd_stream_state_clear(&(*out)[i]);
            free(*out);
            *out = NULL;
            *n = 0;
        }
    }
    if (st == JSD_OK)
        inbox_positions(conn, store, *out, *n);
    jsd_conn_close(conn);
    if (st != JSD_OK) {
        cli_err("status", "%s", st == JSD_ERR_NOMEM ? "out of memory" : err.msg);
        return st == JSD_ERR_NOT_FOUND ? CLI_FAILED : cli_exit_for(st);
    }
    return 0;
}

int cmd_status(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"stream", required_argument, NULL, 'S'},
                                             {"help", no_argument, NULL, 'h'},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    const char *streams[64];
    size_t n_streams = 0;
    bool json = false;
    int opt, rc = CLI_OK;
    cli_conn cc;
    cli_conn_init(&cc);
    cc.opts.startup_budget_ms = 2000;
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'S':
            if (n_streams == sizeof(streams) / sizeof(streams[0])) {
                cli_err("status", "at most 64 --stream flags");
                return CLI_USAGE;
            }
            streams[n_streams++] = optarg;
            break;
        case 'h':
            usage(stdout);
            cli_conn_free(&cc);
            return CLI_OK;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0) {
                    cli_conn_free(&cc);
                    return rc;
                }
                break;
            }
            usage(stderr);
            cli_conn_free(&cc);
            return CLI_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("status", "unexpected argument \"%s\"", argv[optind]);
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    bool want_nats = cli_conn_wanted(&cc) || n_streams > 0;
    if (!url && !want_nats) {
        cli_err("status", "give --store URL (or $JSD_STORE), -s/--nats URL (or $JSD_NATS_URL, "
                          "$NATS_URL, a --context), or both");
        cli_conn_free(&cc);
        return CLI_USAGE;
    }

    jsd_stream_state *states = NULL;
    size_t n_states = 0;
    jsd_store *s = NULL;
    jsd_store_stats x;
    jsd_outbox_trouble trouble;
    jsd_outbox_reason reasons[5];
    size_t n_reasons = 0;
    static jsd_replay_request replays[10];
    size_t n_replays = 0;
    if (url && (rc = cli_store_open("status", url, &s)) != 0) {
        cli_conn_free(&cc);
        return rc;
    }
    if (want_nats) {
        if ((rc = cli_conn_finish(&cc, "status")) != 0 ||
            (rc = nats_states(&cc, s, streams, n_streams, &states, &n_states)) != 0) {
            cli_conn_free(&cc);
            jsd_store_close(s);
            return rc;
        }
    }
    cli_conn_free(&cc);
    if (url) {
        jsd_status st;
        if ((st = jsd_store_stats_get(s, &x)) != JSD_OK ||
            (st = jsd_outbox_trouble_get(s, &trouble)) != JSD_OK ||
            (st = jsd_outbox_dead_reasons(s, reasons, 5, &n_reasons)) != JSD_OK ||
            (x.replay_pending + x.replay_failed > 0 &&
             (st = jsd_dlq_replay_list(s, 0, replays, 10, &n_replays, NULL)) != JSD_OK)) {
            cli_err("status", "%s", jsd_store_errmsg(s));
            jsd_store_close(s);
            jsd_stream_states_free(states, n_states);
            return cli_exit_for(st);
        }
    }
    if (json) {
        json_t *root = json_object();
        if (s)
            json_object_set_new(root, "relay",
                                json_pack("{s:I, s:I}", "failing", (json_int_t)trouble.failing,
                                          "first_attempt_duplicates",
                                          (json_int_t)trouble.first_attempt_duplicates));
        if (s) {
            json_t *top = json_array();
            for (size_t i = 0; i < n_reasons; i++)
                json_array_append_new(top, json_pack("{s:s, s:I}", "reason", reasons[i].reason,
                                                     "count", (json_int_t)reasons[i].count));
            json_object_set_new(json_object_get(root, "relay"), "dead_reasons", top);
        }
        if (s)
            json_object_set_new(
                root, "store",
                json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "url", jsd_store_url(s),
                          "backend", backend_name(s), "backlog", (json_int_t)x.backlog, "due",
                          (json_int_t)x.due, "oldest_due_age_ms", (json_int_t)x.oldest_due_age_ms,
                          "published", (json_int_t)x.published, "dead_lettered",
                          (json_int_t)x.dead_lettered, "inbox_rows", (json_int_t)x.inbox_rows,
                          "poison_records", (json_int_t)x.poison_records));
        if (s) {
            json_t *so = json_object_get(root, "store");
            json_object_set_new(so, "poison_unpublished",
                                json_integer((json_int_t)x.poison_unpublished));
            json_object_set_new(so, "replay_pending", json_integer((json_int_t)x.replay_pending));
            json_object_set_new(so, "replay_failed", json_integer((json_int_t)x.replay_failed));
            json_t *rl = json_array();
            for (size_t i = 0; i < n_replays; i++)
                json_array_append_new(
                    rl, json_pack("{s:s, s:s, s:I, s:s, s:I, s:s, s:s}", "stream",
                                  replays[i].stream, "durable", replays[i].consumer, "stream_seq",
                                  (json_int_t)replays[i].stream_seq, "dlq_stream",
                                  replays[i].dlq_stream, "dlq_seq", (json_int_t)replays[i].dlq_seq,
                                  "state", jsd_replay_state_name(replays[i].state), "detail",
                                  replays[i].detail));
            json_object_set_new(so, "replays", rl);
        }
        if (want_nats)
            json_object_set_new(root, "nats", nats_json(states, n_states));
        char *text = json_dumps(root, JSON_COMPACT);
        if (text)
            printf("%s\n", text);
        else
            rc = CLI_SOFTWARE;
        free(text);
        json_decref(root);
    } else {
        if (s) {
            printf("store            %s (%s)\n", jsd_store_url(s), backend_name(s));
            printf("outbox backlog   %lld (due %lld, oldest waited %lld ms)\n",
                   (long long)x.backlog, (long long)x.due, (long long)x.oldest_due_age_ms);
            printf("published        %lld\n", (long long)x.published);
            printf("dead-lettered    %lld (first-attempt duplicates %lld)\n",
                   (long long)x.dead_lettered, (long long)trouble.first_attempt_duplicates);
            for (size_t i = 0; i < n_reasons; i++) {
                printf("  %6lld x ", (long long)reasons[i].count);
                for (const char *c = reasons[i].reason; *c; c++)
                    putchar((unsigned char)*c < 0x20 ? ' ' : *c);
                putchar('\n');
            }
            if (n_reasons)
                printf("  (jsdurable outbox list --dead; requeue with jsdurable outbox requeue)\n");
            printf("failing          %lld (unpublished, failed at least once)\n",
                   (long long)trouble.failing);
            printf("inbox rows       %lld\n", (long long)x.inbox_rows);
            printf("poison records   %lld\n", (long long)x.poison_records);
            printf("  unpublished    %lld%s\n", (long long)x.poison_unpublished,
                   x.poison_unpublished ? " (not in the dead-letter stream yet: a consumer on "
                                          "their durable republishes them)"
                                        : "");
            printf("replays pending  %lld%s\n", (long long)x.replay_pending,
                   x.replay_pending ? " (applied by their durable's next consume)" : "");
            printf("replays failed   %lld%s\n", (long long)x.replay_failed,
                   x.replay_failed ? " (the handler failed again; `jsdurable dlq replay --store` "
                                     "asks again)"
                                   : "");
            for (size_t i = 0; i < n_replays; i++) {
                printf("  %-7s %s:%llu -> %s (%s:%llu)%s", jsd_replay_state_name(replays[i].state),
                       replays[i].dlq_stream, (unsigned long long)replays[i].dlq_seq,
                       replays[i].consumer, replays[i].stream,
                       (unsigned long long)replays[i].stream_seq, replays[i].detail[0] ? ": " : "");
                for (const char *c = replays[i].detail; *c; c++)
                    putchar((unsigned char)*c < 0x20 ? ' ' : *c);
                putchar('\n');
            }
        }
        if (want_nats)
            nats_text(states, n_states);
    }
    jsd_store_close(s);
    jsd_stream_states_free(states, n_states);
    return rc;
}
