#!/bin/bash
# The README's test command as it runs in an unprivileged container (Docker's and Podman's defaults):
# root, but with only the container runtime's default capabilities, so no CAP_SYS_ADMIN (no namespaces,
# no mounts), CAP_SYS_PTRACE, CAP_LINUX_IMMUTABLE (chattr +i) or CAP_SYS_RESOURCE. What needs one of
# them must be skipped with its reason (tools/test.sh's summary lists them) and the suite must pass.
# As root, from a clone; arguments go to tools/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
        echo "test-unprivileged.sh: run it as root: it drops root's capabilities to a container's" >&2
        exit 64
fi
# Docker's default capability set (moby: oci/caps/defaults.go); setpriv needs them as +cap,+cap.
caps=chown,dac_override,fowner,fsetid,kill,setgid,setuid,setpcap,net_bind_service,net_raw,sys_chroot,mknod
caps=$caps,audit_write,setfcap
exec setpriv --bounding-set=-all,+${caps//,/,+} --inh-caps=-all -- bash tools/test.sh "$@"
