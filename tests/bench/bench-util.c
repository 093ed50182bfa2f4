/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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

/* The sum over a process's threads (or its main thread alone) of what value() reads from one thread's
 * /proc/PID/task/TID/FILE. */
static uint64_t process_tasks_sum(pid_t pid, bool main_only, const char *file, uint64_t (*value)(FILE *f)) {
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
                snprintf(p, sizeof p, "/proc/%d/task/%s/%s", (int) pid, de->d_name, file);
                FILE *f = fopen(p, "re");
                if (f) {
                        sum += value(f);
                        fclose(f);
                }
        }
        closedir(d);
        return sum;
}

static uint64_t schedstat_ns(FILE *f) {
        unsigned long long ns = 0;
        return fscanf(f, "%llu", &ns) == 1 ? ns : 0;
}

uint64_t bench_process_cpu_ns(pid_t pid, bool main_only) {
        return process_tasks_sum(pid, main_only, "schedstat", schedstat_ns);
}

static uint64_t status_switches(FILE *f) {
        char line[128];
        uint64_t sum = 0;
        while (fgets(line, sizeof line, f)) {
                unsigned long long n;
                if (sscanf(line, "voluntary_ctxt_switches: %llu", &n) == 1 ||
                    sscanf(line, "nonvoluntary_ctxt_switches: %llu", &n) == 1)
                        sum += n;
        }
        return sum;
}

uint64_t bench_process_switches(pid_t pid) {
        return process_tasks_sum(pid, false, "status", status_switches);
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

uint64_t bench_rusage_ns(const struct rusage *ru) {
        return ((uint64_t) ru->ru_utime.tv_sec + (uint64_t) ru->ru_stime.tv_sec) * 1000000000ULL +
               ((uint64_t) ru->ru_utime.tv_usec + (uint64_t) ru->ru_stime.tv_usec) * 1000ULL;
}

uint64_t bench_self_cpu_ns(void) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        return bench_rusage_ns(&ru);
}

const char *bench_find_program(const char *env, const char *name, char *buf, size_t size) {
        const char *e = getenv(env);
        if (e && *e)
                return access(e, X_OK) == 0 ? e : NULL;
        const char *path = getenv("PATH") ?: "/usr/bin:/bin";
        for (const char *p = path; *p;) {
                size_t n = strcspn(p, ":");
                snprintf(buf, size, "%.*s/%s", (int) n, p, name);
                if (n > 0 && access(buf, X_OK) == 0)
                        return buf;
                p += n + (p[n] == ':');
        }
        return NULL;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return x < y ? -1 : x > y;
}

double bench_median(double *v, int n) {
        qsort(v, (size_t) n, sizeof(double), cmp_double);
        return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_remove_dir(const char *dir) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", dir);
}
