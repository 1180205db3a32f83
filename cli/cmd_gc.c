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
 * records are evidence and are never removed.
 *
 * DESIGN: age alone does not make an inbox row safe to remove. A delivery
 * committed and never acknowledged (the consumer died between COMMIT and
 * ACK) is redelivered whenever a consumer next pulls, however long that
 * takes; its row is what answers the redelivery. So an inbox row goes only
 * when it is older than the horizon and at or below its durable's ack floor
 * as the server reports it (ack_floor.stream_seq): everything there is
 * acknowledged and is never delivered again. The floor is read before the
 * rows are deleted; a floor that moves up meanwhile only keeps more. It is
 * recorded in the store (jsd_store_durable_floor_record) before any row
 * under it goes, so a durable lost and re-created later resumes after it,
 * never where the rows that would answer its redeliveries are gone; a
 * durable ahead of its stream (the server lost the stream's tail) keeps
 * its rows, its floor counting sequences the stream no longer has. Rows of
 * a durable the server does not have are kept until the operator drops them
 * with --durable NAME; when the server cannot be asked, every inbox row is
 * kept. Each kept row is counted and said why. With -j/--json the result is
 * one JSON document on stdout.
 */
#include <stdint.h>
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
        "                    [--min-horizon DURATION] [--durable NAME]\n\n"
        "Remove published outbox effects and inbox rows older than DURATION, at most\n"
        "N of each per transaction. Durations: 250ms, 30s, 5m, 2h, 7d.\n\n"
        "  --store URL              sqlite:PATH, a file path, or postgres://... ($JSD_STORE)\n"
        "  --older-than DURATION    the horizon (required)\n"
        "  --batch N                rows per transaction, 1..100000 (default 1000)\n"
        "  --nats URL               read every stream's duplicate window and every\n"
        "                           durable's ack floor from the server (or\n"
        "                           $JSD_NATS_URL); a horizon under the longest window\n"
        "                           is refused\n"
        "  --dedup-window DURATION  without a server: the longest duplicate window of\n"
        "                           your streams, as you know it; a shorter horizon is\n"
        "                           refused (with --nats, the larger of the two counts)\n"
        "  --min-horizon DURATION   refuse any horizon shorter than this too (e.g. the\n"
        "                           longest redelivery time of your consumers)\n"
        "  --durable NAME           only the inbox rows of durable NAME (no effects): for\n"
        "                           a durable deleted on the server, its rows older than\n"
        "                           DURATION go; for one that exists, its ack floor holds\n"
        "  -j, --json               one JSON document: {\"ok\",\"removed\",\"removed_effects\",\n"
        "                           \"removed_inbox\",\"kept_inbox\":{\"above_ack_floor\",\n"
        "                           \"durable_missing\",\"server_unreachable\"},\"horizon_ms\",\n"
        "                           \"duplicate_window_ms\",\"window_from\",\"min_horizon_ms\",\n"
        "                           \"store\"[,\"durable\"][,\"error\"]}\n\n"
        "One of --nats or --dedup-window is required: gc does not guess the window.\n"
        "Inbox rows are removed only at or below their durable's ack floor, read from\n"
        "the server: a delivery committed but never acknowledged keeps its row however\n"
        "old, so a consumer down longer than DURATION still finds it. Rows of a durable\n"
        "the server does not have are kept until --durable NAME drops them; without a\n"
        "server (no --nats, or it cannot be reached and --dedup-window is given) every\n"
        "inbox row is kept. Kept rows are counted and reported at warn level.\n"
        "Dead-lettered effects and poison records are kept.\n\n"
        "Exit codes: 0 done; 78 horizon refused or window unknown (nothing removed);\n"
        "69 NATS unreachable and no --dedup-window; 73 store cannot be opened; 74 store\n"
        "read-only or full.\n\n"
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

/* One run: the flags, what the server said, and the figures reported. */
typedef struct gc_run {
    bool json;
    int64_t older, window, floor_ms;
    char from[160];
    const char *durable; /* --durable NAME, or NULL */
    /* the server's streams and their durables; asked false: none read */
    jsd_stream_state *st;
    size_t n_st;
    bool asked;
    int64_t removed_effects, removed_inbox;
    int64_t kept_floor, kept_missing, kept_unasked;
} gc_run;

/* The account's streams with their durables; the longest duplicate window
 * into r->window when it is larger, r->from naming the stream. 0, or the exit
 * code after an error line (err_out: its text). */
static int server_state(cli_conn *cc, gc_run *r, char *err_out, size_t cap)
{
    jsd_conn *conn = NULL;
    int rc = cli_conn_open(cc, &conn);
    if (rc != 0) {
        snprintf(err_out, cap, "NATS could not be reached");
        return rc;
    }
    jsd_error err;
    jsd_error_clear(&err);
    jsd_status s = jsd_stream_states_list(conn, &r->st, &r->n_st, &err);
    jsd_conn_close(conn);
    if (s != JSD_OK) {
        snprintf(err_out, cap, "reading the streams and their durables: %s",
                 err.msg[0] ? err.msg : jsd_status_str(s));
        cli_err("gc", "%s", err_out);
        return cli_exit_for(s);
    }
    r->asked = true;
    if (r->window < 0) {
        r->window = 0;
        snprintf(r->from, sizeof(r->from), "no stream on the server");
    }
    for (size_t i = 0; i < r->n_st; i++) {
        if (r->st[i].duplicate_window_ms > r->window) {
            r->window = r->st[i].duplicate_window_ms;
            snprintf(r->from, sizeof(r->from), "stream %s", r->st[i].name);
        }
    }
    return 0;
}

/* The server's durable (stream, name), or NULL when it has none. */
static const jsd_durable_state *find_durable(const gc_run *r, const char *stream, const char *name)
{
    for (size_t i = 0; i < r->n_st; i++) {
        if (strcmp(r->st[i].name, stream) != 0)
            continue;
        for (size_t j = 0; j < r->st[i].n_durables; j++)
            if (!strcmp(r->st[i].durables[j].name, name))
                return &r->st[i].durables[j];
    }
    return NULL;
}

/* -j/--json: the one document, printed at every exit after the flags. */
static int gc_done(const gc_run *r, int rc, const char *url, const char *error)
{
    if (!r->json)
        return rc;
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_boolean(rc == CLI_OK));
    json_object_set_new(o, "removed", json_integer(r->removed_effects + r->removed_inbox));
    json_object_set_new(o, "removed_effects", json_integer(r->removed_effects));
    json_object_set_new(o, "removed_inbox", json_integer(r->removed_inbox));
    json_t *kept = json_object();
    json_object_set_new(kept, "above_ack_floor", json_integer(r->kept_floor));
    json_object_set_new(kept, "durable_missing", json_integer(r->kept_missing));
    json_object_set_new(kept, "server_unreachable", json_integer(r->kept_unasked));
    json_object_set_new(o, "kept_inbox", kept);
    json_object_set_new(o, "horizon_ms", json_integer(r->older));
    json_object_set_new(o, "duplicate_window_ms",
                        r->window >= 0 ? json_integer(r->window) : json_null());
    json_object_set_new(o, "window_from", r->window >= 0 ? cli_json_str(r->from) : json_null());
    json_object_set_new(o, "min_horizon_ms", json_integer(r->floor_ms));
    if (r->durable)
        json_object_set_new(o, "durable", cli_json_str(r->durable));
    if (url) /* only an open store's redacted URL: the given one may hold a password */
        json_object_set_new(o, "store", cli_json_str(url));
    if (error)
        json_object_set_new(o, "error", cli_json_str(error));
    cli_json_print(o);
    return rc;
}

