/*
 * jsdurable status — the store's counts for operators and scripts: outbox
 * backlog (and how much of it is due, and how long the oldest due effect has
 * waited), published and dead-lettered effects, inbox rows, poison records.
 *
 * Text by default, one JSON object with --json. The NATS side (stream and
 * consumer lag, ack pending, dead-letter depth) joins here when --nats is
 * given; see the marked hook below.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: jsdurable status --store URL [--json]\n\n"
               "Show the store's counts.\n\n"
               "  --store URL   sqlite:PATH, a file path, or postgres://... (or $JSD_STORE)\n"
               "  --json        one JSON object instead of text\n\n"
               "Counts: backlog (unpublished, not dead-lettered effects), due (of those, due\n"
               "now), oldest_due_age_ms (how long the oldest due effect has waited), published\n"
               "(effects with a receipt, until gc removes them), dead_lettered (attempt budget\n"
               "spent or permanent failure), inbox_rows, poison_records.\n\n"
               "Exit codes: 0 shown; 73 store cannot be opened; 78 store schema too new.\n\n"
               "Example:\n"
               "  jsdurable status --store sqlite:app.db --json\n");
}

static const char *backend_name(jsd_store *s)
{
    return jsd_store_backend_of(s) == JSD_STORE_POSTGRES ? "postgres" : "sqlite";
}

int cmd_status(int argc, char **argv)
{
    static const struct option longopts[] = {{"store", required_argument, NULL, 's'},
                                             {"json", no_argument, NULL, 'j'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    const char *store_flag = NULL;
    bool json = false;
    int opt, rc = CLI_OK;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (opt) {
        case 's':
            store_flag = optarg;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            usage(stdout);
            return CLI_OK;
        default:
            usage(stderr);
            return CLI_USAGE;
        }
    }
    if (optind < argc) {
        cli_err("status", "unexpected argument \"%s\"", argv[optind]);
        return CLI_USAGE;
    }
    const char *url = cli_store_url(store_flag);
    if (!url) {
        cli_err("status", "--store URL (or $JSD_STORE) is required");
        return CLI_USAGE;
    }
    jsd_store *s = NULL;
    jsd_error err;
    jsd_status st = jsd_store_open(&s, url, &err);
    if (st != JSD_OK) {
        cli_err("status", "%s", err.msg[0] ? err.msg : jsd_status_str(st));
        return cli_exit_for(st);
    }
    jsd_store_stats x;
    if ((st = jsd_store_stats_get(s, &x)) != JSD_OK) {
        cli_err("status", "%s", jsd_store_errmsg(s));
        jsd_store_close(s);
        return cli_exit_for(st);
    }
    if (json) {
        json_t *store = json_pack(
            "{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "url", jsd_store_url(s), "backend",
            backend_name(s), "backlog", (json_int_t)x.backlog, "due", (json_int_t)x.due,
            "oldest_due_age_ms", (json_int_t)x.oldest_due_age_ms, "published",
            (json_int_t)x.published, "dead_lettered", (json_int_t)x.dead_lettered, "inbox_rows",
            (json_int_t)x.inbox_rows, "poison_records", (json_int_t)x.poison_records);
        json_t *root = store ? json_pack("{s:o}", "store", store) : NULL;
        /* HOOK (issue 7): with --nats, add "nats": {streams, consumers, lag,
         * ack_pending, dlq_depth} to root here. */
        char *text = root ? json_dumps(root, JSON_COMPACT) : NULL;
        if (text)
            printf("%s\n", text);
        else
            rc = CLI_SOFTWARE;
        free(text);
        json_decref(root);
    } else {
        printf("store            %s (%s)\n", jsd_store_url(s), backend_name(s));
        printf("outbox backlog   %lld (due %lld, oldest due waited %lld ms)\n",
               (long long)x.backlog, (long long)x.due, (long long)x.oldest_due_age_ms);
        printf("published        %lld\n", (long long)x.published);
        printf("dead-lettered    %lld\n", (long long)x.dead_lettered);
        printf("inbox rows       %lld\n", (long long)x.inbox_rows);
        printf("poison records   %lld\n", (long long)x.poison_records);
        /* HOOK (issue 7): with --nats, print the NATS side here. */
    }
    jsd_store_close(s);
    return rc;
}
