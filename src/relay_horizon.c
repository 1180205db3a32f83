/*
 * relay_horizon — the duplicate-window horizon of each effect (DESIGN 10 in
 * relay.c). JetStream collapses a republication with the first one only
 * inside the stream's duplicate window, counted from when the first one was
 * stored; the relay's retry horizon is checked against that window at every
 * claim (relay_claim.c), but a broker that withholds its PubAcks, or a store
 * that cannot take the receipts, can keep an effect unresolved for longer.
 * The relay knows when an effect's first attempt may have reached the broker
 * (jsd__claimed.first_attempt_ms, kept in the store), so: an attempt that
 * starts more than half the window after it, or receipts held unwritten that
 * long, are logged at warn and counted (jsd_relay_dedup_horizon_at_risk_total),
 * and the failure of such an attempt is retried after the first backoff step
 * rather than the capped one; an attempt that starts past the whole window is
 * a possible duplicate, logged and counted (..._passed_total), and so is its
 * receipt when the broker did not call it a duplicate. Nothing here changes
 * what is published: a late retry is still the only way its message gets in.
 */
#include "jsd_int.h"
#include "relay_int.h"

void jsd__relay_horizon_on_send(jsd_relay *r, slot *sl, const jsd__claimed *e, int64_t window_ms,
                                int64_t now_ms)
{
    sl->window_ms = window_ms;
    if (window_ms <= 0 || e->first_attempt_ms <= 0)
        return;
    int64_t age = now_ms - e->first_attempt_ms;
    if (age >= window_ms) {
        sl->past_window = sl->at_risk = true;
        jsd__relay_count(r, RC_HORIZON_PASSED, 1);
        JSD_WARN(COMP,
                 "effect %s/%s (msg id %s): its first attempt may have reached the broker %lld ms "
                 "ago, past its stream's duplicate window (%lld ms); if that attempt was stored, "
                 "this one is stored again: a possible duplicate",
                 e->owner, e->effect_id, e->msg_id, (long long)age, (long long)window_ms);
    } else if (age >= window_ms / 2) {
        sl->at_risk = true;
        jsd__relay_count(r, RC_HORIZON_AT_RISK, 1);
        JSD_WARN(COMP,
                 "effect %s/%s (msg id %s) is still unresolved %lld ms after its first attempt "
                 "may have reached the broker, past half its stream's duplicate window "
                 "(%lld ms); retrying it before its backoff would",
                 e->owner, e->effect_id, e->msg_id, (long long)age, (long long)window_ms);
    }
}

void jsd__relay_horizon_on_receipt(jsd_relay *r, const slot *sl, const jsd__claimed *e)
{
    (void)r;
    if (sl->past_window && !sl->duplicate)
        JSD_WARN(COMP,
                 "effect %s/%s (msg id %s) is now at stream %s sequence %llu, sent past the "
                 "duplicate window of an earlier attempt: if that attempt was stored too, the "
                 "stream holds it twice",
                 e->owner, e->effect_id, e->msg_id, sl->stream, (unsigned long long)sl->seq);
}

void jsd__relay_horizon_held(jsd_relay *r, rbatch *b, int64_t now_ms)
{
    if (b->held_warned)
        return;
    size_t n = 0;
    int64_t oldest = 0, window = 0;
    for (size_t i = 0; i < b->eb.n; i++) {
        const slot *sl = &b->slots[i];
        if (sl->fate != FATE_RECEIPT || sl->window_ms <= 0)
            continue;
        if (now_ms - sl->acked_ms >= sl->window_ms / 2) {
            n++;
            if (!oldest || sl->acked_ms < oldest) {
                oldest = sl->acked_ms;
                window = sl->window_ms;
            }
        }
    }
    if (n == 0)
        return;
    b->held_warned = true;
    jsd__relay_count(r, RC_HORIZON_AT_RISK, n);
    JSD_WARN(COMP,
             "%zu receipt(s) still unwritten %lld ms after their PubAck, past half the duplicate "
             "window (%lld ms): the store does not answer. They are kept and written when it "
             "does; should this relay stop first, those effects are published again, and past "
             "the window they are stored twice",
             n, (long long)(now_ms - oldest), (long long)window);
}