/* Published effects older than the horizon, step by step. */
static jsd_status gc_effects(jsd_store *s, gc_run *r, int batch)
{
    int64_t k = 0;
    int steps = 0;
    do {
        jsd_status st = jsd_store_gc_outbox_step(s, r->older, batch, &k);
        if (st != JSD_OK)
            return st;
        r->removed_effects += k;
        if (k > 0 && ++steps % 10 == 0)
            cli_say("gc", "info", "%lld published effects removed so far",
                    (long long)r->removed_effects);
    } while (k > 0);
    return JSD_OK;
}

/* The inbox rows of one durable up to max_seq, step by step; *gone counts
 * them. */
static jsd_status gc_durable(jsd_store *s, gc_run *r, const jsd_inbox_aged *a, int64_t max_seq,
                             int batch, int64_t *gone)
{
    int64_t k = 0;
    int steps = 0;
    *gone = 0;
    do {
        jsd_status st =
            jsd_store_gc_inbox_step(s, a->stream, a->durable, r->older, max_seq, batch, &k);
        if (st != JSD_OK)
            return st;
        *gone += k;
        r->removed_inbox += k;
        if (k > 0 && ++steps % 10 == 0)
            cli_say("gc", "info", "durable \"%s/%s\": %lld inbox rows removed so far", a->stream,
                    a->durable, (long long)*gone);
    } while (k > 0);
    return JSD_OK;
}

