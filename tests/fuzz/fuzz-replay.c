/* SPDX-License-Identifier: MIT */
/* fuzz-replay.c — runs a fuzz target's entry point over every file of its corpus, as libFuzzer would
 * replay it, so the corpus is an ordinary test where clang's libFuzzer is absent. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path) {
        FILE *f = fopen(path, "re");
        if (!f) {
                perror(path);
                return -1;
        }
        char *buf = NULL;
        size_t size = 0, allocated = 0;
        for (;;) {
                if (size == allocated) {
                        allocated = allocated ? allocated * 2 : 4096;
                        char *n = realloc(buf, allocated);
                        if (!n) {
                                free(buf);
                                fclose(f);
                                return -1;
                        }
                        buf = n;
                }
                size_t k = fread(buf + size, 1, allocated - size, f);
                if (k == 0)
                        break;
                size += k;
        }
        fclose(f);
        LLVMFuzzerTestOneInput((const uint8_t *) buf, size);
        free(buf);
        return 0;
}

int main(int argc, char **argv) {
        unsigned n = 0;
        for (int i = 1; i < argc; i++) {
                DIR *d = opendir(argv[i]);
                if (!d) {
                        perror(argv[i]);
                        return EXIT_FAILURE;
                }
                struct dirent *de;
                while ((de = readdir(d))) {
                        if (de->d_name[0] == '.')
                                continue;
                        char path[4096];
                        snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
                        if (replay_file(path) < 0) {
                                closedir(d);
                                return EXIT_FAILURE;
                        }
                        n++;
                }
                closedir(d);
        }
        if (n == 0) {
                fprintf(stderr, "no corpus files replayed\n");
                return EXIT_FAILURE;
        }
        printf("replayed %u inputs\n", n);
        return EXIT_SUCCESS;
}
