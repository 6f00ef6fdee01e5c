#!/bin/bash
# Boot a throwaway Debian rootfs with a REAL systemd as PID 1 (systemd-nspawn) and run a test inside.
# Never boots systemd on this machine's own root: the container gets its own mount, PID, UTS, IPC,
# network and cgroup namespaces, on a tmpfs overlay (--volatile=overlay) of a cached debootstrap tree
# that is never booted read-write, so every run starts from the same pristine tree.
# Modelled on shared/tools/nspawn-systemd.sh (its guards, cgroup placement and shutdown order).
#
#   sudo PAYLOAD=dir BIND_RO="path ..." [TESTS="e2e.sh site.sh"] tests/nspawn/harness.sh
#
# PAYLOAD appears read-only at /srv/payload; each of $TESTS (default e2e.sh) in $PAYLOAD runs inside
# as root, one after the other in the same boot (one boot costs ~10 s). Every BIND_RO path is bound
# read-only at the same path inside. Exit status: 0 when every test passed.
set -euo pipefail

CACHE=${EDGED_NSPAWN_CACHE:-/var/cache/edged-nspawn}
ROOTFS=${ROOTFS:-$CACHE/rootfs-bookworm}
PAYLOAD=${PAYLOAD:?PAYLOAD dir with e2e.sh}
BIND_RO=${BIND_RO:-}
TESTS=${TESTS:-e2e.sh}
MACHINE=${MACHINE:-edged$$}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
INCLUDE=systemd,systemd-sysv,dbus,procps,python3,python3-venv,python3-systemd,mosquitto,mosquitto-clients
BOOT_TIMEOUT=60
TEST_TIMEOUT=${TEST_TIMEOUT:-600}
LOG=$CACHE/$MACHINE.console.log

die() { echo "harness: ERROR: $*" >&2; exit 2; }
T0=$EPOCHREALTIME
say() { printf 'harness: [%6.2fs] %s\n' "$(awk "BEGIN{print $EPOCHREALTIME-$T0}")" "$*"; }

