/* SPDX-License-Identifier: MIT */
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs-util.h"
#include "process.h"

static void hex_of(const uint8_t *raw, size_t n, char *ret) {
        for (size_t i = 0; i < n; i++)
                snprintf(ret + 2 * i, 3, "%02x", raw[i]);
}

static bool id_is_valid(const char *s, size_t n) {
        if (n != NODE_ID_HEX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!strchr("0123456789abcdef", s[i]))
                        return false;
        return true;
}

/* 0 with ret filled; -ENOENT: no file; -EBADMSG: not an id (moved aside by the caller). */
static int id_read(int dir_fd, char ret[static NODE_ID_HEX + 1]) {
        _cleanup_close_ int fd = openat(dir_fd, NODE_ID_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
                return -errno;
        char buf[NODE_ID_HEX + 2];
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0)
                return -errno;
        if (n > 0 && buf[n - 1] == '\n')
                n--;
        if (!id_is_valid(buf, (size_t) n))
                return -EBADMSG;
        memcpy(ret, buf, NODE_ID_HEX);
        ret[NODE_ID_HEX] = 0;
        return 0;
}

/* Written to a temporary name and linked into place: a crash leaves no half-written id, and of two daemons
 * racing, the second's link() fails with EEXIST and it reads the first one's. */
static int id_create(int dir_fd, const char *id) {
        char tmp[] = NODE_ID_FILE ".XXXXXX";
        _cleanup_close_ int fd = -EBADF;
        for (unsigned attempt = 0;; attempt++) {
                snprintf(tmp + sizeof NODE_ID_FILE, 7, "%06u", (unsigned) (getpid() + attempt) % 1000000u);
                fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
                if (fd >= 0)
                        break;
                if (errno != EEXIST || attempt > 100)
                        return -errno;
        }
        char line[NODE_ID_HEX + 1];
        memcpy(line, id, NODE_ID_HEX);
        line[NODE_ID_HEX] = '\n';
        int r = 0;
        if (write(fd, line, sizeof line) != (ssize_t) sizeof line || fsync(fd) < 0)
                r = errno > 0 ? -errno : -EIO;
        else if (linkat(dir_fd, tmp, dir_fd, NODE_ID_FILE, 0) < 0)
                r = -errno;
        (void) unlinkat(dir_fd, tmp, 0);
        return r;
}

/* ---- the incarnation (SPEC §11, "One node, one identity") ---- */

/* This boot, as "BOOT_ID@SECONDS": the kernel's boot id when /proc/sys is visible ("-" under
 * ProcSubset=pid, as a drop-in may set), and the instant of the boot on the realtime clock (realtime −
 * boottime, in seconds), which a sandbox cannot hide. */
static void boot_read(char ret[static 64]) {
        char id[40] = "-";
        _cleanup_close_ int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t n = read(fd, id, sizeof id - 1);
                id[MAX(n, (ssize_t) 0)] = 0;
                id[strcspn(id, "\n @")] = 0;
                if (!*id)
                        strcpy(id, "-");
        }
        struct timespec rt, bt;
        (void) clock_gettime(CLOCK_REALTIME, &rt);
        (void) clock_gettime(CLOCK_BOOTTIME, &bt);
        /* Rounded: the two clocks are read a few ns apart, the offset itself is constant but for NTP. */
        long long offset_ns = ((long long) rt.tv_sec - bt.tv_sec) * 1000000000LL + (rt.tv_nsec - bt.tv_nsec);
        snprintf(ret, 64, "%s@%lld", id, (offset_ns + 500000000LL) / 1000000000LL);
}

/* Whether two boot records (boot_read()) are one boot: equal boot ids when both have one, else boot instants
 * within 2 s of each other (a clock step between the two starts makes it another boot: no claim, which is the
 * safe side). */
static bool boot_same(const char *a, const char *b) {
        const char *at_a = strchr(a, '@'), *at_b = strchr(b, '@');
        if (!at_a || !at_b)
                return false;
        if (at_a - a == at_b - b && strncmp(a, b, (size_t) (at_a - a)) == 0 && !(at_a - a == 1 && *a == '-'))
                return true;
        if (*a != '-' && *b != '-')
                return false; /* two boot ids, different */
        char *end_a, *end_b;
        long long ta = strtoll(at_a + 1, &end_a, 10), tb = strtoll(at_b + 1, &end_b, 10);
        if (*end_a || *end_b || end_a == at_a + 1 || end_b == at_b + 1)
                return false;
        return llabs(ta - tb) <= 2;
}

/* Whether the start recorded in the incarnation file (its boot, pid and start time) is a process that is
 * gone: then this start succeeds it. A record of another boot is no claim (a reboot, or an image made on
 * another host: a clone must not succeed the original), nor is a live process (a copy of the directory
 * next to the daemon that still uses it). */
static bool predecessor_is_gone(const char *boot, const char *rec_boot, long pid, unsigned long long start,
                                bool *ret_alive) {
        *ret_alive = false;
        if (!boot_same(boot, rec_boot) || pid <= 0)
                return false;
        ProcessInfo now;
        int r = process_get_info((pid_t) pid, &now);
        if (r == -ESRCH)
                return true;
        *ret_alive = r == 0 && now.start_time == start;
        return r == 0 && now.start_time != start;
}

/* Makes this start's incarnation and writes it, durably, with its claim: "INC BOOT PID START PREV,…\n"
 * ("-" for none). ret: "INC/PREV,…". */
