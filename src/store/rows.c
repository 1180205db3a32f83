/*
 * What the store's front (store.c) and its back ends (sqlite.c, postgres.c)
 * share below the back-end interface: the error recorder of a store handle,
 * the store id a new schema records, the headers column codec and the batch
 * of claimed effects a back end fills from the rows it reads (one
 * jsd__claimed_row per row), and the freeing of the poison records a back
 * end reads. Nothing here runs SQL or decides policy, so the
 * back ends include only backend.h and rows.h and never call up into the
 * front.
 *
 * Headers column encoding (version 1), NULL when an effect has no headers:
 *   u8 version (1), u8 count, then per header:
 *   u8 name length, name bytes, u16 big-endian value length, value bytes.
 * The claim hands over either that column or the headers_json one (schema 4,
 * the form a foreign writer uses: docs/SQL-CONTRACT.md): JSON text never
 * starts with byte 1, so the first byte tells them apart (one that starts
 * neither is an undecodable headers column).
 */
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "store/backend.h"

#define HEADERS_ENC_VERSION 1

/* ---- errors and identity --------------------------------------------------------------- */

jsd_status jsd__store_err(jsd_store *st, jsd_status s, const char *fmt, ...)
{
    va_list ap;
    jsd_error_clear(&st->err);
    va_start(ap, fmt);
    jsd__verr(&st->err, s, fmt, ap);
    va_end(ap);
    return s;
}

jsd_status jsd__store_new_id(jsd_store *s, char out[33])
{
    if (!jsd__random_hex(out, 16))
        return jsd__store_err(s, JSD_ERR_INTERNAL,
                              "cannot draw a random store id (the system's random source failed)");
    return JSD_OK;
}

/* ---- headers encoding --------------------------------------------------------------- */

size_t jsd__headers_encoded_size(const jsd_header *h, size_t n)
{
    size_t sz = 2;
    for (size_t i = 0; i < n; i++)
        sz += 1 + strlen(h[i].name) + 2 + strlen(h[i].value);
    return sz;
}

void jsd__headers_encode(const jsd_header *h, size_t n, unsigned char *out)
{
    size_t o = 0;
    out[o++] = HEADERS_ENC_VERSION;
    out[o++] = (unsigned char)n;
    for (size_t i = 0; i < n; i++) {
        size_t nl = strlen(h[i].name), vl = strlen(h[i].value);
        out[o++] = (unsigned char)nl;
        memcpy(out + o, h[i].name, nl);
        o += nl;
        out[o++] = (unsigned char)(vl >> 8);
        out[o++] = (unsigned char)(vl & 0xff);
        memcpy(out + o, h[i].value, vl);
        o += vl;
    }
}

/* Walk the encoding: total bytes of strings (with NULs) and header count, or
 * SIZE_MAX when malformed. */
static size_t headers_walk(const unsigned char *enc, size_t len, size_t *n_headers)
{
    *n_headers = 0;
    if (!enc || len == 0)
        return 0;
    if (len < 2 || enc[0] != HEADERS_ENC_VERSION)
        return SIZE_MAX;
    size_t n = enc[1], o = 2, strings = 0;
    for (size_t i = 0; i < n; i++) {
        if (o + 1 > len)
            return SIZE_MAX;
        size_t nl = enc[o++];
        if (o + nl + 2 > len)
            return SIZE_MAX;
        o += nl;
        size_t vl = ((size_t)enc[o] << 8) | enc[o + 1];
        o += 2;
        if (o + vl > len)
            return SIZE_MAX;
        o += vl;
        strings += nl + 1 + vl + 1;
    }
    if (o != len)
        return SIZE_MAX;
    *n_headers = n;
    return strings;
}

size_t jsd__headers_decoded_size(const unsigned char *enc, size_t len, size_t *n_headers)
{
    size_t strings = headers_walk(enc, len, n_headers);
    if (strings == SIZE_MAX)
        return SIZE_MAX;
    return *n_headers * sizeof(jsd_header) + strings;
}

