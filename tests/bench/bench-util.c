/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"

uint64_t bench_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

int bench_connect(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        if (connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

int bench_connect_when_listening(const char *path) {
        int fd = -ECONNREFUSED;
        for (int i = 0; i < 500 && fd < 0; i++) {
                fd = bench_connect(path);
                if (fd < 0)
                        usleep(10000); /* brokerd is starting: nothing to wait on but its socket */
        }
        return fd;
}

const char *bench_loadavg(char *buf, size_t size) {
        FILE *f = fopen("/proc/loadavg", "re");
        if (!f || !fgets(buf, (int) size, f))
                snprintf(buf, size, "?");
        if (f)
                fclose(f);
        buf[strcspn(buf, "\n")] = '\0';
        return buf;
}

uint64_t bench_process_cpu_ns(pid_t pid, bool main_only) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/task", (int) pid);
        DIR *d = opendir(path);
        uint64_t sum = 0;
        if (!d)
                return 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.' || (main_only && atoi(de->d_name) != (int) pid))
                        continue;
                char p[300];
                unsigned long long ns = 0;
                snprintf(p, sizeof p, "/proc/%d/task/%s/schedstat", (int) pid, de->d_name);
                FILE *f = fopen(p, "re");
                if (f) {
                        if (fscanf(f, "%llu", &ns) == 1)
                                sum += ns;
                        fclose(f);
                }
        }
        closedir(d);
        return sum;
}

long bench_process_status_kib(pid_t pid, const char *field) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", (int) pid);
        FILE *f = fopen(path, "re");
        long v = -1;
        if (!f)
                return -1;
        size_t n = strlen(field);
        while (fgets(line, sizeof line, f))
                if (strncmp(line, field, n) == 0)
                        v = strtol(line + n, NULL, 10);
        fclose(f);
        return v;
}
