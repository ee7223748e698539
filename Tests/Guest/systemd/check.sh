#!/bin/bash
# vigil-guest-check: the in-guest half of Scripts/guest-test, run by
# vigil-guest-check.service (Type=idle) on each boot of a Debian 12 guest
# with systemd as PID 1, real logind and journald, and the vigil package
# installed with dpkg -i and vigild.service enabled.
#
# It reports on the second serial port (/dev/ttyS1) in "@@" lines that the
# host-side driver (Tests/Guest/driver.py) reads together with qemu's QMP
# events (SUSPEND, WAKEUP, RESET): "@@ rc NAME STATUS", "@@ check NAME ok|fail
# DETAIL", and dumps between "@@ begin NAME" and "@@ end NAME". The tick
# strategy of /etc/vigil/vigil.toml writes "@@ tick N UPTIME" itself.
#
# Boot 1 (the phase file is absent):
#   the system and the service: running, nothing failed, vigild on the bus
#   with its unit and capabilities; a `vigilctl hold` client lease and the
#   keep strategy's lease in busctl, vigilctl and systemd-inhibit --list;
#   systemctl suspend --check-inhibitors=yes refused;
#   ten forced suspends, each ended by vigild's own wake_system alarm, with
#   the hold lease's state after each; one ended by an RTC alarm (rtcwake);
#   one with no alarm at all, which the driver ends; journald priorities;
#   a persistent periodic-wake added by reload; then systemctl reboot.
# Boot 2: how the previous run ended, the persistent run after boot, the
# user service for a lingering user and wakepy through it; then poweroff.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LANG=C.UTF-8
state=/var/lib/vigil-guest
mkdir -p "$state" /run/vigil-guest
ticks=/var/lib/vigil/guest-ticks

exec 3>/dev/ttyS1
say() { echo "@@ $*" >&3; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }
# dump NAME FILE: a file between markers, for the driver.
dump() { say "begin $1"; cat "$2" >&3; echo >&3; say "end $1"; }
# run NAME CMD...: runs a command, dumps its output and its exit status.
run() {
    local name=$1; shift
    "$@" > "/run/vigil-guest/out.$name" 2>&1
    local rc=$?
    dump "$name" "/run/vigil-guest/out.$name"
    say "rc $name $rc"
    return $rc
}
# check NAME CONDITION-CMD... : one verdict line.
check() {
    local name=$1; shift
    if "$@" > "/run/vigil-guest/check.$name" 2>&1; then
        say "check $name ok"
    else
        say "check $name fail $(head -c 300 "/run/vigil-guest/check.$name" | tr '\n' ' ')"
    fi
}
# wait_until SECONDS CMD...: polls CMD every 0.2 s, bounded; the guest's
# state files are the events (no inotify tool in the root).
wait_until() {
    local until=$(( $(cut -d. -f1 /proc/uptime) + $1 )); shift
    until "$@" > /dev/null 2>&1; do
        [ "$(cut -d. -f1 /proc/uptime)" -ge "$until" ] && return 1
        sleep 0.2
    done
}
tick_count() { [ -f "$ticks" ] && wc -l < "$ticks" || echo 0; }
last_tick() { [ -f "$ticks" ] && tail -n1 "$ticks" || echo 0; }
ticks_over() { [ "$(tick_count)" -gt "$1" ]; }
# The lease of the vigilctl hold (name guest-hold): "ID STATE RENEWALS", or "none".
hold_lease() {
    vigilctl leases --json 2>/dev/null | python3 -c '
import json, sys
for lease in json.load(sys.stdin):
    if lease.get("name") == "guest-hold" or "guest-hold" in lease.get("holds", ""):
        print(lease.get("id"), lease.get("state"), lease.get("renewals")); break
else:
    print("none")'
}
vigild_journal() { journalctl -b -u vigild.service -o cat --no-pager; }

phase=$(cat "$state/phase" 2>/dev/null || echo 1)
say "boot $phase $(uptime_s)"
running=$(systemctl is-system-running --wait 2>&1)
say "running $(uptime_s) $running"