bool jsd__headers_decode(const unsigned char *enc, size_t len, jsd_header *out, char *strings)
{
    size_t n;
    if (headers_walk(enc, len, &n) == SIZE_MAX)
        return false;
    size_t o = 2;
    for (size_t i = 0; i < n; i++) {
        size_t nl = enc[o++];
        memcpy(strings, enc + o, nl);
        strings[nl] = '\0';
        out[i].name = strings;
        strings += nl + 1;
        o += nl;
        size_t vl = ((size_t)enc[o] << 8) | enc[o + 1];
        o += 2;
        memcpy(strings, enc + o, vl);
        strings[vl] = '\0';
        out[i].value = strings;
        strings += vl + 1;
        o += vl;
    }
    return true;
}

/* ---- batches ------------------------------------------------------------------------ */

/* The rows of a batch are carved from chunks the batch owns: a relay claims
 * a batch every few hundred microseconds under load, and one allocation per
 * row (freed on the receipt writer's thread) cost it about a tenth of its
 * CPU in malloc and in the heap trimming and page faults that followed
 * (issue 12). A cleared batch keeps its first chunks, up to
 * BATCH_KEEP_BYTES, so a recycled batch claims without allocating and
 * a batch of large payloads does not hold their memory afterwards. */
#define CHUNK_BYTES      (64 * 1024)
#define BATCH_KEEP_BYTES (512 * 1024)
#define CHUNK_ALIGN      16

typedef struct jsd__batch_chunk {
    struct jsd__batch_chunk *next;
    size_t cap, used;
    _Alignas(CHUNK_ALIGN) unsigned char data[];
} chunk;

