/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "macro.h"
#include "process.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

/* PIDFD_GET_INFO (Linux 6.13), its first version: Debian 12's headers predate it. */
#define PID_FS_MAGIC_ 0x50494446
struct pidfd_info_v0 {
        uint64_t mask;
        uint64_t cgroupid;
        uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
        uint32_t spare0[1];
};
#define PIDFD_GET_INFO_V0 _IOWR(0xFF, 11, struct pidfd_info_v0)
#define PIDFD_INFO_PID_ (UINT64_C(1) << 0)
#define PIDFD_INFO_CREDS_ (UINT64_C(1) << 1)

static int read_small_file(const char *path, char *buf, size_t size) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? -ESRCH : negative_errno();
        ssize_t n = read(fd, buf, size - 1);
        if (n < 0)
                return errno == ESRCH ? -ESRCH : negative_errno();
        buf[n] = '\0';
        return 0;
}

/* The decimal number at *p (a sign allowed), ended by a space, a newline or the end: its value, p moved past
 * it. -EIO for anything else, or a value beyond 64 bits. */
static int stat_number(const char **p, long long *ret) {
        const char *s = *p;
        bool negative = *s == '-';
        s += negative;
        if (*s < '0' || *s > '9')
                return -EIO;
        long long v = 0;
        for (; *s >= '0' && *s <= '9'; s++) {
                if (v > (LLONG_MAX - (*s - '0')) / 10)
                        return -EIO;
                v = v * 10 + (*s - '0');
        }
        if (*s != ' ' && *s != '\n' && *s != '\0')
                return -EIO;
        *ret = negative ? -v : v;
        *p = s;
        return 0;
}

/* /proc/PID/stat's state, parent, process group and start time, from the text after the command's name. By
 * hand: sscanf() skipping sixteen fields cost the grant's path more than the file's read. */
static int stat_parse(const char *fields, ProcessInfo *info) {
        /* fields 3..22: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
         * cutime cstime priority nice num_threads itrealvalue starttime */
        const char *p = fields;
        if (p[0] != ' ' || !p[1] || p[2] != ' ')
                return -EIO;
        char state = p[1];
        p += 2;
        long long ppid = -1, pgid = -1, start_time = -1, skipped;
        for (unsigned field = 4; field <= 22; field++) {
                if (*p != ' ')
                        return -EIO;
                p++;
                int r = stat_number(&p, field == 4 ? &ppid : field == 5 ? &pgid : field == 22 ? &start_time : &skipped);
                if (r < 0)
                        return r;
        }
        if (ppid < 0 || ppid > INT32_MAX || pgid < 0 || pgid > INT32_MAX || start_time < 0)
                return -EIO;
        info->ppid = (pid_t) ppid;
        info->pgid = (pid_t) pgid;
        info->state = state;
        info->start_time = (uint64_t) start_time;
        return 0;
}

/* /proc/PID/stat's state, parent, process group and start time. */
static int process_read_stat(pid_t pid, ProcessInfo *info) {
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        int r = read_small_file(path, buf, sizeof buf);
        if (r < 0)
                return r;
        /* The command name may hold spaces and parentheses: the fields start after the last ')'. */
        char *p = strrchr(buf, ')');
        if (!p)
                return -EIO;
        r = stat_parse(p + 1, info);
        if (r < 0)
                return r;
        info->pid = pid;
        return 0;
}

/* /proc/PID/status's real uid and thread group. */
static int process_read_status(pid_t pid, ProcessInfo *info) {
        char path[64], buf[4096];
        snprintf(path, sizeof path, "/proc/%d/status", (int) pid);
        int r = read_small_file(path, buf, sizeof buf);
        if (r < 0)
                return r;
        const char *uid_line = strstr(buf, "\nUid:");
        unsigned long uid;
        if (!uid_line || sscanf(uid_line + 5, "%lu", &uid) != 1)
                return -EIO;
        const char *tgid_line = strstr(buf, "\nTgid:");
        int tgid;
        if (!tgid_line || sscanf(tgid_line + 6, "%d", &tgid) != 1)
                return -EIO;
        info->uid = (uid_t) uid;
        info->tgid = tgid;
        return 0;
}

int process_get_info(pid_t pid, ProcessInfo *ret) {
        ProcessInfo info = {};
        int r;

        assert_return(pid > 0, -EINVAL);
        assert_return(ret, -EINVAL);

        r = process_read_stat(pid, &info);
        if (r >= 0)
                r = process_read_status(pid, &info);
        if (r < 0)
                return r;
        *ret = info;
        return 0;
}