[ "$(id -u)" = 0 ] || die "must run as root"
for t in $TESTS; do [ -x "$PAYLOAD/$t" ] || die "no executable $PAYLOAD/$t"; done
mkdir -p "$CACHE"
ROOTFS=$(realpath -m "$ROOTFS")
case "$ROOTFS" in /|/tmp|/tmp/*|/home|/usr|/usr/*|/etc|/etc/*|/var|/run|/run/*) die "refusing ROOTFS=$ROOTFS";; esac

need=()
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  # no recommends: libnss-mymachines would edit this machine's /etc/nsswitch.conf
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ ! -x "$ROOTFS/usr/lib/systemd/systemd" ]; then
  [ ! -e "$ROOTFS" ] || die "$ROOTFS exists but is not a finished rootfs; remove it by hand"
  part="$ROOTFS.partial"
  if [ -e "$part" ]; then
    findmnt -rno TARGET | grep -q "^$part" && die "mounts left under $part; umount them first"
    rm -rf --one-file-system "$part"
  fi
  say "debootstrap bookworm -> $ROOTFS (once; needs $MIRROR)"
  debootstrap --variant=minbase --include="$INCLUDE" bookworm "$part" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || die "debootstrap failed, see $CACHE/debootstrap.log"
  echo edged-e2e > "$part/etc/hostname"
  mv "$part" "$ROOTFS"
  say "rootfs ready ($(du -sh "$ROOTFS" | cut -f1))"
fi
[ "$(stat -c %d:%i "$ROOTFS")" != "$(stat -c %d:%i /)" ] || die "ROOTFS is this machine's root"

# nspawn needs a cgroup subtree of its own. With systemd as this machine's PID 1 nspawn asks it for a
# scope; otherwise (CI containers, sandboxes) it gets a dedicated cgroup and --keep-unit.
CG_DIRS=()
if [ -d /run/systemd/system ]; then
  MODE_ARGS=(--register=no)
else
  MODE_ARGS=(--register=no --keep-unit)
  case "$(stat -fc %T /sys/fs/cgroup)" in
    cgroup2fs) CG_DIRS+=("/sys/fs/cgroup/$MACHINE") ;;
    tmpfs)     [ -d /sys/fs/cgroup/systemd ] && CG_DIRS+=("/sys/fs/cgroup/systemd/$MACHINE")
               [ "$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)" = cgroup2fs ] && CG_DIRS+=("/sys/fs/cgroup/unified/$MACHINE") ;;
    *) die "unknown cgroup layout at /sys/fs/cgroup" ;;
  esac
  [ ${#CG_DIRS[@]} -gt 0 ] || die "no name=systemd or cgroup2 hierarchy here"
fi

BINDS=(--bind-ro="$PAYLOAD:/srv/payload")
for p in $BIND_RO; do BINDS+=(--bind-ro="$p:$p"); done

NSPAWN_PID= LEADER= TEST_PID=
kill_ct_desc() { # signal the descendants of $2 that live in the container's PID namespace
  local c ns; ns=$(readlink /proc/"$LEADER"/ns/pid 2>/dev/null) || return 0
  for c in $(cat /proc/"$2"/task/*/children 2>/dev/null); do
    kill_ct_desc "$1" "$c"
    [ "$(readlink /proc/"$c"/ns/pid 2>/dev/null)" = "$ns" ] && kill -"$1" "$c" 2>/dev/null
  done
  return 0
}
cleanup() {
  local rc=$?
  if [ -n "$TEST_PID" ] && kill -0 "$TEST_PID" 2>/dev/null; then
    kill_ct_desc TERM "$TEST_PID"; sleep 2; kill_ct_desc KILL "$TEST_PID"; wait "$TEST_PID" 2>/dev/null || true
  fi
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    say "powering off $MACHINE"
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true   # nspawn turns it into an orderly halt
    for _ in $(seq 1 300); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$NSPAWN_PID" 2>/dev/null; then
      [ -n "$LEADER" ] && kill -KILL "$LEADER" 2>/dev/null
      sleep 0.5; kill -KILL "$NSPAWN_PID" 2>/dev/null || true
    fi
    wait "$NSPAWN_PID" 2>/dev/null || true
  fi
  for d in "${CG_DIRS[@]}"; do [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
  rmdir "/run/systemd/nspawn/propagate/$MACHINE" 2>/dev/null || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "booting $MACHINE (console: $LOG)"
(
  for d in "${CG_DIRS[@]}"; do mkdir -p "$d"; echo "$BASHPID" > "$d/cgroup.procs"; done
  exec systemd-nspawn --quiet -D "$ROOTFS" -M "$MACHINE" --boot "${MODE_ARGS[@]}" \
       --volatile=overlay --private-network --link-journal=no --resolv-conf=off --timezone=off \
       "${BINDS[@]}" --console=read-only
) </dev/null >"$LOG" 2>&1 &
NSPAWN_PID=$!
for _ in $(seq 1 $((BOOT_TIMEOUT * 10))); do
  kill -0 "$NSPAWN_PID" 2>/dev/null || { cat "$LOG"; die "systemd-nspawn exited during boot"; }
  for c in $(cat /proc/"$NSPAWN_PID"/task/*/children 2>/dev/null); do
    [ "$(cat /proc/"$c"/comm 2>/dev/null)" = systemd ] && LEADER=$c
  done
  [ -n "$LEADER" ] && break
  sleep 0.1
done
[ -n "$LEADER" ] || { cat "$LOG"; die "the container's init never appeared"; }
in_ct() { nsenter -t "$LEADER" -a env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            TERM=dumb LANG=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"; }
state=
for _ in $(seq 1 $((BOOT_TIMEOUT * 5))); do
  state=$(in_ct timeout 5 systemctl is-system-running --wait 2>/dev/null) || true
  case "$state" in running|degraded) break;; esac
  sleep 0.2
done
case "$state" in running|degraded) ;; *) cat "$LOG"; die "the container did not boot (state '$state')";; esac
say "booted: init pid $LEADER, $state"

set +e
# shellcheck disable=SC2016
in_ct timeout "$TEST_TIMEOUT" bash -c 'rc=0; for t; do /srv/payload/"$t" || rc=1; done; exit $rc' tests $TESTS &
TEST_PID=$!
wait "$TEST_PID"
rc=$?
TEST_PID=
set -e
say "test exit status $rc"
[ "$rc" != 0 ] || rm -f "$LOG"   # keep the console log of a failed run only
exit $rc
