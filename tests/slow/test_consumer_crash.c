/*
 * Three `jsdurable consume` processes share one durable while the test
 * SIGKILLs and restarts them at random (FIX-3, IN-2, IN-5): 20 000 messages
 * end as exactly one row each in an effects table that has NO unique key, so
 * only the inbox (committed in the same transaction as the row) keeps a
 * redelivered message from being applied twice. Both store back ends.
 * Random kills may all land while no batch sits between its commit and its
 * ACK, so the first consumer process also dies at the crash point
 * ingress.after_commit: at least one committed batch is certainly delivered
 * again, and the inbox must catch it.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "consumer_env.h"

#define N_MSGS  20000
#define N_PROCS 3

typedef struct proc {
    pid_t pid;
    int starts;
} proc;

static pid_t spawn_consumer(cenv *e, int idx, int gen)
{
    char log[512];
    snprintf(log, sizeof(log), "%s/consume-%d-%d.log", jsd_test_dir(), idx, gen);
    const char *argv[] = {jsd_fx_bin("jsdurable"),
                          "consume",
                          "--store",
                          e->store_url,
                          "--nats",
                          jsd_fx_shared_nats_url(),
                          "--stream",
                          e->stream,
                          "--durable",
                          e->durable,
                          "--batch",
                          "64",
                          "--sql",
                          "INSERT INTO effects(seq, body) VALUES (:stream_seq, :payload)",
                          NULL};
    return jsd_test_spawn(argv, log, true, idx == 0 && gen == 0 ? "ingress.after_commit:3" : NULL);
}

static void publish_many(cenv *e, int n)
{
    jsPubOptions po;
    jsPubOptions_Init(&po);
    for (int k = 1; k <= n; k++) {
        char subj[128], body[64], id[64];
        snprintf(subj, sizeof(subj), "%s.%d", e->prefix, k % 16);
        snprintf(body, sizeof(body), "msg-%d", k);
        snprintf(id, sizeof(id), "m-%d", k);
        po.MsgId = id;
        ASSERT_EQ(js_PublishAsync(e->js, subj, body, (int)strlen(body), &po), NATS_OK);
    }
    jsPubOptions_Init(&po);
    po.MaxWait = 60000;
    ASSERT_EQ(js_PublishAsyncComplete(e->js, &po), NATS_OK);
    ASSERT_EQ(cenv_stream_msgs(e, e->stream), n);
}

static void shared_durable_random_kills(bool pg)
{
    cenv e;
    proc p[N_PROCS] = {{0}};
    cenv_up(&e, pg);
    cenv_store_exec(e.store, "CREATE TABLE effects(seq BIGINT, body TEXT)");
    cenv_durable(&e, 2000, 50, 1024, NULL, 0);
    publish_many(&e, N_MSGS);

    for (int i = 0; i < N_PROCS; i++) {
        p[i].pid = spawn_consumer(&e, i, p[i].starts++);
        ASSERT_TRUE(p[i].pid > 0);
    }
    srand((unsigned)getpid());
    int kills = 0;
    int64_t deadline = jsd_test_mono_ms() + 600000;
    /* Kill at random while work remains. */
    while (jsd_test_mono_ms() < deadline) {
        jsd_test_sleep_ms(150 + rand() % 500);
        /* A process that died at its crash point starts again. */
        for (int k = 0; k < N_PROCS; k++)
            if (waitpid(p[k].pid, NULL, WNOHANG) == p[k].pid)
                p[k].pid = spawn_consumer(&e, k, p[k].starts++);
        bool crashed = p[0].starts >= 2;
        long long done = cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM effects");
        if (done >= N_MSGS * 9 / 10 && kills >= 8 && crashed)
            break;
        /* Process 0 is left to reach its crash point before it is killed. */
        int i = crashed ? rand() % N_PROCS : 1 + rand() % (N_PROCS - 1);
        kill(p[i].pid, SIGKILL);
        waitpid(p[i].pid, NULL, 0);
        kills++;
        p[i].pid = spawn_consumer(&e, i, p[i].starts++);
    }
    /* Let the survivors finish: everything applied, nothing pending, nothing in flight. */
    ASSERT_WAIT(cenv_settled(&e) &&
                    cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM effects") == N_MSGS,
                300000);
    for (int i = 0; i < N_PROCS; i++) {
        kill(p[i].pid, SIGTERM);
        int st = 0;
        waitpid(p[i].pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("consumer %d did not drain cleanly (status %d)", i, st);
    }
    long long total = cenv_store_scalar(e.store, "SELECT COUNT(*) FROM effects");
    long long distinct = cenv_store_scalar(e.store, "SELECT COUNT(DISTINCT seq) FROM effects");
    print_message("%d kills, %lld rows, %lld distinct messages\n", kills, total, distinct);
    ASSERT_TRUE(kills >= 8);
    ASSERT_EQ(distinct, N_MSGS);
    ASSERT_EQ(total, N_MSGS); /* exactly once: no unique key helped */
    ASSERT_EQ(cenv_stream_msgs(&e, e.dlq_stream), 0);
    /* Redeliveries did happen (at least the batch committed before the crash
     * point): the inbox, not luck, kept the count. */
    ASSERT_TRUE(p[0].starts >= 2);
    jsConsumerInfo *ci = cenv_info(&e);
    ASSERT_TRUE(ci->Delivered.Consumer > N_MSGS);
    jsConsumerInfo_Destroy(ci);
    cenv_down(&e);
}

static void random_kills_sqlite(void **state)
{
    (void)state;
    shared_durable_random_kills(false);
}

static void random_kills_pg(void **state)
{
    (void)state;
    shared_durable_random_kills(true);
}

JSD_TEST_MAIN(cmocka_unit_test(random_kills_sqlite), cmocka_unit_test(random_kills_pg))
