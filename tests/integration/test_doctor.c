/*
 * `jsdurable doctor` and the start-up checks of `relay` and `consume`, as
 * processes against a real nats-server (a private one, for its monitoring
 * port and its fsync setting) and both store back ends: a memory stream, a
 * duplicate window shorter than the relay's retry horizon, a durable whose
 * backoff shortens its ack wait and a server without `sync_interval: always`
 * are each reported with their fix and exit 78 (the lazy server alone is a
 * warning); a sound deployment passes with exit 0; the store's
 * synchronous_commit, durability pragmas and schema version are judged; relay
 * and consume refuse the unsound deployment and run with --allow-unsafe,
 * saying so.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "consumer_env.h"
#include "relay_env.h"

static char out[131072];

/* ---- a private server and its streams ------------------------------------------------ */

typedef struct denv {
    jsd_fx_nats fx;
    rt_nats nt;
    rt_store st;
    char monitor[64];
    char mem[64], win[64], hot[64], dlq[64]; /* stream names */
    char root[64];                           /* unique subject root */
    char slow[64], sound[64];                /* durables */
} denv;

static void add_stream(rt_nats *n, const char *name, const char *subject, bool memory,
                       int64_t window_ms)
{
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    const char *subjects[1] = {subject};
    c.Name = name;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = memory ? js_MemoryStorage : js_FileStorage;
    if (window_ms > 0)
        c.Duplicates = window_ms * 1000000;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_AddStream(&si, n->js, &c, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_AddStream %s: %s (%d)", name, natsStatus_GetText(s), (int)jerr);
    jsStreamInfo_Destroy(si);
}

static void add_durable(rt_nats *n, const char *stream, const char *name, int64_t ack_wait_ms,
                        const int64_t *backoff_ms, int n_backoff)
{
    jsConsumerConfig c;
    jsConsumerConfig_Init(&c);
    int64_t bo[8];
    c.Durable = name;
    c.AckPolicy = js_AckExplicit;
    c.AckWait = ack_wait_ms * 1000000;
    c.MaxDeliver = 5;
    for (int i = 0; i < n_backoff; i++)
        bo[i] = backoff_ms[i] * 1000000;
    c.BackOff = n_backoff ? bo : NULL;
    c.BackOffLen = n_backoff;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_AddConsumer(&ci, n->js, stream, &c, NULL, &jerr);
    if (s != NATS_OK)
        fail_msg("js_AddConsumer %s/%s: %s (%d)", stream, name, natsStatus_GetText(s), (int)jerr);
    jsConsumerInfo_Destroy(ci);
}

/* Streams: MEM (memory), WIN (a 2 s duplicate window), HOT (sound) and the
 * dead-letter stream on "<root>dlq.>" (its own root); durables: WIN/slow with
 * a backoff under its ack wait, HOT/sound without one. */
static void denv_up(denv *e, bool pg)
{
    memset(e, 0, sizeof(*e));
    ASSERT_EQ(jsd_fx_nats_start(JSD_FX_PLAIN, &e->fx), 0);
    snprintf(e->monitor, sizeof(e->monitor), "http://127.0.0.1:%d", e->fx.monitor_port);
    rt_nats_open(&e->nt, e->fx.url);
    rt_store_new(&e->st, pg ? RT_PG : RT_SQLITE);
    jsd_store *s = rt_open(&e->st); /* creates the schema */
    jsd_store_close(s);
    snprintf(e->root, sizeof(e->root), "%s", jsd_test_unique("doc"));
    snprintf(e->mem, sizeof(e->mem), "%s", jsd_test_unique("MEM"));
    snprintf(e->win, sizeof(e->win), "%s", jsd_test_unique("WIN"));
    snprintf(e->hot, sizeof(e->hot), "%s", jsd_test_unique("HOT"));
    snprintf(e->dlq, sizeof(e->dlq), "%s", jsd_test_unique("DLQ"));
    snprintf(e->slow, sizeof(e->slow), "%s", jsd_test_unique("slow"));
    snprintf(e->sound, sizeof(e->sound), "%s", jsd_test_unique("sound"));
    char subj[128];
    snprintf(subj, sizeof(subj), "%smem.>", e->root);
    add_stream(&e->nt, e->mem, subj, true, 0);
    snprintf(subj, sizeof(subj), "%swin.>", e->root);
    add_stream(&e->nt, e->win, subj, false, 2000);
    snprintf(subj, sizeof(subj), "%shot.>", e->root);
    add_stream(&e->nt, e->hot, subj, false, 0); /* the default window: 2 minutes */
    snprintf(subj, sizeof(subj), "%sdlq.>", e->root);
    add_stream(&e->nt, e->dlq, subj, false, 0);
    static const int64_t backoff[2] = {2000, 4000};
    add_durable(&e->nt, e->win, e->slow, 30000, backoff, 2);
    add_durable(&e->nt, e->hot, e->sound, 30000, NULL, 0);
}

static void denv_down(denv *e)
{
    rt_store_close(&e->st);
    rt_nats_close(&e->nt);
    jsd_fx_nats_stop(&e->fx);
}

/* Restart the private server with the file store's default (lazy) fsync. */
static void lazy_fsync(denv *e)
{
    char conf[PATH_MAX + 16], cmd[PATH_MAX * 2 + 64];
    rt_nats_close(&e->nt);
    ASSERT_EQ(jsd_fx_nats_stop(&e->fx), 0);
    snprintf(conf, sizeof(conf), "%s/nats.conf", e->fx.dir);
    snprintf(cmd, sizeof(cmd), "sed -i '/sync_interval/d' '%s'", conf);
    ASSERT_EQ(system(cmd), 0);
    ASSERT_TRUE(!jsd_test_file_contains(conf, "sync_interval"));
    ASSERT_EQ(jsd_fx_nats_restart(&e->fx), 0);
    snprintf(e->monitor, sizeof(e->monitor), "http://127.0.0.1:%d", e->fx.monitor_port);
    rt_nats_open(&e->nt, e->fx.url);
    /* what the doctor warns of: the memory stream did not survive the restart */
    ASSERT_U64_EQ(jsd_fx_stream_msgs(e->nt.nc, e->mem), UINT64_MAX);
    char subj[128];
    snprintf(subj, sizeof(subj), "%smem.>", e->root);
    add_stream(&e->nt, e->mem, subj, true, 0);
}

static int doctor(const denv *e, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s doctor --store '%s' --nats %s %s", jsd_fx_bin("jsdurable"),
             e->st.url, e->fx.url, args);
    return jsd_test_run(cmd, out, sizeof(out));
}

