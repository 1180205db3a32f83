/*
 * libFuzzer target for the store's header codec (src/store/store.c): the
 * application headers of an effect are kept in the store as a small binary
 * encoding, and a row read back may have been written by another version or
 * damaged, so decoding takes outside bytes. Arbitrary bytes must either be
 * refused (jsd__headers_decoded_size says SIZE_MAX and jsd__headers_decode
 * says false, always together) or decode into exactly the size announced, with
 * every name and value inside the caller's buffer; and a decoded set whose
 * strings hold no NUL must encode back to the very same bytes.
 *
 * Built and run by `make fuzz` (every fuzz target, linked with the library sources).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsd_int.h"
#include "store/backend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t nh = 0;
    size_t need = jsd__headers_decoded_size(data, size, &nh);
    if (need == SIZE_MAX) {
        jsd_header one;
        char s[1];
        if (jsd__headers_decode(data, size, &one, s)) /* must agree with the size walk */
            abort();
        return 0;
    }
    if (need < nh * sizeof(jsd_header))
        abort();
    /* Exactly the announced size, so ASan catches any write past it. */
    unsigned char *buf = malloc(need ? need : 1);
    if (!buf)
        return 0;
    jsd_header *h = (jsd_header *)(void *)buf;
    char *strings = (char *)buf + nh * sizeof(jsd_header);
    if (!jsd__headers_decode(data, size, h, strings))
        abort();
    int clean = 1;
    size_t strings_len = 0;
    for (size_t i = 0; i < nh; i++) {
        const char *lo = strings, *hi = (const char *)buf + need;
        if (h[i].name < lo || h[i].name >= hi || h[i].value < lo || h[i].value >= hi)
            abort();
        size_t nl = strlen(h[i].name), vl = strlen(h[i].value);
        strings_len += nl + 1 + vl + 1;
        if (nl > 255 || vl > 65535)
            abort(); /* the encoding's own bounds */
        if (h[i].value != h[i].name + nl + 1)
            clean = 0; /* a NUL inside the name: it decodes shorter */
    }
    if (clean && strings_len == need - nh * sizeof(jsd_header) && size > 0) {
        size_t esz = jsd__headers_encoded_size(h, nh);
        if (esz != size)
            abort();
        unsigned char *enc = malloc(esz);
        if (enc) {
            jsd__headers_encode(h, nh, enc);
            if (memcmp(enc, data, esz) != 0)
                abort();
            free(enc);
        }
    }
    free(buf);
    return 0;
}
