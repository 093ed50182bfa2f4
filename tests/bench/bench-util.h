/* SPDX-License-Identifier: MIT */
/* bench-util.h — what the C benchmarks share: a monotonic clock, a connection to brokerd, and a process's
 * CPU time and memory as /proc tells them. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct rusage;

/* CLOCK_MONOTONIC in ns. */
uint64_t bench_now_ns(void);

/* A connected AF_UNIX stream socket (CLOEXEC) to path. Returns the fd, or negative errno. */
int bench_connect(const char *path);

/* The same, while brokerd starts: tried every 10 ms for up to 5 s. Returns the fd, or negative errno. */
int bench_connect_when_listening(const char *path);

/* /proc/loadavg's line in buf ("?" if unreadable). Returns buf. */
const char *bench_loadavg(char *buf, size_t size);

/* CPU time of the threads of a process so far, in ns (schedstat: exact, where /proc/PID/stat counts ticks):
 * of all of them, or (main_only) of the main thread alone. 0 when the process is gone. */
uint64_t bench_process_cpu_ns(pid_t pid, bool main_only);
/* Context switches of the threads of a process so far (voluntary: it waited for input, a lock, the disk;
 * involuntary: preempted), as perf stat's context-switches counts them. */
uint64_t bench_process_switches(pid_t pid);

/* A field of /proc/PID/status in KiB ("VmRSS:", "VmHWM:"), or -1. */
long bench_process_status_kib(pid_t pid, const char *field);

/* User + system time of a getrusage() or wait4() result, in ns; of this process so far. */
uint64_t bench_rusage_ns(const struct rusage *ru);
uint64_t bench_self_cpu_ns(void);

/* A program: $ENV when it is set (NULL if that is not executable), else the first NAME on $PATH, written
 * into buf; NULL when there is none. */
const char *bench_find_program(const char *env, const char *name, char *buf, size_t size);

/* The median of v[0..n) (sorts v). */
double bench_median(double *v, int n);
/* rm -rf of a bench's temporary directory; says so on stderr when it fails. */
void bench_remove_dir(const char *dir);
