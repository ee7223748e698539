# Randomized calls to vigild (docs/security.md): random members, paths,
# interfaces, signatures (nested arrays, structs, dicts, variants), sizes,
# fds and unicode. Usage: dbus-fuzz.py ADDRESS SEED COUNT; prints each
# outcome (error name) with its count, then "done COUNT".
import os, random, sys, dbus
address, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
bus = dbus.bus.BusConnection(address)
NAME = "org.vigil.Vigil1"
devnull = os.open("/dev/null", os.O_RDONLY)
PATHS = ["/org/vigil/Vigil1", "/org/vigil/Vigil1/Lease/1", "/org/vigil/Vigil1/Strategy/x", "/", "/org", "/nope",
         "/org/vigil/Vigil1/" + "p" * 3000]
IFACES = ["org.vigil.Vigil1.Host", "org.freedesktop.DBus.Properties", "org.freedesktop.DBus.Introspectable",
          "org.freedesktop.DBus.ObjectManager", "org.vigil.Vigil1.ClientLease", "org.vigil.Vigil1.Lease",
          "org.vigil.Vigil1.Strategy", "org.freedesktop.DBus.Peer", None]
MEMBERS = ["ListLeases", "ListStrategies", "BeginBackgroundTask", "Reload", "Get", "GetAll", "Set", "Introspect",
           "GetManagedObjects", "End", "Renew", "Ping", "Nope"]
LETTERS = ["a", "Z", "é", "\u202e", "\x1b", "\r", "\n", "\x07", "\U0001F600", "\ufffd", "\u200b", " "]

def text():
    return "".join(rng.choice(LETTERS) for _ in range(rng.choice([0, 1, 7, 60, 700, 9000])))

def gen_type(depth):
    r = rng.random()
    if depth < 4:
        if r < 0.12: return "a" + gen_type(depth + 1)
        if r < 0.20: return "(" + "".join(gen_type(depth + 1) for _ in range(rng.randint(1, 3))) + ")"
        if r < 0.26: return "a{" + rng.choice("sxuyo") + gen_type(depth + 1) + "}"
        if r < 0.32: return "v"
    return rng.choice("ybnqiuxtdsogh")

def end_of(sig, i):
    c = sig[i]
    if c == "a":
        if sig[i + 1] == "{":
            return end_of(sig, end_of(sig, i + 2)) + 1
        return end_of(sig, i + 1)
    if c == "(":
        j = i + 1
        while sig[j] != ")": j = end_of(sig, j)
        return j + 1
    return i + 1

def parts(sig):
    out, i = [], 0
    while i < len(sig):
        j = end_of(sig, i); out.append(sig[i:j]); i = j
    return out

def value(t, depth=0, level=0):
    c = t[0]
    kw = {"variant_level": level} if level else {}
    if c == "a" and t[1] == "{":
        k, v = parts(t[2:-1])
        n = rng.choice([0, 1, 4])
        return dbus.Dictionary({value(k, depth + 1): value(v, depth + 1) for _ in range(n)}, signature=k + v, **kw)
    if c == "a":
        e = t[1:]
        if e == "y" and rng.random() < 0.1:
            return dbus.ByteArray(os.urandom(rng.choice([0, 100, 70000, 3 << 20])), **kw)
        # The bus disconnects a peer that sends more than 16 fds in one message.
        n = rng.choice([0, 1, 2] if "h" in e or "v" in e else [0, 1, 3, 20])
        return dbus.Array([value(e, depth + 1) for _ in range(n)], signature=e, **kw)
    if c == "(":
        return dbus.Struct([value(p, depth + 1) for p in parts(t[1:-1])], signature=t[1:-1], **kw)
    if c == "v":
        return value(gen_type(depth + 2), depth + 1, level + 1)
    if c == "y": return dbus.Byte(rng.randrange(256), **kw)
    if c == "b": return dbus.Boolean(rng.random() < 0.5, **kw)
    if c == "n": return dbus.Int16(rng.randint(-2**15, 2**15 - 1), **kw)
    if c == "q": return dbus.UInt16(rng.randrange(2**16), **kw)
    if c == "i": return dbus.Int32(rng.randint(-2**31, 2**31 - 1), **kw)
    if c == "u": return dbus.UInt32(rng.randrange(2**32), **kw)
    if c == "x": return dbus.Int64(rng.randint(-2**63, 2**63 - 1), **kw)
    if c == "t": return dbus.UInt64(rng.randrange(2**64), **kw)
    if c == "d": return dbus.Double(rng.uniform(-1e300, 1e300), **kw)
    if c == "s": return dbus.String(text(), **kw)
    if c == "o": return dbus.ObjectPath(rng.choice(PATHS), **kw)
    if c == "g": return dbus.Signature(gen_type(3), **kw)
    if c == "h": return dbus.types.UnixFd(devnull, **kw)
    raise ValueError(t)

outcomes = {}
for n in range(count):
    member = rng.choice(MEMBERS)
    sig = "".join(gen_type(0) for _ in range(rng.choice([0, 1, 2, 3, 5])))
    if member == "BeginBackgroundTask" and sig == "sst": sig = "ss"  # no leases: they would outlive the script
    if rng.random() < 0.15: sig = {"Get": "ss", "GetAll": "s", "Renew": "t"}.get(member, sig)
    try:
        args = [value(t) for t in parts(sig)]
        # Mostly the root object and its interfaces, where the declared
        # methods (and their signature checks) are.
        path = PATHS[0] if rng.random() < 0.6 else rng.choice(PATHS)
        iface = rng.choice(IFACES[:2]) if rng.random() < 0.6 else rng.choice(IFACES)
        bus.call_blocking(NAME, path, iface, member, sig, args, timeout=60)
        outcome = "ok"
    except dbus.DBusException as e:
        outcome = e.get_dbus_name() or "?"
        if outcome == "org.freedesktop.DBus.Error.Disconnected":
            # The bus (not vigild) dropped us for a message over its limits.
            bus = dbus.bus.BusConnection(address)
    except (TypeError, ValueError, OverflowError) as e:
        outcome = "local:" + type(e).__name__
    outcomes[outcome] = outcomes.get(outcome, 0) + 1
    if n % 250 == 0:
        bus.call_blocking(NAME, "/org/vigil/Vigil1", "org.freedesktop.DBus.Properties", "Get", "ss",
                          ("org.vigil.Vigil1.Host", "Version"), timeout=60)
for k in sorted(outcomes): print(k, outcomes[k])
print("done", count)