static void *arena_alloc(jsd__effect_batch *b, size_t n)
{
    n = (n + CHUNK_ALIGN - 1) & ~(size_t)(CHUNK_ALIGN - 1);
    chunk *c = b->arena_cur ? b->arena_cur : b->arena, *last = NULL;
    /* after the current chunk, every chunk is unused */
    for (; c; last = c, c = c->next)
        if (c->cap - c->used >= n)
            break;
    if (!c) {
        size_t cap = n > CHUNK_BYTES ? n : CHUNK_BYTES;
        if (!(c = jsd__malloc(sizeof(chunk) + cap)))
            return NULL;
        c->next = NULL;
        c->cap = cap;
        c->used = 0;
        if (last)
            last->next = c;
        else
            b->arena = c;
    }
    b->arena_cur = c;
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void jsd__effect_batch_init(jsd__effect_batch *b)
{
    memset(b, 0, sizeof(*b));
}

void jsd__effect_batch_clear(jsd__effect_batch *b)
{
    if (!b)
        return;
    size_t kept = 0;
    chunk **link = &b->arena;
    while (*link) {
        chunk *c = *link;
        if (kept + c->cap <= BATCH_KEEP_BYTES) {
            kept += c->cap;
            c->used = 0;
            link = &c->next;
        } else {
            *link = c->next;
            jsd__free(c);
        }
    }
    b->arena_cur = b->arena;
    b->n = 0;
}

void jsd__effect_batch_free(jsd__effect_batch *b)
{
    if (!b)
        return;
    for (chunk *c = b->arena, *next; c; c = next) {
        next = c->next;
        jsd__free(c);
    }
    jsd__free(b->items);
    memset(b, 0, sizeof(*b));
}

size_t jsd__effect_batch_held_bytes(const jsd__effect_batch *b)
{
    size_t n = 0;
    for (const chunk *c = b->arena; c; c = c->next)
        n += c->cap;
    return n;
}

/* A byte JSON text can start with: never the encoding's version byte. */
static bool json_start(unsigned char c)
{
    return c == '{' || c == '[' || c == '"' || c == '-' || (c >= '0' && c <= '9') || c == 't' ||
           c == 'f' || c == 'n' || c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool msg_id_printable(const char *m)
{
    for (; *m; m++)
        if ((unsigned char)*m <= 0x20 || (unsigned char)*m >= 0x7f)
            return false;
    return true;
}

/* The rules a row written without the library may break (its constraints
 * absent or bypassed): named in the defect, the relay dead-letters it. The
 * subject is the relay's own check (relay_claim.c). */
static void check_claimed(jsd__claimed *c, const jsd__claimed_row *r)
{
    jsd_error err;
    jsd_error_clear(&err);
    size_t own = r->owner ? r->owner_len : 0;
    if (strlen(c->owner) != own || strlen(c->effect_id) != r->id_len ||
        (c->order_key && strlen(c->order_key) != r->order_key_len))
        jsd__snprintf(c->defect, sizeof(c->defect),
                      "its owner, effect_id or order_key holds a NUL");
    else if (jsd__effect_check_ident("id", c->effect_id, true, &err) != JSD_OK ||
             jsd__effect_check_ident("owner", c->owner, false, &err) != JSD_OK ||
             jsd__effect_check_ident("order_key", c->order_key, false, &err) != JSD_OK)
        jsd__snprintf(c->defect, sizeof(c->defect), "%.150s", err.msg);
    else if (c->order_key && !*c->order_key)
        jsd__snprintf(c->defect, sizeof(c->defect), "its order_key is empty (NULL is unordered)");
    else if (!msg_id_printable(c->msg_id))
        jsd__snprintf(c->defect, sizeof(c->defect),
                      "its msg_id holds a byte outside printable ASCII (or a space)");
    else if (r->len > JSD_PAYLOAD_DEFAULT_CAP)
        jsd__snprintf(c->defect, sizeof(c->defect),
                      "its payload is %zu bytes; the limit is %d (JSD_PAYLOAD_DEFAULT_CAP)", r->len,
                      JSD_PAYLOAD_DEFAULT_CAP);
}

jsd_status jsd__batch_add(jsd__effect_batch *b, const jsd__claimed_row *r)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        jsd__claimed *items = jsd__realloc(b->items, cap * sizeof(*items));
        if (!items)
            return JSD_ERR_NOMEM;
        b->items = items;
        b->cap = cap;
    }
    const unsigned char *henc = r->headers;
    size_t henc_len = r->headers_len;
    unsigned char *from_json = NULL;
    jsd_error jerr; /* read only when bad_json */
    bool bad_json = false;
    if (henc && henc_len && json_start(henc[0])) {
        jsd_error_clear(&jerr);
        jsd_status js = jsd__headers_from_json(henc, henc_len, &from_json, &henc_len, &jerr);
        if (js == JSD_ERR_NOMEM)
            return js;
        bad_json = js != JSD_OK;
        henc = from_json;
        if (bad_json)
            henc_len = 0;
    }
    size_t nh = 0;
    size_t hsz = jsd__headers_decoded_size(henc, henc_len, &nh);
    bool bad_headers = hsz == SIZE_MAX;
    if (bad_headers) {
        /* Claimed anyway, without headers and marked: the relay dead-letters
         * it, and the other effects of the claim go on. */
        hsz = 0;
        nh = 0;
    }
    size_t total = hsz + r->owner_len + 1 + r->id_len + 1 + r->subject_len + 1 +
                   (r->order_key ? r->order_key_len + 1 : 0) + r->len;
    char *blk = arena_alloc(b, total);
    if (!blk) {
        jsd__free(from_json);
        return JSD_ERR_NOMEM;
    }
    jsd__claimed *c = &b->items[b->n];
    memset(c, 0, sizeof(*c));
    char *p = blk;
    jsd_header *hdrs = (jsd_header *)(void *)p;
    p += nh * sizeof(jsd_header);
    size_t strings = hsz - nh * sizeof(jsd_header);
    if (nh && !jsd__headers_decode(henc, henc_len, hdrs, p)) {
        bad_headers = true;
        nh = 0;
    }
    jsd__free(from_json);
    if (bad_json)
        jsd__snprintf(c->defect, sizeof(c->defect), "its %.150s", jerr.msg);
    else if (bad_headers)
        jsd__snprintf(c->defect, sizeof(c->defect),
                      "its headers column (%zu bytes) cannot be decoded", r->headers_len);
    p += strings;
    c->headers = nh ? hdrs : NULL;
    c->n_headers = nh;
#define COPYSTR(dst, src, n)                                                                       \
    do {                                                                                           \
        memcpy(p, (src), (n));                                                                     \
        p[(n)] = '\0';                                                                             \
        (dst) = p;                                                                                 \
        p += (n) + 1;                                                                              \
    } while (0)
    COPYSTR(c->owner, r->owner ? r->owner : "", r->owner ? r->owner_len : 0);
    COPYSTR(c->effect_id, r->effect_id, r->id_len);
    COPYSTR(c->subject, r->subject, r->subject_len);
    if (r->order_key)
        COPYSTR(c->order_key, r->order_key, r->order_key_len);
#undef COPYSTR
    if (r->len) {
        memcpy(p, r->payload, r->len);
        c->payload = (const unsigned char *)p;
    }
    c->len = r->len;
    c->row_id = r->row_id;
    c->attempts = r->attempts;
    c->created_at_ms = r->created_at;
    c->not_before_ms = r->not_before;
    c->maybe_published = r->maybe_published;
    c->first_attempt_ms = r->first_attempt_at;
    if (r->msg_id_len < JSD_MSG_ID_MAX) {
        if (r->msg_id_len)
            memcpy(c->msg_id, r->msg_id, r->msg_id_len);
        c->msg_id[r->msg_id_len] = '\0';
    } else if (!c->defect[0]) {
        jsd__snprintf(c->defect, sizeof(c->defect),
                      "its msg_id column (%zu bytes) exceeds %d bytes", r->msg_id_len,
                      JSD_MSG_ID_MAX - 1);
    }
    if (!c->defect[0])
        check_claimed(c, r);
    b->n++;
    return JSD_OK;
}

