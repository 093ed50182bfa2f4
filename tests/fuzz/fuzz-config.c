/* SPDX-License-Identifier: MIT */
/* fuzz-config.c — brokerd's configuration reader: any bytes as a config file, then validation and
 * dump. Beyond "no crash, no leak" it checks that a dump reads back to the same dump. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "brokerd/config-files.h"
#include "fuzz.h"

static char *dump(const BrokerConfig *c, size_t *ret_size) {
        char *buf = NULL;
        FILE *f = open_memstream(&buf, ret_size);
        if (!f)
                abort();
        conf_dump(c, f);
        if (fclose(f) != 0)
                abort();
        return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        BrokerConfig *c = NULL, *again = NULL, *validated = NULL;
        ConfErrors errors = {};
        size_t a_size = 0, b_size = 0;
        char *a, *b;

        FILE *null = fopen("/dev/null", "we");
        if (!null)
                abort();

        if (conf_new(&c) < 0)
                abort();
        (void) config_parse_buffer(c, (const char *) data, size, "fuzz.conf", &errors);
        (void) conf_validate(c, &errors);
        conf_errors_print(&errors, null);
        conf_errors_done(&errors);

        /* Whatever was accepted, valid or not, must survive conf_dump() → reader → conf_dump(). */
        a = dump(c, &a_size);
        if (conf_new(&again) < 0)
                abort();
        if (config_parse_buffer(again, a, a_size, "dump", &errors) != 0) {
                conf_errors_print(&errors, stderr);
                fprintf(stderr, "--- dump that does not read back:\n%s", a);
                abort();
        }
        b = dump(again, &b_size);
        if (a_size != b_size || memcmp(a, b, a_size) != 0) {
                fprintf(stderr, "--- dump:\n%s--- read back and dumped again:\n%s", a, b);
                abort();
        }
        conf_errors_done(&errors);

        /* The loader's own path: parse + validate in one, all or nothing. */
        if (config_load_buffer((const char *) data, size, "fuzz.conf", &validated, &errors) == 0) {
                if (!validated || errors.n_errors != 0 || conf_validate(validated, NULL) != 0)
                        abort();
                conf_dump(validated, null);
        } else if (validated || (errors.n_errors == 0 && errors.n_dropped == 0))
                abort(); /* a failure must say why and return nothing */

        conf_errors_done(&errors);
        conf_free(validated);
        conf_free(again);
        conf_free(c);
        free(a);
        free(b);
        fclose(null);
        return 0;
}
