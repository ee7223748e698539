#!/bin/sh
# /init of the qemu guest of Scripts/guest-test (busybox sh, PID 1).
#
# Runs three phases, each with its own vigild run, and reports on the second
# serial port (/dev/ttyS1) in lines starting with "@@", which the host-side
# driver (Tests/Guest/driver.py) reads, together with qemu's QMP events
# (SUSPEND, WAKEUP), to check the results:
#   rtcwake   rtcwake -m mem -s 10: one suspend of about 10 s, woken by the RTC
#             alarm rtcwake set, not by Vigil;
#   alarm     a periodic-wake with wake_system = true; the guest suspends with
#             no other alarm set and must be woken by vigild's own alarm;
#   negative  the same with wake_system = false: the guest must stay asleep
#             until the driver wakes it over QMP.
# The guest has no time zone data, so every text report also proves the UTC
# fallback of vigilctl.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin:/opt/vigil/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /tmp /run /var/lib/vigil
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run

say() { echo "@@ $*" > /dev/ttyS1; }
# Dumps a file between markers so the driver can parse it.
dump() { say "begin $1"; cat "$2" > /dev/ttyS1; echo > /dev/ttyS1; say "end $1"; }
# run NAME CMD...: runs a command, dumps its output and exit status.
run() {
    name=$1; shift
    "$@" > /tmp/out.$name 2>&1
    rc=$?
    dump "$name" /tmp/out.$name
    say "rc $name $rc"
}
# wait_for FILE PATTERN SECONDS: vigild's log is the event to wait on; the
# guest has no inotify tool, so this polls it in 0.2 s steps, bounded.
wait_for() {
    n=0
    while ! grep -q "$2" "$1" 2>/dev/null; do
        n=$((n + 1))
        [ $n -gt $(($3 * 5)) ] && { say "timeout waiting for '$2' in $1"; return 1; }
        sleep 0.2
    done
}
say "boot $(cut -d' ' -f1 /proc/uptime)"

dbus-daemon --config-file=/etc/dbus-guest.conf --fork --print-address=1 > /tmp/bus
export DBUS_SESSION_BUS_ADDRESS=$(head -n1 /tmp/bus)
export DBUS_SYSTEM_BUS_ADDRESS=$DBUS_SESSION_BUS_ADDRESS

# phase NAME: starts vigild on /etc/vigil/NAME.toml, waits for its start.
start_vigild() {
    : > /tmp/tick.log
    vigild --config /etc/vigil/$1.toml --state-dir /var/lib/vigil --log-level debug > /tmp/vigild.$1.log 2>&1 &
    vigild_pid=$!
    wait_for /tmp/vigild.$1.log "started with" 60
}
stop_vigild() {
    kill -TERM $vigild_pid
    wait $vigild_pid
    say "rc vigild-$1 $?"
    dump "log-$1" /tmp/vigild.$1.log
    dump "ticks-$1" /tmp/tick.log
    run "survival-json-$1" vigilctl survival --state-dir /var/lib/vigil --runs 1 --json
}

# 1. rtcwake: a real suspend of about 10 s, woken by the RTC alarm rtcwake sets.
start_vigild rtcwake
say "phase rtcwake"
rtcwake -m mem -s 10 > /tmp/rtcwake.out 2>&1
say "rc rtcwake $?"
wait_for /tmp/vigild.rtcwake.log "system resumed" 30
run status-text vigilctl status
run status-json vigilctl status --json
stop_vigild rtcwake

# suspend_phase NAME TICKS: vigild on NAME.toml, then suspend to RAM with
# no alarm but vigild's; after the resume, wait until the tick's command has
# run TICKS times.
suspend_phase() {
    start_vigild $1
    say "phase $1"
    say "suspend-at $(cut -d' ' -f1 /proc/uptime)"
    echo mem > /sys/power/state
    say "resumed-at $(cut -d' ' -f1 /proc/uptime)"
    wait_for /tmp/vigild.$1.log "system resumed" 30
    wait_for /tmp/tick.log "^$2 " 60
    stop_vigild $1
}

# 2. alarm: nothing but vigild's wake_system alarm can wake the guest. The
# tick's command runs after the resume, then once more while awake (the
# lateness without suspend, for the figures).
suspend_phase alarm 2

# 3. negative: wake_system = false; the driver wakes the guest over QMP.
suspend_phase negative 1

run survival-text vigilctl survival --state-dir /var/lib/vigil --runs 0 --width 100
say "done $(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