/* Inbox rows older than the horizon, durable by durable: each at or below
 * its ack floor; the rest kept, counted and said why. */
static jsd_status gc_inbox(jsd_store *s, gc_run *r, int batch, const char *no_server)
{
    jsd_inbox_aged *a = NULL;
    size_t n = 0;
    jsd_status st = jsd_store_inbox_aged(s, r->older, &a, &n);
    if (st != JSD_OK)
        return st;
    for (size_t i = 0; i < n && st == JSD_OK; i++) {
        if (r->durable && strcmp(a[i].durable, r->durable) != 0)
            continue;
        if (!r->asked) {
            r->kept_unasked += a[i].rows;
            cli_say("gc", "warn",
                    "durable \"%s/%s\": kept %lld inbox rows older than %lld ms: %s, so its ack "
                    "floor is unknown and a row may still be needed by a redelivery; nothing "
                    "is removed from the inbox on a guess",
                    a[i].stream, a[i].durable, (long long)a[i].rows, (long long)r->older,
                    no_server);
            continue;
        }
        const jsd_durable_state *d = find_durable(r, a[i].stream, a[i].durable);
        int64_t gone = 0;
        if (!d && !r->durable) {
            r->kept_missing += a[i].rows;
            cli_say("gc", "warn",
                    "durable \"%s/%s\" does not exist on the server: kept its %lld inbox rows "
                    "older than %lld ms (a durable made again under that name would be "
                    "redelivered them); if it is gone for good, drop them with "
                    "jsdurable gc --durable %s",
                    a[i].stream, a[i].durable, (long long)a[i].rows, (long long)r->older,
                    a[i].durable);
            continue;
        }
        if (!d) { /* --durable NAME, and the server has no such durable */
            st = gc_durable(s, r, &a[i], INT64_MAX, batch, &gone);
            if (st == JSD_OK)
                cli_say("gc", "info",
                        "durable \"%s/%s\" does not exist on the server: removed its %lld "
                        "inbox rows older than %lld ms (--durable)",
                        a[i].stream, a[i].durable, (long long)gone, (long long)r->older);
            continue;
        }
        if (d->ahead) {
            r->kept_floor += a[i].rows;
            cli_say("gc", "warn",
                    "durable \"%s/%s\": kept %lld inbox rows older than %lld ms: the durable is "
                    "ahead of its stream (ack floor %llu past the stream's end: the server lost "
                    "the stream's tail), so its floor does not say which rows are acknowledged; "
                    "they go once it is re-created (consume --topology FILE)",
                    a[i].stream, a[i].durable, (long long)a[i].rows, (long long)r->older,
                    (unsigned long long)d->ack_floor_seq);
            continue;
        }
        int64_t floor =
            d->ack_floor_seq > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)d->ack_floor_seq;
        /* The durable's highest row stays: its high-water mark (what tells a
         * store restored from an older backup). At or below the floor it is
         * the only row kept. The floor is recorded first: a durable lost
         * later resumes after the recorded floor, never below rows gone. */
        uint64_t high = 0;
        st = jsd_store_durable_floor_record(s, a[i].stream, a[i].durable, d->ack_floor_seq);
        if (st != JSD_OK) {
            r->kept_floor += a[i].rows;
            cli_say("gc", "warn",
                    "durable \"%s/%s\": kept %lld inbox rows: recording its ack floor %llu "
                    "failed (%s); a row is removed only under a recorded floor",
                    a[i].stream, a[i].durable, (long long)a[i].rows,
                    (unsigned long long)d->ack_floor_seq, jsd_store_errmsg(s));
            st = JSD_OK;
            continue;
        }
        st = jsd_store_inbox_high_water(s, a[i].stream, a[i].durable, &high);
        if (st == JSD_OK)
            st = gc_durable(s, r, &a[i], floor, batch, &gone);
        /* rows that aged past the horizon since the count are not in it */
        int64_t kept = a[i].rows > gone ? a[i].rows - gone : 0;
        if (high > 0 && high <= d->ack_floor_seq)
            kept = 0;
        if (st == JSD_OK && kept > 0) {
            r->kept_floor += kept;
            cli_say("gc", "warn",
                    "durable \"%s/%s\": kept %lld inbox rows older than %lld ms above its ack "
                    "floor (stream sequence %llu): not all acknowledged, a redelivery may "
                    "still need them; they go once the consumer acknowledges past them",
                    a[i].stream, a[i].durable, (long long)kept, (long long)r->older,
                    (unsigned long long)d->ack_floor_seq);
        }
    }
    jsd_inbox_aged_free(a, n);
    return st;
}