/* The output line of one check on one subject (a copy in line), or fail. */
static const char *line_of(const char *check, const char *subject, char *line, size_t cap)
{
    for (const char *p = out; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char l[4096];
        snprintf(l, sizeof(l), "%.*s", (int)(len < sizeof(l) - 1 ? len : sizeof(l) - 1), p);
        char key[256];
        snprintf(key, sizeof(key), " %s ", check);
        if (strstr(l, key) && (!subject || strstr(l, subject))) {
            /* the fix, when there is one, is on the next line */
            const char *next = nl ? nl + 1 : "";
            const char *nl2 = strchr(next, '\n');
            size_t len2 = nl2 ? (size_t)(nl2 - next) : strlen(next);
            if (!strncmp(next, "        fix: ", 13))
                snprintf(line, cap, "%s\n%.*s", l, (int)len2, next);
            else
                snprintf(line, cap, "%s", l);
            return line;
        }
        p = nl ? nl + 1 : NULL;
    }
    fail_msg("no %s line for %s in:\n%s", check, subject ? subject : "(any)", out);
    return NULL;
}

/* The line starts with the level (the text form's first column). */
static void assert_level(const char *line, const char *level)
{
    size_t n = strlen(level);
    if (strncmp(line, level, n) != 0 || line[n] != ' ')
        fail_msg("expected level %s in:\n%s", level, line);
}
#define ASSERT_LEVEL(line, level) assert_level((line), (level))

/* ---- each unsound setting is reported with its fix ------------------------------------- */