/* Whether the pidfd's process still lives, asked after its facts were read: then they are its own. Returns 0,
 * -ESRCH, another negative errno. */
static int pidfd_check_alive(int pidfd) {
        /* EPERM (another user's process, and no CAP_KILL) means it exists all the same; EBADF: no pidfd. */
        if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0 && errno != EPERM)
                return errno == ESRCH ? -ESRCH : negative_errno();
        return 0;
}

/* Reads pid's facts, pid being what pidfd refers to as far as we know: if the pidfd's process still lives
 * after we read /proc, the pid was not recycled in between, so the facts are its. */
static int process_get_info_of_pidfd(int pidfd, pid_t pid, ProcessInfo *ret) {
        ProcessInfo info;
        int r = process_get_info(pid, &info);
        if (r >= 0)
                r = pidfd_check_alive(pidfd);
        if (r < 0)
                return r;
        *ret = info;
        return 0;
}

int process_open(pid_t pid, ProcessInfo *ret) {
        assert_return(pid > 0, -EINVAL);
        assert_return(ret, -EINVAL);

        _cleanup_close_ int fd = (int) syscall(SYS_pidfd_open, pid, 0);
        if (fd < 0)
                return negative_errno();
        int r = process_get_info_of_pidfd(fd, pid, ret);
        if (r < 0)
                return r;
        return TAKE_FD(fd);
}

int pidfd_get_pid(int pidfd) {
        char path[64], buf[4096];
        int r;

        assert_return(pidfd >= 0, -EBADF);

        /* Our /proc is our PID namespace's: the kernel writes the pid as we number it there. */
        snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
        r = read_small_file(path, buf, sizeof buf);
        if (r < 0)
                return r == -ESRCH ? -EBADF : r;
        const char *line = strstr(buf, "\nPid:");
        int pid;
        if (!line || sscanf(line + 5, "%d", &pid) != 1)
                return -EBADF; /* not a pidfd */
        /* -1: it has exited. 0: it lives in a PID namespace that ours does not contain. */
        return pid > 0 ? pid : -ESRCH;
}

/* Set once the kernel said it has no PIDFD_GET_INFO (or by a test): /proc from then on. */
static bool pidfd_info_unsupported;

void process_use_pidfd_info(bool use) {
        pidfd_info_unsupported = !use;
}

/* The pid, thread group, parent and real uid of a pidfd's process in one ioctl (Linux ≥ 6.13), in place of
 * /proc's fdinfo and status files: two path walks in procfs, each dearer than the ioctl, for every Acquire
 * with a command. Asked of a pidfs file only: an fd a client passed may be any file, and an unknown ioctl
 * means something else to each driver. Returns 0; -ESRCH when it has exited or is not in our PID namespace;
 * -EOPNOTSUPP when /proc must tell (no pidfs, an older kernel, or no pidfd at all). */
static int pidfd_query(int pidfd, ProcessInfo *ret) {
        struct statfs sfs;
        if (pidfd_info_unsupported || fstatfs(pidfd, &sfs) < 0 || sfs.f_type != PID_FS_MAGIC_)
                return -EOPNOTSUPP;
        struct pidfd_info_v0 info = { .mask = PIDFD_INFO_PID_ | PIDFD_INFO_CREDS_ };
        if (ioctl(pidfd, PIDFD_GET_INFO_V0, &info) < 0) {
                if (errno == ESRCH)
                        return -ESRCH;
                if (errno == ENOTTY || errno == EINVAL)
                        pidfd_info_unsupported = true;
                return -EOPNOTSUPP;
        }
        if ((info.mask & (PIDFD_INFO_PID_ | PIDFD_INFO_CREDS_)) != (PIDFD_INFO_PID_ | PIDFD_INFO_CREDS_))
                return -EOPNOTSUPP;
        /* 0: it lives in a PID namespace that ours does not contain. */
        if (info.pid == 0 || info.pid > INT32_MAX || info.tgid > INT32_MAX)
                return -ESRCH;
        ret->pid = (pid_t) info.pid;
        ret->tgid = (pid_t) info.tgid;
        ret->uid = (uid_t) info.ruid;
        return 0;
}

