/*
 * jsdurable verify — audit every receipt in range against the stream
 * (include/jsdurable/verify.h): is the message its receipt names still
 * there, with the effect's Nats-Msg-Id? Prints each receipt that is not ok
 * (lost, overwritten, stream gone; expired ones are counted, not listed),
 * progress per batch on stderr, and a summary; exits 1 when anything was
 * lost. Read-only unless --repair, which takes the receipts of lost effects
 * back so the relay publishes them again with their unchanged id, and says
 * which of those ids the stream may still remember in its duplicate window.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define WINDOW_IDS_SHOWN 100

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable verify --store URL --nats URL [--since DURATION] [--repair]\n"
            "                        [--batch N] [--json] [--metrics HOST:PORT]\n\n"
            "For every receipted outbox effect (published within DURATION, or all), read the\n"
            "stream message its receipt names (stream, sequence) and check that it carries\n"
            "the effect's Nats-Msg-Id. Each receipt is:\n"
            "  ok           the message is there with the effect's id\n"
            "  missing      acknowledged, then lost: the sequence is gone although the\n"
            "               stream keeps that range (>= its first sequence, within max age)\n"
            "  overwritten  the sequence holds another message id (the stream was recreated,\n"
            "               or its server lost writes and reused the sequence)\n"
            "  expired      below the stream's first sequence or past its max age: removed\n"
            "               by the stream's limits or a purge; expected, counted only\n"
            "  stream_gone  the stream does not exist\n"
            "Then the last 20000 messages of each stream up to its highest ok receipt are\n"
            "read for copies of the audited effects at other sequences:\n"
            "  republished  the effect's msg id is in the stream twice: published again\n"
            "               past the duplicate window (its first receipt was lost, e.g. a\n"
            "               store restored from an older backup)\n\n"
            "  --store URL        sqlite:PATH, a file path, or postgres://... (or $JSD_STORE)\n"
            "  --since DURATION   only receipts published this recently (30s, 5m, 2h, 7d)\n"
            "  --repair           take back the receipts of missing and overwritten effects:\n"
            "                     the relay then\n"
            "                     publishes them again with their unchanged msg id. Ids the\n"
            "                     stream may still remember (inside its duplicate window)\n"
            "                     are listed: their republish is answered duplicate until\n"
            "                     the window passes; verify --repair again after it\n"
            "  --batch N          receipts per store read, 1..1000 (default 500)\n"
            "  --json             one JSON object per finding, then a summary object\n"
            "  --metrics ADDR     serve jsd_verify_* counters on ADDR while it runs\n\n"
            "Without --repair nothing is written. One stored-message get per receipt, and\n"
            "one per sequence of the scan.\n\n"
            "Exit codes: 0 every receipt ok or expired; 1 missing, overwritten, stream\n"
            "gone (also after --repair) or republished; 64 usage; 69 NATS unreachable; 73 store "
            "cannot\n"
            "be opened.\n\n"
            "%s\n"
            "Example:\n"
            "  jsdurable verify --store sqlite:app.db --nats nats://127.0.0.1:4222 --since 1d\n",
            CLI_CONN_HELP);
}

typedef struct vctx {
    bool json;
    uint64_t in_window;
    char window_ids[WINDOW_IDS_SHOWN][JSD_IDENT_MAX + 1];
} vctx;

static void on_finding(void *user, const jsd_verify_finding *f)
{
    vctx *c = user;
    if (f->repaired && f->in_dup_window && c->in_window++ < WINDOW_IDS_SHOWN)
        snprintf(c->window_ids[c->in_window - 1], sizeof(c->window_ids[0]), "%s", f->msg_id);
    if (f->verdict == JSD_VERIFY_EXPIRED)
        return;
    if (c->json) {
        json_t *o =
            json_pack("{s:s, s:I, s:s, s:s, s:s, s:s, s:I, s:I, s:b}", "verdict",
                      jsd_verify_verdict_name(f->verdict), "row_id", (json_int_t)f->row_id, "owner",
                      f->owner, "effect_id", f->effect_id, "msg_id", f->msg_id, "stream", f->stream,
                      "stream_seq", (json_int_t)f->stream_seq, "published_at_ms",
                      (json_int_t)f->published_at_ms, "repaired", f->repaired);
        if (o && f->verdict == JSD_VERIFY_OVERWRITTEN)
            json_object_set_new(o, "found_msg_id", json_string(f->found_msg_id));
        if (o && f->verdict == JSD_VERIFY_REPUBLISHED)
            json_object_set_new(o, "other_seq", json_integer((json_int_t)f->other_seq));
        if (o && f->repaired)
            json_object_set_new(o, "dup_window_ends_ms",
                                f->in_dup_window ? json_integer(f->dup_window_ends_ms)
                                                 : json_null());
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(o);
        return;
    }
    printf("%-11s %s/%s msg id %s at %s:%" PRIu64, jsd_verify_verdict_name(f->verdict), f->owner,
           f->effect_id, f->msg_id, f->stream, f->stream_seq);
    if (f->verdict == JSD_VERIFY_OVERWRITTEN)
        printf(" (holds %s)", f->found_msg_id[0] ? f->found_msg_id : "a message without id");
    if (f->verdict == JSD_VERIFY_REPUBLISHED)
        printf(" and again at %s:%" PRIu64 " (published again past the duplicate window)",
               f->stream, f->other_seq);
    if (f->repaired)
        printf(" -> requeued%s", f->in_dup_window ? " (inside the duplicate window)" : "");
    putchar('\n');
    fflush(stdout);
}

static void on_progress(void *user, const jsd_verify_report *r)
{
    (void)user;
    cli_say("verify", "info",
            "%" PRIu64 " checked (ok %" PRIu64 ", missing %" PRIu64 ", overwritten %" PRIu64
            ", expired %" PRIu64 ", stream gone %" PRIu64 ")",
            r->checked, r->ok, r->missing, r->overwritten, r->expired, r->stream_gone);
}

static void summary(const vctx *c, const jsd_verify_report *r, bool repair)
{
    size_t shown = c->in_window < WINDOW_IDS_SHOWN ? (size_t)c->in_window : WINDOW_IDS_SHOWN;
    if (c->json) {
        json_t *ids = json_array();
        for (size_t i = 0; i < shown; i++)
            json_array_append_new(ids, json_string(c->window_ids[i]));
        json_t *o =
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "checked",
                      (json_int_t)r->checked, "ok", (json_int_t)r->ok, "missing",
                      (json_int_t)r->missing, "overwritten", (json_int_t)r->overwritten, "expired",
                      (json_int_t)r->expired, "stream_gone", (json_int_t)r->stream_gone, "repaired",
                      (json_int_t)r->repaired, "repaired_in_dup_window",
                      (json_int_t)r->repaired_in_window, "in_dup_window_msg_ids", ids);
        if (o)
            json_object_set_new(o, "republished", json_integer((json_int_t)r->republished));
        char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (text)
            printf("%s\n", text);
        free(text);
        json_decref(o);
        return;
    }
    printf("checked %" PRIu64 ": ok %" PRIu64 ", missing %" PRIu64 ", overwritten %" PRIu64
           ", expired %" PRIu64 ", stream gone %" PRIu64 "\n",
           r->checked, r->ok, r->missing, r->overwritten, r->expired, r->stream_gone);
    if (r->republished)
        printf("republished %" PRIu64 " (copies of effects at a second sequence of their stream; "
               "a consumer's inbox applies each once while it keeps the first's row)\n",
               r->republished);
    if (repair)
        printf("repaired %" PRIu64 " (requeued with their msg ids; the relay publishes them)\n",
               r->repaired);
    if (c->in_window) {
        printf("%" PRIu64 " repaired id(s) are still inside their stream's duplicate window: a "
               "republish before it passes is answered duplicate and stores nothing; run "
               "verify --repair again after it:\n",
               c->in_window);
        for (size_t i = 0; i < shown; i++)
            printf("  %s\n", c->window_ids[i]);
        if (shown < c->in_window)
            printf("  ... and %" PRIu64 " more\n", c->in_window - shown);
    }
}

enum { O_STORE = 1, O_SINCE, O_REPAIR, O_BATCH, O_JSON, O_METRICS, O_HELP };

int cmd_verify(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, O_STORE},
                                             {"since", required_argument, NULL, O_SINCE},
                                             {"repair", no_argument, NULL, O_REPAIR},
                                             {"batch", required_argument, NULL, O_BATCH},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"metrics", required_argument, NULL, O_METRICS},
                                             {"help", no_argument, NULL, O_HELP},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    cli_conn cc;
    jsd_verify_opts vo;
    const char *store_flag = NULL, *metrics_addr = NULL;
    int rc = CLI_OK, opt;
    long batch = 500;
    jsd_store *store = NULL;
    jsd_conn *conn = NULL;
    jsd_metrics *metrics = NULL;
    jsd_metrics_server *msrv = NULL;
    jsd_error err;
    vctx *ctx = calloc(1, sizeof(*ctx));

    if (!ctx)
        return CLI_SOFTWARE;
    cli_conn_init(&cc);
    jsd_verify_opts_init(&vo);
    jsd_error_clear(&err);
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case O_STORE:
            store_flag = optarg;
            break;
        case O_SINCE:
            if (!cli_parse_duration_ms(optarg, &vo.since_ms) || vo.since_ms == 0) {
                cli_err("verify", "--since takes a duration such as 30s, 5m, 2h or 7d, not \"%s\"",
                        optarg);
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_REPAIR:
            vo.repair = true;
            break;
        case O_BATCH:
            if (!cli_parse_long(optarg, 1, 1000, &batch)) {
                cli_err("verify", "--batch takes a number in 1..1000, not \"%s\"", optarg);
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_JSON:
            ctx->json = true;
            break;
        case O_METRICS:
            metrics_addr = optarg;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            goto out;
        default:
            if (opt >= CLI_CONN_OPT_BASE) {
                if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0)
                    goto out;
                break;
            }
            usage(stderr);
            rc = CLI_USAGE;
            goto out;
        }
    }
    if (optind < argc) {
        cli_err("verify", "unexpected argument \"%s\"", argv[optind]);
        rc = CLI_USAGE;
        goto out;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("verify", "no store: give --store URL or set $JSD_STORE");
        rc = CLI_USAGE;
        goto out;
    }
    if ((rc = cli_conn_finish(&cc, "verify")) != 0)
        goto out;
    if ((rc = cli_store_open("verify", url, &store)) != 0)
        goto out;
    if ((rc = cli_conn_open(&cc, &conn)) != 0)
        goto out;
    if (metrics_addr) {
        if ((rc = cli_metrics_start("verify", metrics_addr, conn, &metrics, &msrv)) != 0)
            goto out;
        vo.metrics = metrics;
    }
    vo.batch = (size_t)batch;
    vo.on_finding = on_finding;
    vo.on_progress = on_progress;
    vo.user = ctx;
    jsd_verify_report rep;
    jsd_status s = jsd_verify_run(store, conn, &vo, &rep, &err);
    summary(ctx, &rep, vo.repair);
    if (s != JSD_OK) {
        cli_err("verify", "%s", err.msg[0] ? err.msg : jsd_status_str(s));
        rc = cli_exit_for(s);
    } else if (rep.missing || rep.overwritten || rep.stream_gone || rep.republished) {
        rc = CLI_FAILED;
    }
out:
    jsd_metrics_server_destroy(msrv);
    jsd_conn_close(conn);
    jsd_store_close(store);
    jsd_metrics_destroy(metrics);
    cli_conn_free(&cc);
    free(ctx);
    return rc;
}
