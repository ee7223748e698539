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
# sleep_briefly: 0.2 s without a process (read's timeout on a pipe that
# never speaks): polling loops must not load a slow guest.
exec 4<> <(:)
sleep_briefly() { read -r -t 0.2 -u 4 _; return 0; }
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
# check NAME CONDITION-CMD... : one verdict line; fails as the condition did.
check() {
    local name=$1; shift
    if "$@" > "/run/vigil-guest/check.$name" 2>&1; then
        say "check $name ok"
    else
        say "check $name fail $(head -c 300 "/run/vigil-guest/check.$name" | tr '\n' ' ')"
        return 1
    fi
}
# wait_until SECONDS CMD...: polls CMD every 0.2 s, bounded; the guest's
# state files are the events (no inotify tool in the root).
wait_until() {
    local now until
    read -r now _ < /proc/uptime; until=$(( ${now%%.*} + $1 )); shift
    until "$@" > /dev/null 2>&1; do
        read -r now _ < /proc/uptime
        [ "${now%%.*}" -ge "$until" ] && return 1
        sleep_briefly
    done
    return 0
}
# Each tick's run adds "SEQUENCE UPTIME LATENESS_MS" to $ticks.
ticks_over() { read_ticks; [ "$TICKS" -gt "$1" ]; }
# The tick strategy's period (vigil.toml), and the room a forced suspend
# needs before the next tick's alarm. The kernel refuses to suspend with an
# alarm less than 2 s away (alarmtimer: -EBUSY), and an alarm that falls due
# while the suspend is still on its way is lost (the guest sleeps until the
# driver wakes it). The way from the room's check to the kernel's suspend
# entry took about 2 s on an idle CI machine, and 10-17 s in a guest that
# reached 'running' at uptime 130 s, beside a build (2026-12-03), when
# the check itself spawned processes; 20 s of room, in a 30 s period, and
# a check in builtins: from the check to SUSPEND 3-6 s in a guest held to
# 38 % of a core.
tick_period=30
suspend_room=20
# read_ticks: sets TICKS (how many runs wrote to $ticks), LAST (the last
# run's number) and ROOM: whole seconds, at least, to the next tick's alarm:
# the last run's nominal time (its uptime less its lateness, less 1.5 s for
# its lease and its sh to start) plus the period, less now. A woken run
# starts late by the resume, and its lateness says by how much. Bash
# builtins only: a process costs up to a second in a slow guest, and the
# room must still be there when `systemctl suspend` runs.
read_ticks() {
    local lines=() up late now
    [ -f "$ticks" ] && mapfile -t lines < "$ticks"
    TICKS=${#lines[@]}
    if [ "$TICKS" = 0 ]; then LAST=0; ROOM=0; return; fi
    read -r LAST up late <<< "${lines[TICKS - 1]}"
    read -r now _ < /proc/uptime
    # Centiseconds: /proc/uptime has two decimals; the lateness is in ms.
    late=${late%%.*}; [ -n "$late" ] && [ "$late" != "-" ] || late=0
    ROOM=$(( (10#${up/./} - late / 10 - 150 + tick_period * 100 - 10#${now/./}) / 100 ))
}
# await_room ROOM: waits for the next tick (at most three times) until the
# tick's next alarm is at least ROOM s away; returns with read_ticks' values.
await_room() {
    local tries=0
    read_ticks
    while [ "$ROOM" -lt "$1" ] && [ $tries -lt 3 ]; do
        wait_until 50 ticks_over "$TICKS"
        read_ticks; tries=$((tries + 1))
    done
}
# The kernel's own count of suspends it refused or could not finish.
kernel_suspend_failures() { dmesg | grep -cE 'PM: (Some devices failed to suspend|failed to suspend)'; }
# no_new_suspend_failures COUNT: the kernel refused no suspend since it
# counted COUNT; else prints what it said.
no_new_suspend_failures() {
    [ "$(kernel_suspend_failures)" = "$1" ] || { echo "the kernel refused the suspend:"; dmesg | grep -E 'PM: ' | tail -n 3; false; }
}
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
# journal_count TEXT: how many of vigild's journal lines (this boot) say TEXT.
journal_count() { vigild_journal | grep -cF -- "$1"; }
journal_over() { [ "$(journal_count "$1")" -gt "$2" ]; }
# metrics_are NAME VALUE [NAME VALUE ...]: vigild's /metrics ([metrics]
# listen) says so; else prints what it says.
metrics_are() {
    python3 - "$@" <<'PY'
import sys, urllib.request
try:
    text = urllib.request.urlopen("http://127.0.0.1:9469/metrics", timeout=5).read().decode()
except OSError as e:
    sys.exit(f"no metrics: {e}")
values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
wanted = dict(zip(sys.argv[1::2], sys.argv[2::2]))
wrong = {name: values.get(name) for name, value in wanted.items() if values.get(name) != value}
sys.exit(f"metrics {wrong}, expected {wanted}" if wrong else 0)
PY
}
# The dark phase's job (vigil-dark.toml's sync strategy): runs started and ended.
jobs_started() { [ -f /var/lib/vigil/guest-jobs-started ] && wc -l < /var/lib/vigil/guest-jobs-started || echo 0; }
jobs_ended() { [ -f /var/lib/vigil/guest-jobs-ended ] && wc -l < /var/lib/vigil/guest-jobs-ended || echo 0; }
started_at_least() { [ "$(jobs_started)" -ge "$1" ]; }
ended_at_least() { [ "$(jobs_ended)" -ge "$1" ]; }

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
    # The keyboard's event device, which vigild reads during a dark wake.
    check input-devices sh -c 'ls /dev/input/event*'
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
    # keep and guest-hold are held throughout; tick's run, every 30 s, holds
    # a short lease of its own while its command runs, so a third may show.
    check vigilctl-status awk '/^ *leases: +[0-9]+ active/ { n = $2 } END { exit !(n == 2 || n == 3) }' /run/vigil-guest/out.vigilctl-status
    check vigilctl-can-wake grep -Eq 'can wake system: +yes' /run/vigil-guest/out.vigilctl-status
    # A block lease refuses a suspend that checks inhibitors (and names it).
    run suspend-checked systemctl suspend --check-inhibitors=yes
    refused=$?
    check suspend-refused sh -c "[ $refused -ne 0 ] && grep -q guest-hold /run/vigil-guest/out.suspend-checked"
    say "hold-lease-before $(hold_lease)"

    # A subscriber to SleepBrokeLease (jeepney): each forced suspend below
    # begins while the keep and guest-hold leases hold sleep, so each breaks both.
    python3 -u /usr/local/share/vigil-guest/broken-lease-watch.py > /run/vigil-guest/broken.out 2>&1 &
    watch_pid=$!
    wait_until 30 grep -q '^subscribed' /run/vigil-guest/broken.out || say "check broken-lease-subscribed fail $(head -c 200 /run/vigil-guest/broken.out)"

    # Ten forced suspends, each with room before the tick's next alarm
    # (read_ticks): only that alarm can end them. After each, the woken run
    # must come (the driver times it from WAKEUP) and the hold lease must
    # still be the same active lease. The next suspend follows at once when
    # the room allows, else after the next tick.
    wait_until 60 ticks_over 0 || say "check first-tick fail no tick within 60 s"
    kernel_failures=$(kernel_suspend_failures)
    for i in 1 2 3 4 5 6 7 8 9 10; do
        # Right after a tick's run the room is largest; nothing slow may
        # come between its check and the suspend (the kernel's count was
        # read before: no suspend came since).
        await_room $suspend_room
        seen=$TICKS
        say "suspend alarm $i after-tick $LAST room $ROOM"
        systemctl suspend --check-inhibitors=no
        wait_until 90 ticks_over "$seen" || say "check woken-run-$i fail no run within 90 s of the suspend"
        # The count moves only with a refusal (read again then, not each
        # time: dmesg costs seconds in a slow guest, and time after the
        # woken run is the next suspend's room).
        check kernel-suspended-$i no_new_suspend_failures "$kernel_failures" || kernel_failures=$(kernel_suspend_failures)
        say "lease-after-suspend $i $(hold_lease)"
    done

    # Sleep that broke a lease: ten suspends forced with -i while two
    # leases held sleep in block mode, told in the metrics, the journal (a
    # warning), the survival log and over D-Bus to the subscriber.
    wait_until 20 metrics_are vigil_sleep_broke_leases_total 10
    check broken-lease-metric metrics_are vigil_sleep_broke_leases_total 10 vigil_broken_leases_total 20
    journalctl -b -u vigild.service -p 4..4 -o cat --no-pager > /run/vigil-guest/warnings.out
    check broken-lease-journal sh -c '[ "$(grep -c "although 2 leases held sleep (woken by vigil-alarm)" /run/vigil-guest/warnings.out)" = 10 ] || { grep -i "held sleep" /run/vigil-guest/warnings.out; false; }'
    kill $watch_pid 2>/dev/null
    dump broken-lease-signals /run/vigil-guest/broken.out
    check broken-lease-signal python3 -c '
import json
signals = [json.loads(l) for l in open("/run/vigil-guest/broken.out") if l.startswith("{")]
keep = [s for s in signals if s["holder"] == "keep" and s["wake_cause"] == "vigil-alarm" and s["slept_usec"] > 1000000]
hold = [s for s in signals if s["holder"] == "client" and s["name"] == "guest-hold" and s["wake_cause"] == "vigil-alarm"]
assert len(keep) == 10 and len(hold) == 10, f"{len(keep)} signals for keep, {len(hold)} for guest-hold, expected 10 each: {signals[:3]}"
assert all(s["lease"].startswith("/org/vigil/Vigil1/Lease/") for s in signals), signals[:3]
'
    vigilctl survival --state-dir /var/lib/vigil --runs 1 --json > /run/vigil-guest/broken-survival.json 2>&1
    check broken-lease-survival python3 -c '
import json
run = json.load(open("/run/vigil-guest/broken-survival.json"))[0]
broken = run.get("brokenSleeps") or []
assert len(broken) == 10, f"{len(broken)} broken sleeps, expected 10: {broken[:2]}"
for b in broken:
    holders = sorted(l["holder"] for l in b["leases"])
    assert holders == ["client", "keep"] and b["wakeCause"] == "vigil-alarm" and b["sleptMicros"] > 1000000, b
'

    # The hold never lapsed: vigilctl hold exits 0 (75 if it ran part of
    # the time without a lease), and vigild logged no lapse.
    touch /run/vigil-guest/stop-hold
    wait $hold_pid
    say "rc hold $?"
    dump hold-output /run/vigil-guest/hold.out
    check no-lapse sh -c '! journalctl -b -u vigild.service -o cat --no-pager | grep -q "ran out of budget"'

    # A forced suspend that an RTC alarm ends (not Vigil's: rtcwake's alarm
    # is 15 s away, the tick's at least 20 s: more than the 2 s within
    # which vigild takes a wake for its own alarm's).
    await_room 21
    rtcwake -m no -s 15 > /run/vigil-guest/rtcwake.out 2>&1
    say "suspend rtc 1 after-tick $LAST"
    systemctl suspend --check-inhibitors=no
    wait_until 60 sh -c 'journalctl -b -u vigild.service -o cat --no-pager | grep -c "system resumed" | grep -qx 11'

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

    # Wake, work, sleep again. Only the sync strategy (vigil-dark.toml):
    # no lease holds sleep between its runs. The check suspends once, right
    # after a run; then vigild's alarm wakes the guest for each run and
    # vigild must put it back to sleep after the run's end (the driver
    # times each SUSPEND from the job's end) three times in a row.
    install -m 0600 /usr/local/share/vigil-guest/vigil-dark.toml /etc/vigil/vigil.toml
    run reload-dark systemctl reload vigild.service
    wait_until 80 ended_at_least 1 || say "check dark-first-job fail no run of sync within 80 s of the reload"
    first=$(jobs_started)
    say "returns 3"
    say "suspend dark-start 1"
    systemctl suspend --check-inhibitors=no
    # The fourth wake's run: keys pressed on the guest's keyboard (QMP, by
    # the driver) during the run keep the machine awake.
    wait_until 180 started_at_least $((first + 4)) || say "check dark-fourth-job fail: $(jobs_started) runs started, expected $((first + 4))"
    say "press-keys"
    wait_until 30 journal_over "for sync: keys pressed" 0
    check stay-keys sh -c "journalctl -b -u vigild.service -o cat --no-pager | grep -F 'staying awake after vigild' | grep -F 'for sync: keys pressed'"

    # Another program's sleep inhibitor in block mode keeps it awake.
    systemd-inhibit --what=sleep --mode=block --who=guest-check --why="guest: another program" sleep 600 &
    inhibit_pid=$!
    wait_until 10 sh -c 'systemd-inhibit --list --no-pager | grep -q guest-check'
    ended=$(jobs_ended); wait_until 60 ended_at_least $((ended + 1))
    say "suspend inhibited 1"
    systemctl suspend --check-inhibitors=no
    wait_until 60 journal_over "another program holds a sleep inhibitor" 0
    check stay-inhibitor sh -c "journalctl -b -u vigild.service -o cat --no-pager | grep -F 'for sync: another program holds a sleep inhibitor' | grep -q guest-check"
    kill $inhibit_pid

    # A wake that was not vigild's (an RTC alarm 10 s away; sync's is about
    # 21 s away): the machine stays awake, through the next run too.
    # Counted first: journalctl takes seconds on a loaded guest, and the RTC
    # alarm must stay more than 2 s clear of sync's (vigild puts a wake up
    # to 2 s before its own alarm down to that alarm).
    others=$(journal_count "staying awake: the wake was not vigild's")
    ended=$(jobs_ended); wait_until 60 ended_at_least $((ended + 1))
    rtcwake -m no -s 10 > /run/vigil-guest/rtcwake-dark.out 2>&1
    say "suspend rtc-dark 1"
    systemctl suspend --check-inhibitors=no
    wait_until 40 journal_over "staying awake: the wake was not vigild's" "$others"
    check stay-not-vigild journal_over "staying awake: the wake was not vigild's" "$others"
    # The next run and 8 s after it (grace 1 s, a loaded guest's way to
    # sleep, room): no SUSPEND
    # may come (the driver fails any it was not told of).
    ended=$(jobs_ended); wait_until 60 ended_at_least $((ended + 1))
    sleep 8
    say "returns-end"

    check dark-journal sh -c '[ "$(journalctl -b -u vigild.service -o cat --no-pager | grep -c "returned the system to sleep: the work of sync")" = 3 ]'
    check dark-metrics metrics_are vigil_returns_to_sleep_total 3 'vigil_dark_wakes_total{outcome="asleep-again"}' 3
    run dark-survival-json vigilctl survival --state-dir /var/lib/vigil --runs 1 --json
    check dark-survival python3 -c '
import json
run = json.loads(open("/run/vigil-guest/out.dark-survival-json").read())[0]
sync = [d for d in run.get("darkWakes") or [] if d.get("alarmStrategy") == "sync"]
again = [d for d in sync if d["outcome"] == "asleep-again"]
assert len(again) == 3, f"{len(again)} returns to sleep for sync, expected 3: {sync}"
assert all(d["workEndedAfterMicros"] >= 4000000 and d["awakeMicros"] >= d["workEndedAfterMicros"] for d in again), again
stayed = {d.get("refusal"): d.get("reason") for d in sync if d["outcome"] == "stayed-awake"}
assert stayed.get("person") == "keys pressed", stayed
assert "guest-check" in (stayed.get("inhibitor") or ""), stayed
'
    run dark-survival-text vigilctl survival --state-dir /var/lib/vigil --runs 1
    check dark-survival-text sh -c 'grep -q "woke for sync, asleep again after" /run/vigil-guest/out.dark-survival-text && grep -q "woke for sync, stayed awake: keys pressed" /run/vigil-guest/out.dark-survival-text'
    cp "$state/vigil.toml.good" /etc/vigil/vigil.toml

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