int process_open_pidfd(int pidfd, ProcessInfo *ret) {
        ProcessInfo info = {};
        int r;

        assert_return(pidfd >= 0, -EBADF);
        assert_return(ret, -EINVAL);

        r = pidfd_query(pidfd, &info);
        if (r == -EOPNOTSUPP) {
                r = pidfd_get_pid(pidfd);
                if (r < 0)
                        return r;
                r = process_get_info_of_pidfd(pidfd, (pid_t) r, &info);
        } else if (r >= 0) {
                /* The rest from stat, checked against the pidfd as process_get_info_of_pidfd() does. */
                r = process_read_stat(info.pid, &info);
                if (r >= 0)
                        r = pidfd_check_alive(pidfd);
        }
        if (r < 0)
                return r;
        /* A thread's pidfd (PIDFD_THREAD) names no process of its own. */
        if (info.tgid != info.pid)
                return -EINVAL;
        *ret = info;
        return 0;
}

/* /proc's unit of start times (USER_HZ): sysconf() reads it from the auxiliary vector, no system call. */
static uint64_t clock_ticks_per_second(void) {
        long hz = sysconf(_SC_CLK_TCK);
        return hz > 0 && hz <= (long) USEC_PER_SEC ? (uint64_t) hz : 100;
}

int process_check_attachable(const ProcessInfo *p, pid_t peer_pid, uid_t peer_uid, usec_t peer_since) {
        assert_return(p, -EINVAL);
        if (p->pid == peer_pid)
                /* Start times are whole clock ticks (10 ms) of CLOCK_BOOTTIME, rounded down: the peer's is at
                 * most peer_since's. Another process would need the peer gone and its pid reused within the
                 * same tick. */
                return p->start_time <= peer_since / (USEC_PER_SEC / clock_ticks_per_second()) ? 0 : -EPERM;
        if (p->ppid != peer_pid || p->uid != peer_uid)
                return -EPERM;
        return 0;
}

static void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}

/* The next process of a /proc listing: its pid (> 1), 0 at the end, or a negative errno (readdir() failed). */
static int proc_next_pid(DIR *d) {
        errno = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                char *end;
                long pid = strtol(de->d_name, &end, 10);
                if (*end == '\0' && pid > 1 && pid <= INT32_MAX)
                        return (int) pid;
                errno = 0;
        }
        return errno > 0 ? -errno : 0;
}

/* Whether pid is a member of group pgid that has not exited: 1, 0 (not a member, or exited), or a negative
 * errno when that cannot be told (out of fds, say). A zombie thread-group leader whose other threads still
 * run shows 'Z' too: its pidfd tells, readable only once the whole thread group has exited. */
static int group_member_runs(pid_t pid, pid_t pgid) {
        ProcessInfo info;
        int r = process_read_stat(pid, &info);
        if (r == -ESRCH)
                return 0;
        if (r < 0)
                return r;
        if (info.pgid != pgid)
                return 0;
        if (info.state != 'Z' && info.state != 'X')
                return 1;
        _cleanup_close_ int fd = (int) syscall(SYS_pidfd_open, pid, 0);
        if (fd < 0)
                return errno == ESRCH ? 0 : negative_errno();
        return !pidfd_has_exited(fd);
}

bool proc_mountinfo_hides_processes(const char *mountinfo) {
        bool hides = true; /* no /proc found: nothing is known of what it shows */
        for (const char *line = mountinfo; line && *line;) {
                const char *eol = strchrnul(line, '\n');
                size_t n = (size_t) (eol - line);
                char buf[1024], point[16], fstype[16], super[256];
                bool fits = n < sizeof buf; /* the /proc mount's fields are short */
                if (fits) {
                        memcpy(buf, line, n);
                        buf[n] = '\0';
                }
                line = *eol ? eol + 1 : NULL;
                /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPER_OPTIONS */
                const char *dash = fits ? strstr(buf, " - ") : NULL;
                if (!dash || sscanf(buf, "%*s %*s %*s %*s %15s", point) != 1 || !streq(point, "/proc") ||
                    sscanf(dash, " - %15s %*s %255s", fstype, super) != 2 || !streq(fstype, "proc"))
                        continue;
                /* The last mount on /proc is the one seen. hidepid=0 (or off) shows every process. */
                const char *h = strstr(super, "hidepid=");
                size_t len = h ? strcspn(h + 8, ",") : 0;
                hides = h && !((len == 1 && h[8] == '0') || (len == 3 && strncmp(h + 8, "off", 3) == 0));
        }
        return hides;
}

static void fclosep(FILE **f) {
        if (*f)
                (void) fclose(*f);
}

