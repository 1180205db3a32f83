/*
 * jsdurable outbox — the relay's dead letters and pending effects, first
 * class: list them (pending, or dead-lettered with --dead) in bounded pages,
 * show one effect with its attempts, last error, dead reason, receipt and
 * lease, and requeue dead-lettered effects with their message id unchanged
 * (idempotent; a published effect is refused). Reads and writes the store
 * only, through include/jsdurable/outbox.h; memory stays flat whatever the
 * size of the outbox (pages of at most 500 rows, keyset by row id).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#define PAGE 500

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: jsdurable outbox list [--dead] [--subject S] [--limit N] [--json]\n"
        "       jsdurable outbox show OWNER ID [--json]\n"
        "       jsdurable outbox requeue (OWNER ID | --all-dead [--subject S]) [--json]\n"
        "       (each with --store URL, or $JSD_STORE)\n\n"
        "  list        effects waiting for the relay, one line each: row id, owner,\n"
        "              effect id, subject, attempts, next due, last error; with --dead\n"
        "              the dead-lettered ones, with their dead reason\n"
        "  show        one effect: subject, msg id, attempts, last error, dead reason\n"
        "              and time, receipt (stream, sequence, duplicate, published time),\n"
        "              lease\n"
        "  requeue     give a dead-lettered effect (or every one, --all-dead) a fresh\n"
        "              attempt budget, due now, with its message id unchanged;\n"
        "              idempotent (an effect already pending stays as it is); a\n"
        "              published effect is refused (see `jsdurable verify --repair`)\n\n"
        "  --store URL   sqlite:PATH, a file path, or postgres://... (or $JSD_STORE)\n"
        "  --dead        list dead-lettered effects instead of pending ones\n"
        "  --subject S   only effects on subject S (exact)\n"
        "  --limit N     list at most N effects, 1..100000000 (default 1000)\n"
        "  --all-dead    requeue every dead-lettered effect (with --subject: on S)\n"
        "  --json        JSON: list prints one object per line, show and requeue one\n\n"
        "Exit codes: 0 done; 64 usage; 65 requeue of a published effect refused;\n"
        "1 no such effect; 73 store cannot be opened; 74 store read-only or full.\n\n"
        "Example:\n"
        "  jsdurable outbox list --store sqlite:app.db --dead\n"
        "  jsdurable outbox requeue --store sqlite:app.db --all-dead --subject orders.created\n");
}

static void time_text(int64_t ms, char *out, size_t cap)
{
    if (ms <= 0) {
        snprintf(out, cap, "-");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char day[32];
    gmtime_r(&t, &tm);
    strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, cap, "%s.%03dZ", day, (int)(ms % 1000));
}

static void print_clean(const char *s)
{
    for (; s && *s; s++)
        putchar((unsigned char)*s < 0x20 ? ' ' : *s);
}

static json_t *entry_json(const jsd_outbox_entry *e)
{
    json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "row_id",
                          (json_int_t)e->row_id, "state", jsd_outbox_state_name(e->state), "owner",
                          e->owner, "effect_id", e->effect_id, "msg_id", e->msg_id, "subject",
                          e->subject, "attempts", (json_int_t)e->attempts, "payload_bytes",
                          (json_int_t)e->payload_len, "created_at_ms", (json_int_t)e->created_at_ms,
                          "not_before_ms", (json_int_t)e->not_before_ms, "next_attempt_at_ms",
                          (json_int_t)e->next_attempt_at_ms);
    if (!o)
        return NULL;
    json_object_set_new(o, "order_key", e->order_key[0] ? json_string(e->order_key) : json_null());
    json_object_set_new(o, "last_error",
                        e->last_error[0] ? json_string(e->last_error) : json_null());
    if (e->state == JSD_OUTBOX_DEAD) {
        json_object_set_new(o, "dead_reason", json_string(e->dead_reason));
        json_object_set_new(o, "dead_lettered_at_ms", json_integer(e->dead_lettered_at_ms));
    }
    if (e->state == JSD_OUTBOX_PUBLISHED)
        json_object_set_new(o, "receipt",
                            json_pack("{s:s, s:I, s:b, s:I}", "stream", e->stream, "stream_seq",
                                      (json_int_t)e->stream_seq, "duplicate", e->duplicate,
                                      "published_at_ms", (json_int_t)e->published_at_ms));
    else
        json_object_set_new(o, "receipt", json_null());
    json_object_set_new(o, "lease",
                        e->leased
                            ? json_pack("{s:I}", "expires_at_ms", (json_int_t)e->lease_expires_ms)
                            : json_null());
    return o;
}

static void print_json(json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (text)
        printf("%s\n", text);
    free(text);
    json_decref(o);
}

static void show_text(const jsd_outbox_entry *e)
{
    char t[40];
    printf("owner:        %s\neffect_id:    %s\nstate:        %s\nsubject:      %s\n", e->owner,
           e->effect_id, jsd_outbox_state_name(e->state), e->subject);
    printf("msg_id:       %s\norder_key:    %s\npayload:      %zu bytes\n", e->msg_id,
           e->order_key[0] ? e->order_key : "-", e->payload_len);
    time_text(e->created_at_ms, t, sizeof(t));
    printf("created:      %s\nattempts:     %d\n", t, e->attempts);
    if (e->state == JSD_OUTBOX_PENDING) {
        time_text(e->next_attempt_at_ms, t, sizeof(t));
        printf("next due:     %s\n", t);
    }
    printf("last error:   ");
    print_clean(e->last_error[0] ? e->last_error : "-");
    putchar('\n');
    if (e->state == JSD_OUTBOX_DEAD) {
        time_text(e->dead_lettered_at_ms, t, sizeof(t));
        printf("dead since:   %s\ndead reason:  ", t);
        print_clean(e->dead_reason);
        putchar('\n');
    }
    if (e->state == JSD_OUTBOX_PUBLISHED) {
        time_text(e->published_at_ms, t, sizeof(t));
        printf("receipt:      stream %s, sequence %" PRIu64 "%s, published %s\n", e->stream,
               e->stream_seq, e->duplicate ? " (duplicate)" : "", t);
    } else {
        printf("receipt:      none\n");
    }
    if (e->leased) {
        time_text(e->lease_expires_ms, t, sizeof(t));
        printf("lease:        held by a relay until %s\n", t);
    } else {
        printf("lease:        free\n");
    }
}

static int do_list(jsd_store *s, bool dead, const char *subject, long limit, bool json)
{
    jsd_outbox_entry *page = calloc(PAGE, sizeof(*page));
    if (!page) {
        cli_err("outbox", "out of memory");
        return CLI_SOFTWARE;
    }
    jsd_outbox_query q = {.state = dead ? JSD_OUTBOX_DEAD : JSD_OUTBOX_PENDING, .subject = subject};
    long shown = 0;
    int rc = CLI_OK;
    size_t n = 0;
    if (!json)
        printf("ROW\tOWNER\tEFFECT\tSUBJECT\tATTEMPTS\t%s\n",
               dead ? "DEAD SINCE\tDEAD REASON" : "NEXT DUE\tLAST ERROR");
    do {
        q.limit = (size_t)(limit - shown < PAGE ? limit - shown : PAGE);
        jsd_status st = jsd_outbox_list(s, &q, page, &n);
        if (st != JSD_OK) {
            cli_err("outbox", "%s", jsd_store_errmsg(s));
            rc = cli_exit_for(st);
            break;
        }
        for (size_t i = 0; i < n; i++) {
            const jsd_outbox_entry *e = &page[i];
            if (json) {
                print_json(entry_json(e));
                continue;
            }
            char t[40];
            time_text(dead ? e->dead_lettered_at_ms : e->next_attempt_at_ms, t, sizeof(t));
            printf("%" PRId64 "\t%s\t%s\t%s\t%d\t%s%s\t", e->row_id, e->owner, e->effect_id,
                   e->subject, e->attempts, t, e->leased ? " (leased)" : "");
            print_clean(dead ? e->dead_reason : e->last_error[0] ? e->last_error : "-");
            putchar('\n');
        }
        shown += (long)n;
        if (n)
            q.after_row_id = page[n - 1].row_id;
    } while (n == q.limit && shown < limit);
    cli_say("outbox", "info", "%ld %s effect(s)%s", shown, dead ? "dead-lettered" : "pending",
            shown == limit ? " (the --limit; there may be more)" : "");
    free(page);
    return rc;
}

static int do_show(jsd_store *s, const char *owner, const char *id, bool json)
{
    jsd_outbox_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return CLI_SOFTWARE;
    int rc = CLI_OK;
    jsd_status st = jsd_outbox_get(s, owner, id, e);
    if (st != JSD_OK) {
        cli_err("outbox", "%s", jsd_store_errmsg(s));
        rc = st == JSD_ERR_NOT_FOUND ? CLI_FAILED : cli_exit_for(st);
    } else if (json) {
        print_json(entry_json(e));
    } else {
        show_text(e);
    }
    free(e);
    return rc;
}

static int do_requeue(jsd_store *s, const char *owner, const char *id, bool all,
                      const char *subject, bool json)
{
    int64_t k = 0;
    jsd_status st;
    if (all) {
        st = jsd_outbox_requeue_dead(s, subject, &k);
    } else {
        bool one = false;
        st = jsd_outbox_requeue(s, owner, id, &one);
        k = one;
    }
    if (st != JSD_OK) {
        cli_err("outbox", "%s", jsd_store_errmsg(s));
        return st == JSD_ERR_NOT_FOUND ? CLI_FAILED : cli_exit_for(st);
    }
    if (json)
        printf("{\"requeued\":%" PRId64 "}\n", k);
    else if (all)
        printf("requeued %" PRId64 " dead-lettered effect(s)\n", k);
    else
        printf(k ? "requeued \"%s\"/\"%s\" (msg id unchanged)\n"
                 : "\"%s\"/\"%s\" is not dead-lettered: nothing to requeue\n",
               owner, id);
    return CLI_OK;
}

enum { O_STORE = 1, O_DEAD, O_SUBJECT, O_LIMIT, O_ALL_DEAD, O_JSON, O_HELP };

int cmd_outbox(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, O_STORE},
                                             {"dead", no_argument, NULL, O_DEAD},
                                             {"subject", required_argument, NULL, O_SUBJECT},
                                             {"limit", required_argument, NULL, O_LIMIT},
                                             {"all-dead", no_argument, NULL, O_ALL_DEAD},
                                             {"json", no_argument, NULL, O_JSON},
                                             {"help", no_argument, NULL, O_HELP},
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL, *subject = NULL, *action = NULL;
    bool dead = false, all_dead = false, json = false;
    long limit = 1000;
    int opt;

    if (argc >= 2 && argv[1][0] != '-') {
        action = argv[1];
        argc--;
        argv++;
    }
    optind = 1;
    while ((opt = cli_getopt(argc, argv, "h", longopts)) != -1) {
        switch (opt) {
        case O_STORE:
            store_flag = optarg;
            break;
        case O_DEAD:
            dead = true;
            break;
        case O_SUBJECT:
            subject = optarg;
            break;
        case O_LIMIT:
            if (!cli_parse_long(optarg, 1, 100000000, &limit)) {
                cli_err("outbox", "--limit takes a number in 1..100000000, not \"%s\"", optarg);
                return CLI_USAGE;
            }
            break;
        case O_ALL_DEAD:
            all_dead = true;
            break;
        case O_JSON:
            json = true;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            return CLI_OK;
        default:
            usage(stderr);
            return CLI_USAGE;
        }
    }
    int nargs = argc - optind;
    char **args = argv + optind;
    const char *bad = NULL;
    if (!action) {
        bad = "give an action: list, show or requeue";
    } else if (!strcmp(action, "list")) {
        if (nargs)
            bad = "list takes no OWNER ID";
        else if (all_dead)
            bad = "--all-dead belongs to requeue";
    } else if (!strcmp(action, "show")) {
        if (nargs != 2)
            bad = "show takes exactly OWNER ID";
        else if (dead || all_dead || subject)
            bad = "show takes no --dead, --all-dead or --subject";
    } else if (!strcmp(action, "requeue")) {
        if (all_dead == (nargs == 2) || (nargs != 0 && nargs != 2))
            bad = "requeue takes OWNER ID or --all-dead (not both)";
        else if (subject && !all_dead)
            bad = "--subject goes with --all-dead";
        else if (dead)
            bad = "requeue takes no --dead";
    } else {
        bad = "unknown action (list, show or requeue)";
    }
    if (bad) {
        cli_err("outbox", "%s%s%s", action ? action : "", action ? ": " : "", bad);
        usage(stderr);
        return CLI_USAGE;
    }
    if (subject && (!*subject || strlen(subject) > JSD_SUBJECT_MAX)) {
        cli_err("outbox", "--subject takes a subject of 1..%d bytes", JSD_SUBJECT_MAX);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("outbox", "no store: give --store URL or set $JSD_STORE");
        return CLI_USAGE;
    }
    jsd_store *s = NULL;
    int rc = cli_store_open("outbox", url, &s);
    if (rc != 0)
        return rc;
    if (!strcmp(action, "list"))
        rc = do_list(s, dead, subject, limit, json);
    else if (!strcmp(action, "show"))
        rc = do_show(s, args[0], args[1], json);
    else
        rc = do_requeue(s, nargs ? args[0] : NULL, nargs ? args[1] : NULL, all_dead, subject, json);
    jsd_store_close(s);
    return rc;
}