if [ "$phase" = 1 ]; then
    echo 2 > "$state/phase"
    sync
    check system-running test "$running" = running
    run failed-units systemctl --failed --no-legend --plain
    check no-failed-units test ! -s /run/vigil-guest/out.failed-units
    check vigild-active systemctl is-active --quiet vigild.service
    run bus-status busctl --system status org.vigil.Vigil1
    check bus-status-unit grep -q '^Unit=vigild.service$' /run/vigil-guest/out.bus-status
    # busctl wraps long values onto indented lines.
    caps=$(tr -s ' \n' ' ' < /run/vigil-guest/out.bus-status | grep -o 'EffectiveCapabilities=[a-z_ ]*')
    check bus-status-capabilities sh -c "echo '$caps' | grep -q cap_wake_alarm && echo '$caps' | grep -q cap_block_suspend"

    # A client lease, as a user would take one: budget 20 s, renewed by
    # vigilctl with a quarter left; it ends when the file appears.
    vigilctl hold --budget 20s --name guest-hold --why "guest: a client lease" -- \
        sh -c 'until [ -e /run/vigil-guest/stop-hold ]; do sleep 0.5; done' > /run/vigil-guest/hold.out 2>&1 &
    hold_pid=$!
    wait_until 30 sh -c 'vigilctl leases --json | grep -q guest-hold' || { say "check hold-began fail"; dump hold-output /run/vigil-guest/hold.out; }
    wait_until 30 sh -c 'systemd-inhibit --list --no-pager | grep -q "guest-hold"'
    run inhibit-list systemd-inhibit --list --no-pager
    check inhibit-list-hold grep -q 'vigil: guest-hold' /run/vigil-guest/out.inhibit-list
    check inhibit-list-strategy grep -q 'vigil: keep' /run/vigil-guest/out.inhibit-list
    run list-leases busctl --system call org.vigil.Vigil1 /org/vigil/Vigil1 org.vigil.Vigil1.Host ListLeases
    check busctl-leases sh -c 'grep -q guest-hold /run/vigil-guest/out.list-leases && grep -q "\"keep\"" /run/vigil-guest/out.list-leases'
    run vigilctl-leases vigilctl leases
    check vigilctl-leases sh -c 'grep -q guest-hold /run/vigil-guest/out.vigilctl-leases && grep -q keep /run/vigil-guest/out.vigilctl-leases'
    run vigilctl-status vigilctl status
    check vigilctl-status grep -Eq 'leases: +2 active' /run/vigil-guest/out.vigilctl-status
    check vigilctl-can-wake grep -Eq 'can wake system: +yes' /run/vigil-guest/out.vigilctl-status
    # A block lease refuses a suspend that checks inhibitors (and names it).
    run suspend-checked systemctl suspend --check-inhibitors=yes
    refused=$?
    check suspend-refused sh -c "[ $refused -ne 0 ] && grep -q guest-hold /run/vigil-guest/out.suspend-checked"
    say "hold-lease-before $(hold_lease)"

    # Ten forced suspends, each right after a tick: only the tick's own
    # alarm (12 s period) can end them. After each, the woken run must
    # come (the driver times it from WAKEUP) and the hold lease must still
    # be the same active lease.
    wait_until 60 ticks_over 0 || say "check first-tick fail no tick within 60 s"
    # Each suspend starts right after a tick, so that the next one is about
    # 12 s away: an alarm due within 2 s of suspending makes the kernel
    # refuse to suspend at all.
    seen=$(tick_count); wait_until 30 ticks_over "$seen"
    for i in 1 2 3 4 5 6 7 8 9 10; do
        seen=$(tick_count)
        say "suspend alarm $i after-tick $(last_tick)"
        systemctl suspend --check-inhibitors=no
        wait_until 60 ticks_over "$seen" || say "check woken-run-$i fail no run within 60 s of the suspend"
        say "lease-after-suspend $i $(hold_lease)"
        # The next suspend starts after a tick: wait for the one after the woken run.
        [ $i -lt 10 ] && { seen=$(tick_count); wait_until 30 ticks_over "$seen"; }
    done

    # The hold never lapsed: vigilctl hold exits 0 (75 if it ran part of
    # the time without a lease), and vigild logged no lapse.
    touch /run/vigil-guest/stop-hold
    wait $hold_pid
    say "rc hold $?"
    dump hold-output /run/vigil-guest/hold.out
    check no-lapse sh -c '! journalctl -b -u vigild.service -o cat --no-pager | grep -q "ran out of budget"'

    # A forced suspend that an RTC alarm ends (not Vigil's: its next tick
    # is 12 s away when rtcwake's alarm is 4 s away).
    seen=$(tick_count); wait_until 30 ticks_over "$seen"
    rtcwake -m no -s 4 > /run/vigil-guest/rtcwake.out 2>&1
    say "suspend rtc 1 after-tick $(last_tick)"
    systemctl suspend --check-inhibitors=no
    wait_until 30 sh -c 'journalctl -b -u vigild.service -o cat --no-pager | grep -c "system resumed" | grep -qx 11'

    # A suspend with no alarm at all: the tick no longer wakes the system
    # (a reload changes it), so the driver must end it after a quiet time.
    sed -i 's/^wake_system = true/wake_system = false/' /etc/vigil/vigil.toml
    run reload-quiet systemctl reload vigild.service
    say "suspend quiet 1"
    systemctl suspend --check-inhibitors=no
    wait_until 90 sh -c 'journalctl -b -u vigild.service -o cat --no-pager | grep -c "system resumed" | grep -qx 12'

    # journald: a warning (grumpy's failed run) at PRIORITY=4 and an error
    # (a reload of an invalid config) at 3; nothing from libdispatch or
    # the Swift runtime.
    cp /etc/vigil/vigil.toml "$state/vigil.toml.good"
    printf '\n[[strategy]]\nname = "broken"\nkind = "periodic-wake"\nevry = "1m"\nrun = ["true"]\n' >> /etc/vigil/vigil.toml
    run reload-invalid systemctl reload vigild.service
    cp "$state/vigil.toml.good" /etc/vigil/vigil.toml
    wait_until 10 sh -c 'journalctl -b -u vigild.service -p 3..3 -o cat --no-pager | grep -q "is invalid"'
    journalctl -b -u vigild.service -o json --no-pager > /run/vigil-guest/journal.json
    check journal-priorities python3 -c '