int cmd_gc(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"older-than", required_argument, NULL, 'o'},
                                             {"batch", required_argument, NULL, 'b'},
                                             {"dedup-window", required_argument, NULL, 'w'},
                                             {"min-horizon", required_argument, NULL, 'm'},
                                             {"durable", required_argument, NULL, 'd'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"json", no_argument, NULL, 'j'},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    gc_run r = {.older = -1, .window = -1, .from = "--dedup-window"};
    cli_conn cc;
    cli_conn_init(&cc);
    cc.opts.startup_budget_ms = 2000;
    long batch = 1000;
    int opt;
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'o':
            if (!parse_dur("--older-than", optarg, &r.older))
                return CLI_USAGE;
            break;
        case 'w':
            if (!parse_dur("--dedup-window", optarg, &r.window))
                return CLI_USAGE;
            break;
        case 'm':
            if (!parse_dur("--min-horizon", optarg, &r.floor_ms))
                return CLI_USAGE;
            break;
        case 'd':
            if (!optarg[0]) {
                cli_err("gc", "--durable takes a durable's name");
                cli_conn_free(&cc);
                return CLI_USAGE;
            }
            r.durable = optarg;
            break;
        case 'b':
            if (!cli_parse_long(optarg, 1, 100000, &batch)) {
                cli_err("gc", "--batch takes 1..100000");
                return CLI_USAGE;
            }
            break;
        case 'j':
            r.json = true;
            break;
        case 'h':
            usage(stdout);
            cli_conn_free(&cc);
            return CLI_OK;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                int rc = cli_conn_flag(&cc, opt, optarg);
                if (rc) {
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
        cli_err("gc", "unexpected argument \"%s\"", argv[optind]);
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url || r.older < 0) {
        cli_err("gc", "--store URL (or $JSD_STORE) and --older-than DURATION are required");
        cli_conn_free(&cc);
        return CLI_USAGE;
    }
    char no_server[640] = "no --nats server was given";
    int rc = CLI_OK;
    if (cli_conn_wanted(&cc)) {
        rc = cli_conn_finish(&cc, "gc");
        if (rc != 0) {
            cli_conn_free(&cc);
            return gc_done(&r, rc, NULL, "the NATS connection settings were refused");
        }
        bool stated = r.window >= 0;
        rc = server_state(&cc, &r, no_server, sizeof(no_server));
        if (rc != 0 && !stated) {
            cli_conn_free(&cc);
            return gc_done(&r, rc, NULL, "the duplicate windows could not be read from NATS");
        }
        if (rc != 0)
            cli_say("gc", "warn",
                    "%s: going on with --dedup-window for the published effects; every inbox "
                    "row is kept",
                    no_server);
        rc = CLI_OK;
    }
    cli_conn_free(&cc);
    char why[400];
