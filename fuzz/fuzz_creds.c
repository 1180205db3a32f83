/*
 * libFuzzer target for the creds file reader (src/nkeys.c: jsd__creds_jwt_in,
 * which finds the user JWT that jsdurable hands nats.c at each connection).
 * A creds file is outside text that also holds the user's seed, so besides
 * never crashing or leaking memory:
 * - a JWT found is one whole line of the input, without CR or LF, shaped as
 *   a JWT (three base64url parts joined by two dots);
 * - it is never the seed: no text without two dots is returned;
 * - nothing is found when the input has no line framed by two header lines
 *   (lines ending in "---" with "---" before).
 *
 * Input: the file's text. Built and run by `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "jsd_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), *jwt = NULL;
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    jsd_status st = jsd__creds_jwt_in(text, &jwt);
    if (st == JSD_OK) {
        size_t n = strlen(jwt), dots = 0;
        if (n == 0 || strpbrk(jwt, "\r\n") || !strstr(text, jwt))
            abort();
        for (size_t i = 0; i < n; i++) {
            if (jwt[i] == '.')
                dots++;
            else if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=",
                             jwt[i]))
                abort();
        }
        if (dots != 2 || !strstr(text, "---"))
            abort();
    } else if (jwt || (st != JSD_ERR_CONFIG && st != JSD_ERR_NOMEM)) {
        abort();
    }
    free(jwt);
    free(text);
    return 0;
}
