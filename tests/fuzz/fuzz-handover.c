/* SPDX-License-Identifier: MIT */
/* fuzz-handover.c — the state a stopping brokerd left in systemd's fd store, as the next start reads it
 * (handover_parse()): whatever the bytes, it is refused or read whole, and what is read formats and reads
 * back to the same state. The boot id and the clock are fixed: a corpus file replays alike anywhere. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handover.h"
#include "fuzz.h"

#define BOOT "0123456789abcdef0123456789abcdef"
#define NOW ((usec_t) 1000000 * 1000000)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        Handover h = {}, back = {};
        int r = handover_parse(data, size, BOOT, NOW, &h);
        if (r < 0) {
                check(h.n_connections == 0 && h.n_pools == 0);
                return 0;
        }
        char *text = NULL, *again = NULL;
        size_t n, n_again;
        check(handover_format(&h, BOOT, 1, NOW, &text, &n) == 0);
        check(handover_parse(text, n, BOOT, NOW, &back) == 0);
        check(back.n_connections == h.n_connections && back.n_pools == h.n_pools);
        check(handover_format(&back, BOOT, 1, NOW, &again, &n_again) == 0);
        check(n == n_again && memcmp(text, again, n) == 0);
        free(text);
        free(again);
        handover_done(&h);
        handover_done(&back);
        return 0;
}