static void unsound_reported(bool pg)
{
    denv e;
    denv_up(&e, pg);
    lazy_fsync(&e);
    char args[1024], l[8192];
    snprintf(args, sizeof(args),
             "--stream %s --stream %s --durable %s:%s --dlq-subject %sdlq.x "
             "--monitor %s",
             e.mem, e.win, e.win, e.slow, e.root, e.monitor);
    ASSERT_EQ(doctor(&e, args), 78);

    line_of("stream.storage", e.mem, l, sizeof(l));
    ASSERT_LEVEL(l, "error");
    ASSERT_CONTAINS(l, "memory storage");
    ASSERT_CONTAINS(l, "fix: recreate the stream with file storage");

    line_of("stream.duplicate_window", e.win, l, sizeof(l));
    ASSERT_LEVEL(l, "error");
    /* 5000 + 60000 + 30000 + 1000: the relay's default horizon */
    ASSERT_CONTAINS(l, "keeps message ids for 2000 ms");
    ASSERT_CONTAINS(l, "up to 96000 ms");
    ASSERT_CONTAINS(l, "fix: raise the stream's duplicate_window above 96000 ms");

    char who[160];
    snprintf(who, sizeof(who), "%s/%s", e.win, e.slow);
    line_of("durable.ack_wait", who, l, sizeof(l));
    ASSERT_LEVEL(l, "warn");
    ASSERT_CONTAINS(l, "the ack wait in force is 2000 ms");
    ASSERT_CONTAINS(l, "fix: start the backoff at the ack wait");

    line_of("server.fsync", e.monitor, l, sizeof(l));
    if (strncmp(e.fx.version, "2.9.", 4) == 0) {
        /* 2.9 reports no sync_interval: unknown, never guessed */
        ASSERT_LEVEL(l, "unknown");
        ASSERT_CONTAINS(l, "does not report its sync interval");
    } else {
        ASSERT_LEVEL(l, "warn");
        ASSERT_CONTAINS(l, "syncs to disk lazily, every 120 s");
        ASSERT_CONTAINS(l, "fix: set jetstream { sync_interval: always }");
    }

    /* the same with the relay's timings that fit the 2 s window: no longer an error */
    snprintf(args, sizeof(args),
             "--stream %s --deadline-ms 300 --lease-ms 1300 "
             "--backoff-ms 50:200 --poll-ms 100",
             e.win);
    ASSERT_EQ(doctor(&e, args), 0);
    line_of("stream.duplicate_window", e.win, l, sizeof(l));
    ASSERT_LEVEL(l, "ok");
    ASSERT_CONTAINS(l, "retry horizon of 1900 ms");

    /* --json: one document, the same verdicts */
    snprintf(args, sizeof(args), "--stream %s --durable %s:%s --dlq-subject %sdlq.x --json", e.mem,
             e.win, e.slow, e.root);
    ASSERT_EQ(doctor(&e, args), 78);
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    if (!doc)
        fail_msg("--json output is not JSON (%s): %s", jerr.text, out);
    ASSERT_EQ(json_integer_value(json_object_get(doc, "exit")), 78);
    ASSERT_TRUE(json_integer_value(json_object_get(json_object_get(doc, "summary"), "error")) >= 1);
    bool mem_error = false, fsync_unknown = false;
    json_t *x;
    size_t i;
    json_array_foreach(json_object_get(doc, "results"), i, x)
    {
        const char *check = json_string_value(json_object_get(x, "check"));
        const char *subject = json_string_value(json_object_get(x, "subject"));
        const char *level = json_string_value(json_object_get(x, "level"));
        ASSERT_TRUE(check && subject && level && json_is_string(json_object_get(x, "fix")));
        if (!strcmp(check, "stream.storage") && !strcmp(subject, e.mem))
            mem_error = !strcmp(level, "error");
        if (!strcmp(check, "server.fsync"))
            fsync_unknown = !strcmp(level, "unknown"); /* no --monitor: never guessed */
    }
    ASSERT_TRUE(mem_error);
    ASSERT_TRUE(fsync_unknown);
    json_decref(doc);
    denv_down(&e);
}

/* ---- a sound deployment passes ----------------------------------------------------------- */

