/* SPDX-License-Identifier: MIT */
/* process.h — facts about client processes from /proc and pidfds: who a pid is, whether it or its
 * process group still lives. No event loop here; the caller watches the pidfd. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "time-util.h"

typedef struct ProcessInfo {
        pid_t pid;                 /* in our PID namespace, as everything here */
        pid_t tgid;                /* its thread group: pid itself unless pid is a thread's id */
        pid_t ppid;
        pid_t pgid;
        uid_t uid;                 /* real uid */
        char state;                /* 'R', 'S', …; 'Z' for a zombie: exited, not yet reaped */
        uint64_t start_time;       /* clock ticks since boot: with the pid, names a process for good */
} ProcessInfo;

/* Reads /proc/PID/stat and /proc/PID/status. Returns 0, -ESRCH if it does not exist, -EIO if unparsable. */
int process_get_info(pid_t pid, ProcessInfo *ret);

/* Opens a pidfd (O_CLOEXEC by the kernel) and reads the process's facts, checking afterwards that the
 * pidfd still refers to a live process, so the facts cannot belong to a recycled pid.
 * Returns the pidfd (≥ 0) and fills *ret, or -ESRCH, -ENOSYS, other negative errno. */
int process_open(pid_t pid, ProcessInfo *ret);

/* The pid of a pidfd's process in our PID namespace, from /proc/self/fdinfo ("Pid:"). Returns it (> 0);
 * -ESRCH when it has exited, or lives in a PID namespace that ours does not contain; -EBADF when the fd is
 * no pidfd. */
int pidfd_get_pid(int pidfd);

/* As process_open() for a pidfd someone else opened (a client passed it with a call): its pid in our
 * namespace and its facts, checked against the pidfd afterwards. The caller keeps the pidfd. Returns 0;
 * -ESRCH when it has exited or cannot be seen from our namespace; -EBADF when the fd is no pidfd; -EINVAL
 * for a thread's pidfd; another negative errno. */
int process_open_pidfd(int pidfd, ProcessInfo *ret);

/* Whether process_open_pidfd() asks the kernel (PIDFD_GET_INFO, Linux ≥ 6.13) before /proc; on by default, off
 * once the kernel has none. Tests turn it off to take the path of older kernels. */
void process_use_pidfd_info(bool use);

/* May `pid` be attached to a lease asked for by the peer `peer_pid` with uid `peer_uid` (SPEC §3.4):
 * the peer itself, or a direct child of it with the same uid. The peer ran at peer_since (CLOCK_BOOTTIME
 * µs, connection_get_peer_since()): a process of its pid started later is not it but a process that took
 * its pid once it exited, maybe another user's, which a revocation would signal. Returns 0, -EPERM if it
 * may not, -ESRCH if it does not exist. */
int process_check_attachable(const ProcessInfo *p, pid_t peer_pid, uid_t peer_uid, usec_t peer_since);

/* True while a process of the group runs: kill(-pgid, 0) finds the group, and one of its members has not
 * exited (zombies, not yet reaped by their parent, run nothing). member (may be NULL): the member found running
 * by the last call, tried first (0: none), and set to the one found now. */
bool process_group_is_alive(pid_t pgid, pid_t *member);

/* Whether the text of a /proc/self/mountinfo mounts /proc with hidepid= other than 0 (or none at all): then
 * /proc hides processes, and a group's zombies are not known to be all it has left (tests). */
bool proc_mountinfo_hides_processes(const char *mountinfo);

/* True once the pidfd's process has exited (it may be a zombie: not yet reaped by its parent). */
bool pidfd_has_exited(int pidfd);

/* Sends sig to an attached command (SPEC §11, brokerd's own fence): to its leader through its pidfd (-EBADF:
 * none left), and, when the command leads a process group of its own (pgid == pid), to that group, but only
 * while something pins the group's id to this command — the leader not yet reaped, or a member of the group
 * with the command's uid, started no earlier than the command, held by a pidfd while the signal goes — so
 * that a recycled pid never makes brokerd signal somebody else's group. Returns 0 when something was
 * signalled, -ESRCH when nothing of the command is left, another negative errno (-EPERM: brokerd lacks
 * CAP_KILL for another user's command). */
int process_command_signal(int pidfd, const ProcessInfo *command, int sig);