static int incarnation_make(int dir_fd, void (*random_bytes)(void *buf, size_t n, void *userdata), void *userdata,
                            char **ret, bool *ret_predecessor_alive) {
        char boot[64];
        boot_read(boot);

        char previous[(NODE_INCARNATION_HEX + 1) * NODE_PREVIOUS_MAX + 1] = "";
        _cleanup_close_ int fd = openat(dir_fd, NODE_INCARNATION_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
                char buf[512], inc[NODE_INCARNATION_HEX + 1], rec_boot[64], prev[128];
                long pid;
                unsigned long long start;
                ssize_t n = read(fd, buf, sizeof buf - 1);
                buf[MAX(n, (ssize_t) 0)] = 0;
                if (sscanf(buf, "%16[0-9a-f] %63s %ld %llu %127s", inc, rec_boot, &pid, &start, prev) == 5 &&
                    strlen(inc) == NODE_INCARNATION_HEX &&
                    predecessor_is_gone(boot, rec_boot, pid, start, ret_predecessor_alive)) {
                        /* This start succeeds the recorded one, and those it succeeded (it may have died
                         * before its first tick told Redis): the newest NODE_PREVIOUS_MAX. */
                        size_t len = (size_t) snprintf(previous, sizeof previous, "%s", inc);
                        unsigned kept = 1;
                        for (char *save = NULL, *t = streq(prev, "-") ? NULL : strtok_r(prev, ",", &save);
                             t && kept < NODE_PREVIOUS_MAX; t = strtok_r(NULL, ",", &save)) {
                                if (strlen(t) != NODE_INCARNATION_HEX || strspn(t, "0123456789abcdef") != NODE_INCARNATION_HEX)
                                        break;
                                len += (size_t) snprintf(previous + len, sizeof previous - len, ",%s", t);
                                kept++;
                        }
                }
        } else if (errno != ENOENT)
                return -errno;
        fd = safe_close(fd);

        uint8_t raw[NODE_INCARNATION_HEX / 2];
        char inc[NODE_INCARNATION_HEX + 1];
        random_bytes(raw, sizeof raw, userdata);
        hex_of(raw, sizeof raw, inc);
        ProcessInfo self = {};
        (void) process_get_info(getpid(), &self);
        unsigned long long start = self.start_time;

        char line[256], tmp[64];
        snprintf(tmp, sizeof tmp, NODE_INCARNATION_FILE ".%ld", (long) getpid());
        int len = snprintf(line, sizeof line, "%s %s %ld %llu %s\n", inc, boot, (long) getpid(),
                           start, *previous ? previous : "-");
        fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0)
                return -errno;
        if (write(fd, line, (size_t) len) != len || fsync(fd) < 0 ||
            renameat(dir_fd, tmp, dir_fd, NODE_INCARNATION_FILE) < 0 || fsync(dir_fd) < 0) {
                int r = errno > 0 ? -errno : -EIO;
                (void) unlinkat(dir_fd, tmp, 0);
                return r;
        }
        if (asprintf(ret, "%s/%s", inc, previous) < 0)
                return -ENOMEM;
        return 0;
}

int node_load(const char *state_directory, const char *name,
              void (*random_bytes)(void *buf, size_t n, void *userdata), void *userdata, Node *ret) {
        if (!ret || !state_directory || !random_bytes)
                return -EINVAL;

        Node n = {};
        if (name)
                n.name = strdup(name);
        else {
                char host[256] = {};
                if (gethostname(host, sizeof host - 1) < 0 || !*host)
                        strcpy(host, "localhost");
                n.name = strdup(host);
        }
        if (!n.name)
                return -ENOMEM;

        int r = mkdir_parents(state_directory, 0755);
        if (r >= 0 && mkdir(state_directory, 0755) < 0 && errno != EEXIST)
                r = -errno;
        _cleanup_close_ int dir_fd = r < 0 ? -EBADF : open(state_directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0) {
                node_done(&n);
                return r < 0 ? r : -errno;
        }

        for (unsigned attempt = 0; attempt < 3; attempt++) {
                r = id_read(dir_fd, n.id);
                if (r == 0)
                        break;
                if (r == -EBADMSG) {
                        _cleanup_free_ char *path = NULL, *moved = NULL;
                        if (asprintf(&path, "%s/" NODE_ID_FILE, state_directory) < 0) {
                                r = -ENOMEM;
                                break;
                        }
                        r = rename_aside(path, true, &moved);
                        if (r < 0)
                                break;
                } else if (r != -ENOENT)
                        break;

                uint8_t raw[NODE_ID_HEX / 2];
                random_bytes(raw, sizeof raw, userdata);
                char id[NODE_ID_HEX + 1];
                hex_of(raw, sizeof raw, id);
                r = id_create(dir_fd, id);
                if (r < 0 && r != -EEXIST)
                        break;
                /* Read back what is in place now: ours, or a racing daemon's. */
                r = id_read(dir_fd, n.id);
                if (r != -EBADMSG && r != -ENOENT)
                        break;
        }
        if (r >= 0)
                r = incarnation_make(dir_fd, random_bytes, userdata, &n.identity, &n.predecessor_alive);
        if (r < 0) {
                node_done(&n);
                return r;
        }
        *ret = n;
        return 0;
}

void node_done(Node *n) {
        if (!n)
                return;
        n->name = mfree(n->name);
        n->identity = mfree(n->identity);
}
