/*
 * jsdurable dlq — list, show, replay and purge the dead letters of a
 * dead-letter stream (DLQ-3). A dead letter is a death envelope: the original
 * payload verbatim with headers naming its origin (see dlq.h). Replay with
 * --store records a request in the store of the durable that parked it, which
 * that durable's consumer applies: no other consumer of the stream sees it
 * again. --republish instead publishes the payload to its original subject
 * with a new message id and a Jsd-Replay-Of header, where every consumer of
 * the subject receives it; one of the two must be asked for. The dead letter
 * itself stays as evidence until purged.
 * With -j/--json each action prints one JSON document on stdout instead of
 * its lines.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: jsdurable dlq list|show|replay|purge --nats URL --stream DLQ_STREAM [ARGS]\n\n"
            "  list [--limit N]          one line per dead letter: seq, time, reason, origin,\n"
            "                            deliveries, error\n"
            "  show SEQ                  headers, then the verbatim payload\n"
            "  replay SEQ... | --all --store URL\n"
            "                            queue each dead letter for the durable that parked\n"
            "                            it: its consumer (the next `jsdurable consume` of\n"
            "                            that durable on that store) applies it from its\n"
            "                            poison record; no message is published, so no other\n"
            "                            durable or consumer of the stream receives it again.\n"
            "                            URL (or $JSD_STORE) must be that durable's store.\n"
            "                            Idempotent: a dead letter queued or applied is one\n"
            "                            request; a failed one is queued again\n"
            "  replay SEQ... | --all --republish\n"
            "                            publish to the original subject again (new msg id,\n"
            "                            Jsd-Replay-Of: DLQ_STREAM:SEQ): EVERY consumer of\n"
            "                            the subject receives it, each one that had applied\n"
            "                            it applies it again; stored once per SEQ\n"
            "                            (replay without --store or --republish: exit 64;\n"
            "                            a store not the durable's: exit 78)\n"
            "  purge SEQ... | --all      delete dead letters\n"
            "  -j, --json                one JSON document: list {\"stream\",\"count\",\n"
            "                            \"dead_letters\":[...]}, show {... \"payload\" or\n"
            "                            \"payload_base64\"}, replay/purge "
            "{\"results\":[...]}\n\n" CLI_CONN_HELP "\nExample:\n"
            "  jsdurable dlq list --nats nats://127.0.0.1:4222 --stream DLQ\n"
            "  jsdurable dlq replay --nats nats://127.0.0.1:4222 --stream DLQ --store "
            "sqlite:app.db 12\n");
}

static bool parse_seq(const char *s, uint64_t *out)
{
    char *end = NULL;
    if (!s || !*s || *s == '-')
        return false;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v == 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

static void print_clean(FILE *f, const char *s)
{
    for (; s && *s; s++)
        fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
}

enum { O_STREAM = 1, O_LIMIT, O_ALL, O_HELP, O_JSON, O_STORE, O_REPUBLISH };

static json_t *letter_json(const jsd_dead_letter *d)
{
    json_t *o = json_object();
    json_object_set_new(o, "dlq_seq", json_integer((json_int_t)d->dlq_seq));
    json_object_set_new(o, "time", cli_json_str(d->time));
    json_object_set_new(o, "reason", cli_json_str(d->reason));
    json_object_set_new(o, "subject", cli_json_str(d->subject));
    json_object_set_new(o, "stream", cli_json_str(d->stream));
    json_object_set_new(o, "stream_seq", json_integer((json_int_t)d->stream_seq));
    json_object_set_new(o, "consumer", cli_json_str(d->consumer));
    json_object_set_new(o, "deliveries", json_integer((json_int_t)d->deliveries));
    json_object_set_new(o, "msg_id", cli_json_str(d->msg_id));
    json_object_set_new(o, "type", cli_json_str(d->type));
    json_object_set_new(o, "error", cli_json_str(d->error));
    json_object_set_new(o, "bytes", json_integer((json_int_t)d->len));
    return o;
}

int cmd_dlq(int argc, char **argv)
{
    static const struct option longopts[] = {{"stream", required_argument, NULL, O_STREAM},
                                             {"limit", required_argument, NULL, O_LIMIT},
                                             {"all", no_argument, NULL, O_ALL},
                                             {"help", no_argument, NULL, O_HELP},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"store", required_argument, NULL, O_STORE},
                                             {"republish", no_argument, NULL, O_REPUBLISH},
                                             CLI_CONN_LONGOPTS,
                                             {NULL, 0, NULL, 0}};
    cli_conn cc;
    const char *stream = NULL, *action = NULL, *store_flag = NULL, *store_url = NULL;
    bool all = false, json = false, republish = false;
    uint64_t limit = 1000;
    json_t *doc = NULL, *items = NULL;
    int rc = CLI_OK, opt;
    jsd_conn *conn = NULL;
    jsd_store *store = NULL;
    jsd_error err;

    cli_conn_init(&cc);
    jsd_error_clear(&err);
    if (argc >= 2 && argv[1][0] != '-') {
        action = argv[1];
        argc--;
        argv++;
    }
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        if (opt >= CLI_CONN_OPT_BASE) {
            if ((rc = cli_conn_flag(&cc, opt, optarg)) != 0)
                goto out;
            continue;
        }
        switch (opt) {
        case O_STREAM:
            stream = optarg;
            break;
        case O_LIMIT:
            if (!parse_seq(optarg, &limit)) {
                cli_err("dlq", "--limit takes a positive number");
                rc = CLI_USAGE;
                goto out;
            }
            break;
        case O_ALL:
            all = true;
            break;
        case O_JSON:
            json = true;
            break;
        case O_STORE:
            store_flag = optarg;
            break;
        case O_REPUBLISH:
            republish = true;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            goto out;
        default:
            usage(stderr);
            rc = CLI_USAGE;
            goto out;
        }
    }
    if (!action || (strcmp(action, "list") != 0 && strcmp(action, "show") != 0 &&
                    strcmp(action, "replay") != 0 && strcmp(action, "purge") != 0)) {
        usage(stderr);
        rc = CLI_USAGE;
        goto out;
    }
    if (!stream) {
        cli_err("dlq", "--stream DLQ_STREAM is required");
        rc = CLI_USAGE;
        goto out;
    }
    if (!strcmp(action, "replay")) {
        store_url = republish ? NULL : cli_store_url(store_flag);
        if (republish && store_flag) {
            cli_err("dlq", "replay: --store and --republish exclude each other");
            rc = CLI_USAGE;
            goto out;
        }
        if (!republish && !store_url) {
            cli_err("dlq", "replay: give --store URL, the store of the durable that parked the "
                           "dead letter (that durable's consumer applies it again; no other "
                           "consumer of the stream receives it), or --republish to publish it to "
                           "its subject again, where EVERY consumer of the stream receives it");
            rc = CLI_USAGE;
            goto out;
        }
    } else if (store_flag || republish) {
        cli_err("dlq", "%s takes neither --store nor --republish", action);
        rc = CLI_USAGE;
        goto out;
    }
    int nseq = argc - optind;
    uint64_t *seqs = NULL;
    if (nseq > 0) {
        seqs = calloc((size_t)nseq, sizeof(*seqs));
        if (!seqs) {
            rc = CLI_SOFTWARE;
            goto out;
        }
        for (int i = 0; i < nseq; i++)
            if (!parse_seq(argv[optind + i], &seqs[i])) {
                cli_err("dlq", "'%s' is not a sequence number", argv[optind + i]);
                free(seqs);
                rc = CLI_USAGE;
                goto out;
            }
    }
    if ((!strcmp(action, "show") && nseq != 1) ||
        ((!strcmp(action, "replay") || !strcmp(action, "purge")) && (nseq == 0) == !all) ||
        (!strcmp(action, "list") && nseq)) {
        cli_err("dlq", "%s: %s", action,
                !strcmp(action, "show")   ? "give exactly one SEQ"
                : !strcmp(action, "list") ? "takes no SEQ"
                                          : "give SEQ... or --all (not both)");
        free(seqs);
        rc = CLI_USAGE;
        goto out;
    }
    if ((rc = cli_conn_finish(&cc, "dlq")) != 0 || (rc = cli_conn_open(&cc, &conn)) != 0 ||
        (store_url && (rc = cli_store_open("dlq", store_url, &store)) != 0)) {
        free(seqs);
        goto out;
    }

    uint64_t first = 0, last = 0, count = 0;
    jsd_status st = jsd_dlq_range(conn, stream, &first, &last, &count, &err);
    if (st != JSD_OK) {
        cli_err("dlq", "%s", err.msg);
        rc = st == JSD_ERR_NOT_FOUND ? CLI_CONFIG : cli_exit_for(st);
        free(seqs);
        goto out;
    }
    if (json) {
        doc = json_object();
        items = json_array();
        json_object_set_new(doc, "stream", json_string(stream));
        json_object_set_new(doc, "action", json_string(action));
        json_object_set_new(doc, "count", json_integer((json_int_t)count));
        json_object_set_new(doc, "first_seq", json_integer((json_int_t)first));
        json_object_set_new(doc, "last_seq", json_integer((json_int_t)last));
    }
    if (!strcmp(action, "list")) {
        uint64_t shown = 0;
        if (!json)
            printf("SEQ\tTIME\tREASON\tORIGIN\tDELIVERIES\tERROR\n");
        for (uint64_t s = first; count && s <= last && shown < limit; s++) {
            jsd_dead_letter d;
            st = jsd_dlq_get(conn, stream, s, &d, &err);
            if (st == JSD_ERR_NOT_FOUND)
                continue;
            if (st != JSD_OK) {
                cli_err("dlq", "%s", err.msg);
                rc = cli_exit_for(st);
                break;
            }
            if (json) {
                json_array_append_new(items, letter_json(&d));
            } else {
                printf("%" PRIu64 "\t%s\t%s\t%s:%" PRIu64 " %s\t%" PRIu64 "\t", d.dlq_seq, d.time,
                       d.reason, d.stream, d.stream_seq, d.subject, d.deliveries);
                print_clean(stdout, d.error);
                putchar('\n');
            }
            shown++;
            jsd_dead_letter_clear(&d);
        }
        if (json)
            json_object_set(doc, "dead_letters", items);
        else
            cli_say("dlq", "info", "%" PRIu64 " dead letter(s) in %s", count, stream);
    } else if (!strcmp(action, "show") && seqs) { /* show has exactly one (checked above) */
        jsd_dead_letter d;
        st = jsd_dlq_get(conn, stream, seqs[0], &d, &err);
        if (st != JSD_OK) {
            cli_err("dlq", "%s", err.msg);
            rc = st == JSD_ERR_NOT_FOUND ? CLI_DATAERR : cli_exit_for(st);
        } else if (json) {
            json_t *o = letter_json(&d);
            cli_json_set_bytes(o, d.payload, d.len);
            json_object_set_new(doc, "dead_letter", o);
            jsd_dead_letter_clear(&d);
        } else {
            printf("dlq_seq: %" PRIu64 "\nsubject: %s\nstream: %s\nstream_seq: %" PRIu64
                   "\nconsumer: %s\ndeliveries: %" PRIu64 "\nreason: %s\ntime: %s\nmsg_id: "
                   "%s\ntype: %s\nerror: ",
                   d.dlq_seq, d.subject, d.stream, d.stream_seq, d.consumer, d.deliveries, d.reason,
                   d.time, d.msg_id, d.type);
            print_clean(stdout, d.error);
            printf("\nbytes: %zu\n\n", d.len);
            fwrite(d.payload, 1, d.len, stdout);
            jsd_dead_letter_clear(&d);
        }
    } else {
        bool replay = !strcmp(action, "replay");
        if (!replay && all) {
            st = jsd_dlq_purge(conn, stream, &err);
            if (st != JSD_OK) {
                cli_err("dlq", "%s", err.msg);
                rc = cli_exit_for(st);
            } else if (json) {
                json_object_set_new(doc, "purged", json_integer((json_int_t)count));
            } else {
                printf("purged %" PRIu64 " dead letter(s) from %s\n", count, stream);
            }
        } else {
            uint64_t lo = all ? first : 0, hi = all ? last : 0;
            int n = all ? (count ? (int)(hi - lo + 1) : 0) : nseq;
            int done = 0, failed = 0, skipped = 0;
            for (int i = 0; i < n; i++) {
                uint64_t s = all ? lo + (uint64_t)i : seqs[i];
                uint64_t new_seq = 0;
                jsd_replay_request req;
                bool queued = false;
                if (replay && store)
                    st = jsd_dlq_replay_request(conn, stream, s, store, &req, &queued, &err);
                else if (replay)
                    st = jsd_dlq_replay(conn, stream, s, &new_seq, &err);
                else
                    st = jsd_dlq_delete(conn, stream, s, &err);
                if (st == JSD_ERR_NOT_FOUND && all)
                    continue;
                if (st == JSD_ERR_CONFIG && all && store) {
                    skipped++; /* another durable's, whose store this is not */
                    continue;
                }
                if (st != JSD_OK) {
                    cli_err("dlq", "%s", err.msg);
                    rc = cli_exit_for(st);
                    failed++;
                    if (json)
                        json_array_append_new(items,
                                              json_pack("{s:I, s:b, s:o}", "seq", (json_int_t)s,
                                                        "ok", 0, "error", cli_json_str(err.msg)));
                    continue;
                }
                done++;
                if (json) {
                    json_t *r = json_pack("{s:I, s:b}", "seq", (json_int_t)s, "ok", 1);
                    if (replay && store) {
                        json_object_set_new(r, "durable", json_string(req.consumer));
                        json_object_set_new(r, "origin_stream", json_string(req.stream));
                        json_object_set_new(r, "stream_seq",
                                            json_integer((json_int_t)req.stream_seq));
                        json_object_set_new(r, "state",
                                            json_string(jsd_replay_state_name(req.state)));
                        json_object_set_new(r, "queued", json_boolean(queued));
                    } else if (replay) {
                        json_object_set_new(r, "new_seq", json_integer((json_int_t)new_seq));
                    }
                    json_array_append_new(items, r);
                } else if (replay && store) {
                    if (req.state == JSD_REPLAY_APPLIED)
                        printf("%s:%" PRIu64 " was applied already by durable %s (%s:%" PRIu64
                               "): nothing queued\n",
                               stream, s, req.consumer, req.stream, req.stream_seq);
                    else
                        printf("%s %s:%" PRIu64 " for durable %s (%s:%" PRIu64
                               "): applied by that durable's next consume\n",
                               queued ? "queued" : "already queued", stream, s, req.consumer,
                               req.stream, req.stream_seq);
                } else if (replay)
                    printf("republished %s:%" PRIu64 " -> stream seq %" PRIu64
                           " (every consumer of the subject receives it)\n",
                           stream, s, new_seq);
                else
                    printf("deleted %s:%" PRIu64 "\n", stream, s);
            }
            if (json) {
                json_object_set(doc, "results", items);
                json_object_set_new(doc, "done", json_integer(done));
                json_object_set_new(doc, "failed", json_integer(failed));
                if (store)
                    json_object_set_new(doc, "skipped_other_stores", json_integer(skipped));
            } else {
                if (skipped)
                    cli_say("dlq", "info",
                            "%d dead letter(s) skipped: parked by durables whose store is not "
                            "%s",
                            skipped, jsd_store_url(store));
                cli_say("dlq", failed ? "warn" : "info", "%d %s, %d failed", done,
                        !replay ? "deleted"
                        : store ? "replay requests recorded"
                                : "republished",
                        failed);
            }
        }
    }
    free(seqs);
    if (doc) {
        json_object_set_new(doc, "ok", json_boolean(rc == CLI_OK));
        cli_json_print(doc);
    }
    json_decref(items);
out:
    jsd_store_close(store);
    jsd_conn_close(conn);
    cli_conn_free(&cc);
    return rc;
}
