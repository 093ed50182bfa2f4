/* SPDX-License-Identifier: MIT */
/* fuzz.h — what every fuzz target shares: libFuzzer's entry point, the check that aborts (a finding, which
 * libFuzzer and the corpus replay both report), and, for the readers of the state directory, the input written
 * as a file. */
#pragma once

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fs-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define check(expr)                                                              \
        do {                                                                     \
                if (!(expr)) {                                                   \
                        fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #expr); \
                        abort();                                                 \
                }                                                                \
        } while (0)

/* data as directory/name, replacing what was there. */
static inline void fuzz_write_file(const char *directory, const char *name, const uint8_t *data, size_t size) {
        char path[256];
        check(snprintf(path, sizeof path, "%s/%s", directory, name) < (int) sizeof path);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        check(fd >= 0);
        check(size == 0 || fd_write_all(fd, data, size) == 0);
        close(fd);
}

/* Two private directories for a reader of the state directory: its input's, and the one what it read is written
 * back to; made at the first call, emptied of their file and removed at exit. */
typedef struct FuzzDirs {
        char input[32], output[32];
        const char *file;
} FuzzDirs;

static inline void fuzz_dirs_remove(void);

static inline const FuzzDirs *fuzz_dirs(const char *file) {
        static FuzzDirs d = { "/tmp/fuzz-state.XXXXXX", "/tmp/fuzz-state.XXXXXX" };
        static bool made;
        if (!made) {
                check(mkdtemp(d.input) && mkdtemp(d.output));
                d.file = file;
                atexit(fuzz_dirs_remove);
                made = true;
        }
        return &d;
}

static inline void fuzz_dirs_remove(void) {
        const FuzzDirs *d = fuzz_dirs(NULL);
        const char *dirs[] = { d->input, d->output };
        char path[256];
        for (size_t i = 0; i < 2; i++) {
                snprintf(path, sizeof path, "%s/%s", dirs[i], d->file);
                (void) unlink(path);
                (void) rmdir(dirs[i]);
        }
}