#define GC_REFUSE(...)                                                                             \
    do {                                                                                           \
        snprintf(why, sizeof(why), __VA_ARGS__);                                                   \
        cli_err("gc", "%s", why);                                                                  \
        rc = gc_done(&r, CLI_CONFIG, NULL, why);                                                   \
        goto out;                                                                                  \
    } while (0)
    if (r.window < 0)
        GC_REFUSE("the duplicate window is unknown: give --nats URL to read it from the "
                  "streams, or --dedup-window DURATION; nothing removed");
    if (r.older < r.window)
        GC_REFUSE("--older-than %lld ms is shorter than the duplicate window (%lld ms, %s): a "
                  "republished effect or a redelivery could then apply twice; nothing removed",
                  (long long)r.older, (long long)r.window, r.from);
    if (r.older < r.floor_ms)
        GC_REFUSE("--older-than %lld ms is shorter than --min-horizon %lld ms; nothing removed",
                  (long long)r.older, (long long)r.floor_ms);
#undef GC_REFUSE
    jsd_store *s = NULL;
    jsd_error err;
    jsd_status st = jsd_store_open(&s, url, &err);
    if (st != JSD_OK) {
        cli_err("gc", "%s", err.msg[0] ? err.msg : jsd_status_str(st));
        rc = gc_done(&r, cli_exit_for(st), NULL, err.msg[0] ? err.msg : jsd_status_str(st));
        goto out;
    }
    st = r.durable ? JSD_OK : gc_effects(s, &r, (int)batch);
    if (st == JSD_OK)
        st = gc_inbox(s, &r, (int)batch, no_server);
    if (st != JSD_OK) {
        cli_err("gc", "%s (%lld rows removed before this)", jsd_store_errmsg(s),
                (long long)(r.removed_effects + r.removed_inbox));
        char where[512];
        snprintf(why, sizeof(why), "%s", jsd_store_errmsg(s));
        snprintf(where, sizeof(where), "%s", jsd_store_url(s));
        jsd_store_close(s);
        rc = gc_done(&r, cli_exit_for(st), where, why);
        goto out;
    }
    int64_t kept = r.kept_floor + r.kept_missing + r.kept_unasked;
    if (!r.json) {
        printf("removed %lld rows (%lld published effects, %lld inbox rows; older than %lld ms) "
               "from %s\n",
               (long long)(r.removed_effects + r.removed_inbox), (long long)r.removed_effects,
               (long long)r.removed_inbox, (long long)r.older, jsd_store_url(s));
        if (kept > 0)
            printf("kept %lld inbox rows older than %lld ms: %lld above their durable's ack "
                   "floor, %lld of durables missing on the server (gc --durable NAME drops "
                   "them), %lld unchecked (no server)\n",
                   (long long)kept, (long long)r.older, (long long)r.kept_floor,
                   (long long)r.kept_missing, (long long)r.kept_unasked);
    } else {
        gc_done(&r, CLI_OK, jsd_store_url(s), NULL);
    }
    jsd_store_close(s);
out:
    jsd_stream_states_free(r.st, r.n_st);
    return rc;
}
