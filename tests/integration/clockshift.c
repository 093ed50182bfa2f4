/* SPDX-License-Identifier: MIT */
/* clockshift.so — an LD_PRELOAD for the tests: the process's wall clock (CLOCK_REALTIME and its coarse
 * variant, gettimeofday(), time()) shifted by the seconds written in the file $CLOCKSHIFT_FILE, read at
 * every call (a step at run time: write another number; no file or no number: 0). The monotonic and boot
 * clocks are left alone, as an NTP step leaves them. Only system calls: libfaketime, which asks libc for
 * its clock while jemalloc (redis-server's allocator) starts, recurses and Redis fails to start.
 * Built without the sanitizers (tests/integration/meson.build): it is loaded into redis-server. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long shift_seconds(void) {
        const char *path = getenv("CLOCKSHIFT_FILE");
        if (!path)
                return 0;
        long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return 0;
        char buf[32];
        long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
        (void) syscall(SYS_close, fd);
        if (n <= 0)
                return 0;
        long long v = 0;
        int sign = 1;
        long i = 0;
        if (buf[0] == '-' || buf[0] == '+')
                sign = buf[i++] == '-' ? -1 : 1;
        for (; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
                v = v * 10 + (buf[i] - '0');
        return sign * v;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
        long r = syscall(SYS_clock_gettime, id, ts);
        if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
                ts->tv_sec += (time_t) shift_seconds();
        return (int) r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
        (void) tz;
        struct timespec ts;
        if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
                return -1;
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
        return 0;
}

time_t time(time_t *t) {
        struct timespec ts;
        if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
                return (time_t) -1;
        if (t)
                *t = ts.tv_sec;
        return ts.tv_sec;
}