static void sound_passes(bool pg)
{
    denv e;
    denv_up(&e, pg);
    char args[1024], l[8192];
    snprintf(args, sizeof(args), "--durable %s:%s --dlq-subject %sdlq.x --monitor %s", e.hot,
             e.sound, e.root, e.monitor);
    int rc = doctor(&e, args);
    if (rc != 0)
        fail_msg("doctor exited %d:\n%s", rc, out);
    ASSERT_CONTAINS(out, " 0 error\n");
    ASSERT_LEVEL(line_of("stream.storage", e.hot, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("stream.replicas", e.hot, l, sizeof(l)), "warn"); /* R1 */
    ASSERT_CONTAINS(l, "one replica");
    ASSERT_LEVEL(line_of("durable.ack_policy", e.sound, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("durable.ack_wait", e.sound, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("durable.inbox_retention", e.sound, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("dlq.stream", e.sound, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("dlq.subjects", e.dlq, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("dlq.storage", e.dlq, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("server.fsync", e.monitor, l, sizeof(l)),
                 e.fx.fsync_always ? "ok" : "unknown");
    ASSERT_LEVEL(line_of("store.schema", NULL, l, sizeof(l)), "ok");
    if (pg) {
        ASSERT_LEVEL(line_of("store.fsync", NULL, l, sizeof(l)), "ok");
        ASSERT_LEVEL(line_of("store.synchronous_commit", NULL, l, sizeof(l)), "ok");
        ASSERT_LEVEL(line_of("store.full_page_writes", NULL, l, sizeof(l)), "ok");
    } else {
        ASSERT_LEVEL(line_of("store.journal_mode", NULL, l, sizeof(l)), "ok");
        ASSERT_LEVEL(line_of("store.synchronous", NULL, l, sizeof(l)), "ok");
        ASSERT_LEVEL(line_of("store.filesystem", NULL, l, sizeof(l)), "ok");
        ASSERT_LEVEL(line_of("store.turn_file", NULL, l, sizeof(l)), "ok");
    }
    /* a retention under the redelivery horizon (30 s x 5) is an error */
    snprintf(args, sizeof(args), "--durable %s:%s --dlq-subject %sdlq.x --inbox-retention 10s",
             e.hot, e.sound, e.root);
    ASSERT_EQ(doctor(&e, args), 78);
    ASSERT_LEVEL(line_of("durable.inbox_retention", e.sound, l, sizeof(l)), "error");
    ASSERT_CONTAINS(l, "redelivery horizon");
    ASSERT_CONTAINS(l, "fix: raise the inbox retention (--inbox-retention) to at least 150000 ms");
    denv_down(&e);
}

/* ---- the store's settings ------------------------------------------------------------------ */

/* The statement of a fix line ("fix: <lead><statement> (in ...)"), run on s. */
static void run_fix(jsd_store *s, const char *line, const char *lead)
{
    const char *fix = strstr(line, lead);
    ASSERT_TRUE(fix != NULL);
    fix += strlen(lead);
    const char *end = strstr(fix, " (in ");
    ASSERT_TRUE(end != NULL);
    char sql[512];
    snprintf(sql, sizeof(sql), "%.*s", (int)(end - fix), fix);
    cenv_store_exec(s, sql);
}

/* PostgreSQL's settled floor (schema 9): an effect below it that no run of
 * receipts covers is claimed by no relay, and ids drawn several at a time
 * per session put effects there. The doctor names both, and its fixes work. */
static void pg_floor_checks(denv *e, jsd_store *s, const char *args)
{
    char sql[512], l[8192];
    ASSERT_EQ(doctor(e, args), 0);
    ASSERT_LEVEL(line_of("store.outbox_floor", NULL, l, sizeof(l)), "ok");
    ASSERT_LEVEL(line_of("store.outbox_ids", NULL, l, sizeof(l)), "ok");
    ASSERT_CONTAINS(l, "sequence cache 1");

    snprintf(sql, sizeof(sql),
             "INSERT INTO jsd_outbox (effect_id, subject, payload) VALUES ('stranded', '%shot.x', "
             "'x')",
             e->root);
    cenv_store_exec(s, sql);
    cenv_store_exec(s, "UPDATE jsd_outbox_floor SET floor = (SELECT max(id) + 1 FROM jsd_outbox), "
                       "gen = gen + 1");
    ASSERT_EQ(doctor(e, args), 0); /* a warning: the relay still publishes the others */
    line_of("store.outbox_floor", NULL, l, sizeof(l));
    ASSERT_LEVEL(l, "warn");
    ASSERT_CONTAINS(l, "1 unpublished effect(s) below the outbox's settled floor");
    ASSERT_CONTAINS(l, "no relay claims them");
    run_fix(s, l, "fix: let the relay find them: ");
    ASSERT_EQ(doctor(e, args), 0);
    ASSERT_LEVEL(line_of("store.outbox_floor", NULL, l, sizeof(l)), "ok");

    cenv_store_exec(s, "ALTER TABLE jsd_outbox ALTER COLUMN id SET CACHE 20");
    ASSERT_EQ(doctor(e, args), 78);
    line_of("store.outbox_ids", NULL, l, sizeof(l));
    ASSERT_LEVEL(l, "error");
    ASSERT_CONTAINS(l, "hands each session 20 ids at a time");
    run_fix(s, l, "fix: ");
    ASSERT_EQ(doctor(e, args), 0);
    ASSERT_LEVEL(line_of("store.outbox_ids", NULL, l, sizeof(l)), "ok");
}

static void store_checks(bool pg)
{
    denv e;
    denv_up(&e, pg);
    char args[256], l[8192];
    snprintf(args, sizeof(args), "--stream %s", e.hot);
    jsd_store *s = rt_open(&e.st);
    if (pg) {
        /* a setting of the database reaches every new connection */
        char sql[512];
        const char *db = strrchr(e.st.url, '/') + 1;
        snprintf(sql, sizeof(sql), "ALTER DATABASE \"%.*s\" SET synchronous_commit = off",
                 (int)strcspn(db, "?"), db);
        cenv_store_exec(s, sql);
        ASSERT_EQ(doctor(&e, args), 78);
        line_of("store.synchronous_commit", NULL, l, sizeof(l));
        ASSERT_LEVEL(l, "error");
        ASSERT_CONTAINS(l, "fix: set synchronous_commit = on");
        snprintf(sql, sizeof(sql), "ALTER DATABASE \"%.*s\" RESET synchronous_commit",
                 (int)strcspn(db, "?"), db);
        cenv_store_exec(s, sql);
        pg_floor_checks(&e, s, args);
    }
    ASSERT_EQ(doctor(&e, args), 0);
    if (!pg) {
        /* a turn file that cannot be opened costs fairness, not commits: a
         * warning with the reason, and the doctor still passes */
        char turn[2048];
        snprintf(turn, sizeof(turn), "%s-jsdturn", e.st.url + strlen("sqlite:"));
        ASSERT_EQ(unlink(turn), 0);
        ASSERT_EQ(mkdir(turn, 0700), 0);
        ASSERT_EQ(doctor(&e, args), 0);
        line_of("store.turn_file", NULL, l, sizeof(l));
        ASSERT_LEVEL(l, "warn");
        ASSERT_CONTAINS(l, "cannot be opened (Is a directory)");
        ASSERT_CONTAINS(l, "do not take turns");
        ASSERT_EQ(rmdir(turn), 0);
    }
    /* a store newer than this binary is refused, naming the check */
    cenv_store_exec(s, "INSERT INTO jsd_schema_version (version, applied_at) VALUES (99, 0)");
    jsd_store_close(s);
    ASSERT_EQ(doctor(&e, args), 78);
    ASSERT_CONTAINS(out, "error store.schema");
    ASSERT_CONTAINS(out, "upgrade jsdurable");
    denv_down(&e);
}

/* ---- relay and consume refuse the unsound deployment --------------------------------------- */

static void relay_refuses(bool pg)
{
    denv e;
    denv_up(&e, pg);
    jsd_store *s = rt_open(&e.st);
    char subj[128], cmd[2048], l[8192];
    snprintf(subj, sizeof(subj), "%smem.a", e.root);
    rt_enqueue(s, &(rt_enqueue_opts){.subject = subj, .n = 3});
    jsd_store_close(s);
    const char *bin = jsd_fx_bin("jsdurable");
    snprintf(cmd, sizeof(cmd), "%s relay --store '%s' --nats %s --until-idle", bin, e.st.url,
             e.fx.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "refused by check stream.storage");
    ASSERT_CONTAINS(out, "memory storage");
    ASSERT_CONTAINS(out, "--allow-unsafe");
    ASSERT_EQ(rt_stream_count(&e.nt, e.mem), 0);
    ASSERT_EQ(rt_published(&e.st), 0);
    /* an unknown check name is a usage error */
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --allow-unsafe "
             "stream.nonsense",
             bin, e.st.url, e.fx.url);
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 64);
    ASSERT_CONTAINS(out, "unknown check \"stream.nonsense\"");
    /* named, the check lets it run, loudly */
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --allow-unsafe "
             "stream.storage",
             bin, e.st.url, e.fx.url);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("relay --allow-unsafe exited %d:\n%s", rc, out);
    ASSERT_CONTAINS(out, "WARNING: running although check stream.storage fails");
    ASSERT_CONTAINS(out, "WARNING: --allow-unsafe stream.storage");
    snprintf(l, sizeof(l), "warning: stream.replicas (%s)", e.mem); /* R1: a warning only */
    ASSERT_CONTAINS(out, l);
    ASSERT_EQ(rt_stream_count(&e.nt, e.mem), 3);
    ASSERT_EQ(rt_published(&e.st), 3);
    /* in a JSON-mode run the start-up warnings are JSON lines like every
     * other (they were plain text between them); one more effect, so the
     * start-up checks look at its stream */
    s = rt_open(&e.st);
    rt_enqueue(s, &(rt_enqueue_opts){.subject = subj, .n = 1, .id_prefix = "json"});
    jsd_store_close(s);
    snprintf(cmd, sizeof(cmd),
             "%s relay --store '%s' --nats %s --until-idle --allow-unsafe stream.storage "
             "--log-format json",
             bin, e.st.url, e.fx.url);
    rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("relay --log-format json exited %d:\n%s", rc, out);
    int warns = 0;
    for (char *line = out, *nl; *line; line = nl ? nl + 1 : line + strlen(line)) {
        if ((nl = strchr(line, '\n')) != NULL)
            *nl = '\0';
        if (!*line)
            continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o || !json_is_string(json_object_get(o, "msg")))
            fail_msg("not a JSON log line: %s", line);

        const char *lv = json_string_value(json_object_get(o, "level"));
        const char *msg = json_string_value(json_object_get(o, "msg"));
        if (lv && !strcmp(lv, "warn") &&
            (strstr(msg, "WARNING: running although check stream.storage") ||
             strstr(msg, "WARNING: --allow-unsafe") || strstr(msg, "warning: stream.replicas")))
            warns++;
        json_decref(o);
    }
    if (warns != 3)
        fail_msg("%d of the 3 start-up warnings as JSON lines at level warn", warns);
    denv_down(&e);
}

static void consume_refuses(bool pg)
{
    cenv e;
    cenv_up(&e, pg);
    /* the consumed stream becomes a memory stream on the same subjects */
    ASSERT_EQ(js_DeleteStream(e.js, e.stream, NULL, NULL), NATS_OK);
    rt_nats nt = {e.nc, e.js};
    char subj[128];
    snprintf(subj, sizeof(subj), "%s.>", e.prefix);
    add_stream(&nt, e.stream, subj, true, 0);
    cenv_store_exec(e.store, "CREATE TABLE sink(body TEXT)");
    cenv_publish(&e, 1, 5, NULL);
    char cmd[4096];
    const char *fmt = "%s consume --store '%s' --nats %s --stream %s --durable %s --until-idle "
                      "--sql 'INSERT INTO sink(body) VALUES (:payload)' %s";
    snprintf(cmd, sizeof(cmd), fmt, jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(),
             e.stream, e.durable, "");
    ASSERT_EQ(jsd_test_run(cmd, out, sizeof(out)), 78);
    ASSERT_CONTAINS(out, "refused by check stream.storage");
    ASSERT_CONTAINS(out, "fix: recreate the stream with file storage");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink"), 0);
    /* refused before the durable is created: a refused configuration creates nothing */
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_PTR_EQ(ci, NULL);
    snprintf(cmd, sizeof(cmd), fmt, jsd_fx_bin("jsdurable"), e.store_url, jsd_fx_shared_nats_url(),
             e.stream, e.durable, "--allow-unsafe stream.storage");
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("consume --allow-unsafe exited %d:\n%s", rc, out);
    ASSERT_CONTAINS(out, "WARNING: running although check stream.storage fails");
    ASSERT_CONTAINS(out, "5 committed");
    ASSERT_EQ(cenv_store_scalar(e.store, "SELECT COUNT(*) FROM sink"), 5);
    cenv_down(&e);
}

/* ---- the traps of newer servers (2.12+) ----------------------------------------------------- */

/* A stream created raw, with the JSON fields nats.c 3.4.1 does not know. */
static void add_stream_raw(natsConnection *nc, const char *name, const char *subject,
                           const char *extra)
{
    char api[160], body[512];
    snprintf(api, sizeof(api), "$JS.API.STREAM.CREATE.%s", name);
    snprintf(body, sizeof(body), "{\"name\":\"%s\",\"subjects\":[\"%s\"],\"storage\":\"file\"%s}",
             name, subject, extra);
    natsMsg *reply = NULL;
    natsStatus s = natsConnection_RequestString(&reply, nc, api, body, 5000);
    if (s != NATS_OK || strstr(natsMsg_GetData(reply), "\"error\""))
        fail_msg("creating stream %s: %s %s", name, natsStatus_GetText(s),
                 reply ? natsMsg_GetData(reply) : "");
    natsMsg_Destroy(reply);
}

/* How many of the server's streams have a name starting with prefix. */
static int streams_named(denv *e, const char *prefix)
{
    natsMsg *reply = NULL;
    ASSERT_EQ(natsConnection_RequestString(&reply, e->nt.nc, "$JS.API.STREAM.NAMES", "{}", 5000),
              NATS_OK);
    int n = jsd_test_count(natsMsg_GetData(reply), prefix);
    natsMsg_Destroy(reply);
    return n;
}

/* persist_mode "async" is an error; a relay stream without allow_atomic on
 * a server whose atomic batches take message ids is a warning (found by a
 * probe whose stream is gone afterwards); one with it is ok. */
static void new_server_traps(void **state)
{
    (void)state;
    denv e;
    denv_up(&e, false);
    if (!jsd_test_version_at_least(e.fx.version, 2, 12)) {
        char v[32];
        snprintf(v, sizeof(v), "%s", e.fx.version);
        denv_down(&e);
        jsd_test_skip_because("nats-server %s has neither persist_mode nor atomic batches "
                              "(2.12+); server_without_atomic_batches runs there",
                              v);
    }
    char async[64], atom[64], subj[128], args[1024], l[8192];
    snprintf(async, sizeof(async), "%s", jsd_test_unique("ASYNC"));
    snprintf(atom, sizeof(atom), "%s", jsd_test_unique("ATOM"));
    snprintf(subj, sizeof(subj), "%sasync.>", e.root);
    add_stream_raw(e.nt.nc, async, subj, ",\"persist_mode\":\"async\"");
    snprintf(subj, sizeof(subj), "%satom.>", e.root);
    add_stream_raw(e.nt.nc, atom, subj, ",\"allow_atomic\":true");

    snprintf(args, sizeof(args), "--stream %s --stream %s --stream %s --monitor %s", async, atom,
             e.hot, e.monitor);
    ASSERT_EQ(doctor(&e, args), 78);
    line_of("stream.persist_mode", async, l, sizeof(l));
    ASSERT_LEVEL(l, "error");
    ASSERT_CONTAINS(l, "acknowledges a message before it is stored");
    ASSERT_CONTAINS(l, "fix: recreate the stream with the default persist mode");
    ASSERT_LEVEL(line_of("stream.persist_mode", e.hot, l, sizeof(l)), "ok");

    line_of("stream.allow_atomic", e.hot, l, sizeof(l));
    ASSERT_LEVEL(l, "warn");
    ASSERT_CONTAINS(l, "stores them with message ids");
    ASSERT_CONTAINS(l, "fix: set \"allow_atomic\": true");
    ASSERT_LEVEL(line_of("stream.allow_atomic", atom, l, sizeof(l)), "ok");
    ASSERT_EQ(streams_named(&e, "JSD_PROBE_"), 0);

    line_of("server.version", e.fx.version, l, sizeof(l));
    ASSERT_LEVEL(l, "ok");
    ASSERT_CONTAINS(l, "no known JetStream data-loss defect");

    /* reconcile through a topology turns allow_atomic on: the warning goes */
    char topo[PATH_MAX], json[1024], cmd[PATH_MAX * 2 + 512];
    snprintf(topo, sizeof(topo), "%s/atomic-topology.json", jsd_test_dir());
    snprintf(json, sizeof(json),
             "{\"streams\":[{\"name\":\"%s\",\"subjects\":[\"%shot.>\"],"
             "\"allow_atomic\":true}]}",
             e.hot, e.root);
    FILE *f = fopen(topo, "w");
    ASSERT_TRUE(f != NULL);
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s provision --nats %s --file %s --policy reconcile",
             jsd_fx_bin("jsdurable"), e.fx.url, topo);
    int rc = jsd_test_run(cmd, out, sizeof(out));
    if (rc != 0)
        fail_msg("provision exited %d:\n%s", rc, out);
    snprintf(args, sizeof(args), "--stream %s", e.hot);
    ASSERT_EQ(doctor(&e, args), 0);
    ASSERT_LEVEL(line_of("stream.allow_atomic", e.hot, l, sizeof(l)), "ok");
    denv_down(&e);
}

/* Debian 12's nats-server 2.9.10 has no atomic batches: the probe finds
 * that out (the batch headers ignored) and says so without a warning. */
static void server_without_atomic_batches(void **state)
{
    (void)state;
    denv e;
    denv_up(&e, false);
    if (jsd_test_version_at_least(e.fx.version, 2, 12)) {
        char v[32];
        snprintf(v, sizeof(v), "%s", e.fx.version);
        denv_down(&e);
        jsd_test_skip_because("nats-server %s has atomic batches; the compatibility lane "
                              "(Debian 12's 2.9.10) runs this case",
                              v);
    }
    char args[256], l[8192];
    snprintf(args, sizeof(args), "--stream %s", e.hot);
    ASSERT_EQ(doctor(&e, args), 0);
    line_of("stream.allow_atomic", e.hot, l, sizeof(l));
    ASSERT_LEVEL(l, "ok");
    ASSERT_CONTAINS(l, "has no atomic batch publish");
    ASSERT_LEVEL(line_of("stream.persist_mode", e.hot, l, sizeof(l)), "ok");
    ASSERT_EQ(streams_named(&e, "JSD_PROBE_"), 0);
    denv_down(&e);
}

/* An R3 stream on nodes that sync lazily is a warning: replicas do not
 * stand in for fsync. */
static void replicas_do_not_stand_in_for_fsync(void **state)
{
    (void)state;
    jsd_fx_cluster c;
    ASSERT_EQ(setenv("JSD_FX_FSYNC", "default", 1), 0);
    int rc = jsd_fx_cluster_start(&c);
    unsetenv("JSD_FX_FSYNC");
    ASSERT_EQ(rc, 0);
    if (!jsd_test_version_at_least(c.node[0].version, 2, 10)) {
        char v[32];
        snprintf(v, sizeof(v), "%s", c.node[0].version);
        jsd_fx_cluster_stop(&c);
        jsd_test_skip_because("nats-server %s reports no fsync policy (sync_interval: 2.10+)", v);
    }
    rt_nats nt;
    rt_nats_open(&nt, c.node[0].url);
    char name[64], subj[128], cmd[2048], l[8192];
    snprintf(name, sizeof(name), "%s", jsd_test_unique("R3"));
    snprintf(subj, sizeof(subj), "%s.>", jsd_test_unique("r3"));
    add_stream_raw(nt.nc, name, subj, ",\"num_replicas\":3");
    rt_store st;
    rt_store_new(&st, RT_SQLITE);
    jsd_store_close(rt_open(&st)); /* creates the schema */
    snprintf(cmd, sizeof(cmd),
             "%s doctor --store '%s' --nats %s --stream %s --monitor http://127.0.0.1:%d",
             jsd_fx_bin("jsdurable"), st.url, c.node[0].url, name, c.node[0].monitor_port);
    rc = jsd_test_run(cmd, out, sizeof(out));
    rt_store_close(&st);
    line_of("stream.replicas_fsync", name, l, sizeof(l));
    ASSERT_LEVEL(l, "warn");
    ASSERT_CONTAINS(l, "3 replicas on servers that sync to disk lazily");
    ASSERT_CONTAINS(l, "Jepsen");
    ASSERT_CONTAINS(l, "fix: set jetstream { sync_interval: always } on every node");
    ASSERT_LEVEL(line_of("stream.replicas", name, l, sizeof(l)), "ok");
    rt_nats_close(&nt);
    ASSERT_EQ(jsd_fx_cluster_stop(&c), 0);
}

BOTH(unsound_reported)
BOTH(sound_passes)
BOTH(store_checks)
BOTH(relay_refuses)
BOTH(consume_refuses)

#define T(fn) cmocka_unit_test(fn##_sqlite), cmocka_unit_test(fn##_pg)

JSD_TEST_MAIN(T(unsound_reported), T(sound_passes), T(store_checks), T(relay_refuses),
              T(consume_refuses), cmocka_unit_test(new_server_traps),
              cmocka_unit_test(server_without_atomic_batches),
              cmocka_unit_test(replicas_do_not_stand_in_for_fsync))