static int cmp_claimed(const void *a, const void *b)
{
    int64_t x = ((const jsd__claimed *)a)->row_id, y = ((const jsd__claimed *)b)->row_id;
    return x < y ? -1 : x > y;
}

void jsd__batch_sort(jsd__effect_batch *b)
{
    if (b->n < 2)
        return;
    /* Insertion sort: claims come nearly in order. The items' storage is
     * the batch's arena, so only the items move. */
    for (size_t i = 1; i < b->n; i++) {
        jsd__claimed ci = b->items[i];
        size_t j = i;
        while (j > 0 && cmp_claimed(&b->items[j - 1], &ci) > 0) {
            b->items[j] = b->items[j - 1];
            j--;
        }
        b->items[j] = ci;
    }
}

/* ---- poison records ---------------------------------------------------------------------- */

void jsd__poison_record_clear(jsd__poison_record *r)
{
    if (!r)
        return;
    jsd__free(r->stream);
    jsd__free(r->consumer);
    jsd__free(r->msg_id);
    jsd__free(r->subject);
    jsd__free(r->diagnostic);
    jsd__free(r->headers);
    jsd__free(r->payload);
    jsd__free(r->dlq_stream);
    memset(r, 0, sizeof(*r));
}

void jsd__poison_records_free(jsd__poison_record *r, size_t n)
{
    if (!r)
        return;
    for (size_t i = 0; i < n; i++)
        jsd__poison_record_clear(&r[i]);
    jsd__free(r);
}

bool jsd__receipt_continues(const jsd__receipt *first, const jsd__receipt *prev,
                            const jsd__receipt *next)
{
    return next->row_id == prev->row_id + 1 && next->seq == prev->seq + 1 &&
           next->duplicate == first->duplicate && next->published_at_ms == first->published_at_ms &&
           strcmp(next->stream, first->stream) == 0;
}
