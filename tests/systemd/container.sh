#!/bin/bash
# container.sh — a real systemd, PID 1 of its own namespaces, booted in a debootstrapped Debian 12
# root, for testing slotbroker's units, socket activation, timers and journal on a machine whose own
# PID 1 is not systemd (CI containers, developer sandboxes).
#
#   container.sh build ROOT     unpack a minimal bookworm with systemd into ROOT; the first run
#                               debootstraps it (~1 min, network) and caches it as a .tar.zst in
#                               $SLOTBROKER_TEST_CACHE (default /var/cache/slotbroker-test), later runs
#                               unpack the cache (seconds). Exit 77 if the mirror cannot be reached.
#                               $SLOTBROKER_TEST_MIRROR overrides the mirror of /etc/apt/sources*.
#   container.sh boot ROOT      boot it; prints the container's init pid; waits until it runs
#   container.sh exec ROOT CMD… run CMD inside (systemctl, journalctl, slotctl…)
#   container.sh stop ROOT      kill it (by its pid), unmount, and remove its cgroup
#
# SAFETY: systemd is only ever started chrooted into ROOT, inside new mount/pid/cgroup/uts/ipc/net
# namespaces, with a private /dev and a read-only /sys. Never start /lib/systemd/systemd on the host's
# own root, not even in a namespace: its boot services (systemd-tmpfiles --boot) would wipe the host's /tmp.
set -euo pipefail

cmd=${1:?usage: container.sh build|boot|exec|stop ROOT [CMD…]}
R=$(realpath -m "${2:?ROOT missing}")
shift 2
state=$R.state
cache=${SLOTBROKER_TEST_CACHE:-/var/cache/slotbroker-test}
cg_root=/sys/fs/cgroup/unified
[ -f "$cg_root/cgroup.procs" ] || cg_root=/sys/fs/cgroup
CG=$cg_root/slotbroker-ct-$(printf '%s' "$R" | sha256sum | cut -c1-12)

# What brokerd and slotctl link, and what the test drives (systemd-sysusers, runuser, useradd: required).
packages=systemd,systemd-sysv,dbus,libsystemd0,libsqlite3-0,libjansson4,libinih1,libhiredis0.14,procps
key=bookworm-$(printf '%s' "$packages" | sha256sum | cut -c1-12)

mirror() {
        local m=${SLOTBROKER_TEST_MIRROR:-}
        [ -z "$m" ] || { echo "$m"; return; }
        m=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
        [ -n "$m" ] || m=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
        echo "${m:-http://deb.debian.org/debian}"
}

case $cmd in
build)
        tarball=$cache/$key.tar.zst
        rm -rf "$R"
        mkdir -p "$R"
        if [ -f "$tarball" ]; then
                tar --zstd -xf "$tarball" -C "$R"
                exit 0
        fi
        command -v debootstrap >/dev/null && command -v zstd >/dev/null || {
                echo "container.sh: debootstrap and zstd are needed (apt-get install debootstrap zstd)" >&2
                exit 77
        }
        mkdir -p "$cache"
        log=$cache/$key.debootstrap.log
        if ! debootstrap --variant=minbase --include="$packages" bookworm "$R" "$(mirror)" >"$log" 2>&1; then
                echo "container.sh: debootstrap failed (is the Debian mirror reachable?); see $log" >&2
                tail -n 5 "$log" >&2
                rm -rf "$R"
                exit 77
        fi
        # The console is a file, not a tty; nothing here needs a login prompt.
        chroot "$R" systemctl mask console-getty.service getty@tty1.service >/dev/null 2>&1 || true
        chroot "$R" apt-get clean >/dev/null 2>&1 || true
        rm -rf "$R"/var/lib/apt/lists/* "$R"/var/cache/apt/*.bin
        # Written to a temporary name first: an interrupted build never leaves a truncated cache.
        tar --zstd -cf "$tarball.tmp" -C "$R" .
        mv "$tarball.tmp" "$tarball"
        ;;
boot)
        [ -x "$R/lib/systemd/systemd" ] || { echo "container.sh: $R has no systemd (build it first)" >&2; exit 1; }
        mkdir -p "$CG" "$state"
        cat >"$state/init.sh" <<INIT
#!/bin/bash
set -eu
R='$R'
mount --bind \$R \$R
mount -t proc proc \$R/proc
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs \$R/sys
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 \$R/sys/fs/cgroup
mount -t tmpfs -o mode=0755,nosuid,size=4m tmpfs \$R/dev
for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do set -- \$n; mknod -m 666 \$R/dev/\$1 c \$2 \$3; done
mkdir \$R/dev/pts \$R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts \$R/dev/pts
ln -s pts/ptmx \$R/dev/ptmx; ln -s /proc/self/fd \$R/dev/fd
ln -s /proc/self/fd/0 \$R/dev/stdin; ln -s /proc/self/fd/1 \$R/dev/stdout; ln -s /proc/self/fd/2 \$R/dev/stderr
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs \$R/dev/shm
: > '$state/console.log'; touch \$R/dev/console; mount --bind '$state/console.log' \$R/dev/console
exec chroot \$R /usr/bin/env -i container=other TERM=dumb /lib/systemd/systemd --system --unit=multi-user.target --log-target=console --log-color=no
INIT
        chmod +x "$state/init.sh"
        # The subshell moves itself into the container's cgroup, then becomes unshare: every process
        # of the container is in $CG, so that stop can wait for all of them to be gone.
        ( echo $BASHPID >"$CG/cgroup.procs"
          exec unshare --mount --propagation private --pid --fork --kill-child --cgroup --uts --ipc --net "$state/init.sh"
        ) </dev/null >"$state/launch.log" 2>&1 &
        launch=$!
        echo "$launch" >"$state/launch-pid"
        cpid=
        for _ in $(seq 100); do
                cpid=$(ps -o pid= --ppid "$launch" | tr -d ' ' || true)
                [ -n "$cpid" ] && break
                sleep 0.1
        done
        [ -n "$cpid" ] || { echo "container.sh: the container did not start; see $state/launch.log" >&2; exit 1; }
        echo "$cpid" >"$state/pid"
        st=unknown
        for _ in $(seq 300); do
                st=$(nsenter -t "$cpid" -a -r -w systemctl is-system-running 2>/dev/null || true)
                case $st in running|degraded) break ;; esac
                sleep 0.1
        done
        echo "$cpid $st"
        case $st in running|degraded) ;; *) exit 1 ;; esac
        ;;
exec)
        # -r -w: the container's root and cwd too, or systemctl would talk to the host's /run.
        exec nsenter -t "$(cat "$state/pid")" -a -r -w "$@"
        ;;
stop)
        pid=$(cat "$state/pid" 2>/dev/null || true)
        launch=$(cat "$state/launch-pid" 2>/dev/null || true)
        # Killing the container's init ends its pid namespace: the kernel kills everything in it, and
        # the mounts go with the mount namespace.
        [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
                procs=$(cat $(find "$CG" -name cgroup.procs 2>/dev/null) 2>/dev/null || true)
                [ -z "$procs" ] && break
                sleep 0.1
        done
        [ -n "$launch" ] && kill "$launch" 2>/dev/null || true
        [ -d "$CG" ] && find "$CG" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        rm -f "$state/pid" "$state/launch-pid"
        ;;
*)
        echo "usage: container.sh build|boot|exec|stop ROOT [CMD…]" >&2
        exit 2
        ;;
esac