/* Whether this process's /proc lists every process of its PID namespace, readable: not a /proc mounted with
 * hidepid= (ProtectProc= other than default), which hides other users' processes (then nothing shows that a
 * group's zombies are all it has left). Read once. */
static bool proc_shows_every_process(void) {
        static int shows = -1;
        if (shows < 0) {
                _cleanup_free_ char *text = NULL;
                size_t size = 0;
                _cleanup_(fclosep) FILE *f = fopen("/proc/self/mountinfo", "re");
                shows = f && getdelim(&text, &size, '\0', f) >= 0 && !proc_mountinfo_hides_processes(text);
        }
        return shows;
}

/* One pass over /proc for a member of pgid that runs: 1 (*ret_member set), 0 none, or a negative errno when
 * that cannot be told. */
static int group_scan(pid_t pgid, pid_t *ret_member) {
        _cleanup_(closedirp) DIR *d = opendir("/proc");
        if (!d)
                return negative_errno();
        int pid;
        while ((pid = proc_next_pid(d)) > 0) {
                int r = group_member_runs((pid_t) pid, pgid);
                if (r != 0) {
                        *ret_member = r > 0 ? (pid_t) pid : 0;
                        return r;
                }
        }
        return pid;
}

bool process_group_is_alive(pid_t pgid, pid_t *member) {
        if (pgid <= 1)
                return false;
        /* EPERM means it exists but belongs to someone we may not signal: it exists all the same. */
        if (kill(-pgid, 0) < 0 && errno != EPERM)
                return false;
        /* The group exists; is anything of it still running, or are its members all zombies (exited, and not
         * yet reaped by a parent: a container's PID 1 that reaps nothing keeps them for ever)? Only where /proc
         * shows every process, and whatever cannot be read counts as running: a slot is never freed under a
         * running command. The member found running last time first: a group that lives on is read in O(1), not
         * a pass over /proc a poll. */
        if (!proc_shows_every_process()) {
                if (member)
                        *member = 0;
                return true;
        }
        if (member && *member > 0 && group_member_runs(*member, pgid) != 0)
                return true;
        pid_t found = 0;
        /* Twice before saying it is gone: /proc lists pids in increasing order, and a member that forked as
         * it exited may have a child at a lower pid (pids wrap) that the first pass had gone by. */
        int r = group_scan(pgid, &found);
        if (r == 0)
                r = group_scan(pgid, &found);
        if (member)
                *member = found;
        return r != 0;
}

bool pidfd_has_exited(int pidfd) {
        struct pollfd p = { .fd = pidfd, .events = POLLIN };
        return poll(&p, 1, 0) > 0;
}

/* A live member of command's process group that pins the group's id: a pidfd on it, opened and then checked
 * (its facts read after the pidfd was opened, as process_open() does) to be in the group still, of the
 * command's uid, and no older than the command. Returns the pidfd, or -ESRCH when the group has none. */
static int process_group_pin_member(const ProcessInfo *command) {
        _cleanup_(closedirp) DIR *d = opendir("/proc");
        if (!d)
                return negative_errno();
        for (int pid; (pid = proc_next_pid(d)) > 0;) {
                ProcessInfo info;
                if (process_get_info((pid_t) pid, &info) < 0 || info.pgid != command->pgid)
                        continue;
                _cleanup_close_ int fd = process_open((pid_t) pid, &info);
                if (fd < 0)
                        continue;
                if (info.pgid == command->pgid && info.uid == command->uid &&
                    info.start_time >= command->start_time && info.state != 'Z')
                        return TAKE_FD(fd);
        }
        return -ESRCH;
}

int process_command_signal(int pidfd, const ProcessInfo *command, int sig) {
        bool leader = false;

        assert_return(command, -EINVAL);
        if (pidfd >= 0) {
                /* A zombie counts: not yet reaped, the leader still holds its pid, the group's id. */
                if (syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) >= 0)
                        leader = true;
                else if (errno != ESRCH)
                        return negative_errno();
        }
        if (command->pgid != command->pid || command->pgid <= 1)
                return leader ? 0 : -ESRCH; /* it shares another's group: the leader is all that is its own */

        _cleanup_close_ int pin = -EBADF;
        if (!leader) {
                pin = process_group_pin_member(command);
                if (pin < 0)
                        return pin;
        }
        if (kill(-command->pgid, sig) < 0 && !(leader && errno == ESRCH))
                return negative_errno();
        return 0;
}