import json
lines = [json.loads(l) for l in open("/run/vigil-guest/journal.json")]
def has(priority, text):
    return any(l.get("PRIORITY") == priority and text in str(l.get("MESSAGE", "")) for l in lines)
assert has("4", "run #1"), "no warning at PRIORITY=4 about grumpy'"'"'s failed run"
assert has("3", "is invalid"), "no error at PRIORITY=3 about the invalid config"
'
    check journal-no-runtime-lines python3 -c '
import json, re
bad = [l.get("MESSAGE") for l in map(json.loads, open("/run/vigil-guest/journal.json"))
       if re.search(r"thread priority|libdispatch|dispatch_|Swift runtime|swift_|Fatal error", str(l.get("MESSAGE", "")))]
assert not bad, bad[:3]
'

    # A persistent periodic-wake, added by reload, runs once now; the
    # reboot lets its next slot pass while the machine is down.
    cat >> /etc/vigil/vigil.toml <<'EOF'

[[strategy]]
name = "nightly"
kind = "periodic-wake"
every = "15s"
persistent = true
catch_up = "once"
run = ["/bin/sh", "-c", "echo \"$VIGIL_SEQUENCE $VIGIL_CATCH_UP_INDEX $(cut -d' ' -f1 /proc/uptime)\" >> /var/lib/vigil/guest-nightly"]
EOF
    run reload-nightly systemctl reload vigild.service
    wait_until 40 test -s /var/lib/vigil/guest-nightly || say "check nightly-first-run fail no run within 40 s of the reload"
    run strategies-json vigilctl strategies --json
    # How each resume went, for the figures and for diagnosis.
    run resume-journal journalctl -b -o short-monotonic --no-pager -g 'PM: suspend (entry|exit)|system resumed|Operation|run #|sleep'
    run survival-text vigilctl survival --state-dir /var/lib/vigil --runs 1
    say "reboot $(uptime_s)"
    sync
    systemctl reboot
    exit 0
fi

# Boot 2.
echo 3 > "$state/phase"
sync
check vigild-active-after-reboot systemctl is-active --quiet vigild.service
run survival-json vigilctl survival --state-dir /var/lib/vigil --runs 3 --json

# The persistent strategy: its slot passed while the machine was down, so
# it ran once as vigild started (and vigild said why).
started=$(systemctl show -P ActiveEnterTimestampMonotonic vigild.service)
say "vigild-started $(awk -v us="$started" 'BEGIN { printf "%.2f", us / 1e6 }')"
dump nightly /var/lib/vigil/guest-nightly
run journal-boot2 journalctl -b -u vigild.service -o cat --no-pager

# The user service: a user with lingering gets their own systemd, and
# vigild from the package's user unit on their session bus.
loginctl enable-linger alice
wait_until 60 test -S /run/user/1000/bus || say "check user-bus fail no /run/user/1000/bus"
as_alice() { runuser -u alice -- env XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus "$@"; }
run user-enable as_alice systemctl --user enable --now vigild.service
wait_until 60 as_alice busctl --user status org.vigil.Vigil1
run user-bus-status as_alice busctl --user status org.vigil.Vigil1
check user-service grep -q '^UserUnit=vigild.service$' /run/vigil-guest/out.user-bus-status
run wakepy as_alice python3 /usr/local/share/vigil-guest/wakepy-check.py
check wakepy-lease grep -q '^lease held through vigild' /run/vigil-guest/out.wakepy
run user-journal as_alice journalctl --user -u vigild.service -o cat --no-pager
say "done $(uptime_s)"
sync
systemctl poweroff
