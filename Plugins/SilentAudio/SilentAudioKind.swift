import VigilKit
#if canImport(Glibc)
import Glibc
#endif

/// The plugin's entry point: the host calls it after dlopen.
@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([SilentAudioKind()])
}

/// How the signal is played.
public enum PlayMode: Sendable, Hashable {
    /// Without a pause.
    case always
    /// `length` of signal every `every`, faded in and out over `fade`; the
    /// stream is corked (paused) in between.
    case periodic(every: Duration, length: Duration, fade: Duration)
}

/// `silent-audio`: iOS's background audio mode (a silent track) and Windows'
/// SoundKeeper, on Linux. Keeps a PulseAudio or PipeWire-pulse sink awake
/// with an inaudible stream, so that S/PDIF, HDMI and Bluetooth receivers and
/// external amplifiers do not sleep and cut the start of the next sound.
public struct SilentAudioKind: StrategyKind {
    public init() {}
    public var name: String { "silent-audio" }
    public var summary: String { "keep an audio output awake with an inaudible stream (PulseAudio, PipeWire-pulse)" }

    public func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let server = config.string("server")
        // "@DEFAULT_SINK@" (libpulse's name for it) is the same as no sink:
        // the server's default sink, followed when it changes.
        let sink = config.string("sink").flatMap { $0 == Self.defaultSink ? nil : $0 }
        if let sink, sink.isEmpty { config.problem("sink", "expected a sink name (see `pactl list short sinks`), or \"\(Self.defaultSink)\" for the default sink") }
        let format = SampleFormat(rawValue: config.choice("format", SampleFormat.allCases.map(\.rawValue), default: "s16le")) ?? .s16le
        let rate = config.integer("rate").map { _ in Int(config.integer("rate", default: 48_000, range: 8_000...384_000)) }
        let channels = config.integer("channels").map { _ in Int(config.integer("channels", default: 2, range: 1...32)) }
        let latency = config.positiveDuration("latency", default: .seconds(2))
        if latency < .milliseconds(10) || latency > .seconds(10) {
            config.problem("latency", "expected a buffer length between 10ms and 10s, found \(latency.vigilDescription)")
        }
        let signal = Self.readSignal(config, rate: rate)
        let play = Self.readPlay(config, latency: latency)
        let reconnectInitial = config.positiveDuration("reconnect_initial", default: .seconds(1))
        let reconnectMax = config.positiveDuration("reconnect_max", default: .seconds(30))
        if reconnectMax < reconnectInitial {
            config.problem("reconnect_max", "must not be shorter than reconnect_initial (\(reconnectInitial.vigilDescription))")
        }
        let stopBeforeSleep = config.bool("stop_before_sleep", default: false)
        return SilentAudio(settings: SilentAudioSettings(
            server: server, sink: sink, signal: signal, play: play, format: format, rate: rate,
            channels: channels, latency: latency,
            reconnect: Backoff(initial: reconnectInitial, maximum: reconnectMax), stopBeforeSleep: stopBeforeSleep))
    }

    static let defaultSink = "@DEFAULT_SINK@"

    static let signals = ["zero", "fluctuate", "sine", "noise"]

    static func readSignal(_ config: ConfigReader, rate: Int?) -> Signal {
        let kind = config.choice("signal", signals, default: "fluctuate")
        // Keys that belong to other signals are refused, not ignored.
        let own: [String: [String]] = ["sine": ["frequency_hz", "amplitude"], "noise": ["noise", "amplitude"]]
        for key in ["frequency_hz", "amplitude", "noise"] where config.values[key] != nil && !(own[kind] ?? []).contains(key) {
            config.declare(key)
            config.problem(key, "only applies to signal = \(own.filter { $0.value.contains(key) }.keys.sorted().map { "\"\($0)\"" }.joined(separator: " or ")), but signal is \"\(kind)\"")
        }
        switch kind {
        case "zero": return .zero
        case "sine":
            let amplitude = readAmplitude(config)
            let frequency = config.number("frequency_hz", default: 20)
            if frequency <= 0 {
                config.problem("frequency_hz", "expected a frequency above 0 Hz, found \(frequency)")
            } else if let rate, frequency >= Double(rate) / 2 {
                config.problem("frequency_hz", "\(Signal.hertz(frequency)) Hz is not below half the sample rate (\(rate) Hz / 2 = \(Signal.hertz(Double(rate) / 2)) Hz); a sampled sine must stay below that")
            } else if rate == nil, frequency >= 192_000 {
                config.problem("frequency_hz", "\(Signal.hertz(frequency)) Hz is above half of any supported sample rate")
            }
            return .sine(frequency: frequency, amplitude: amplitude)
        case "noise":
            let amplitude = readAmplitude(config)
            let color = NoiseColor(rawValue: config.choice("noise", NoiseColor.allCases.map(\.rawValue), default: "white")) ?? .white
            return .noise(color, amplitude: amplitude)
        default:
            return .fluctuate
        }
    }

    /// `amplitude`: the peak level, as `"-60dBFS"` (0 dBFS is full scale) or
    /// `"1%"` of full scale, or a number in (0, 1]. Default -60 dBFS.
    static func readAmplitude(_ config: ConfigReader) -> Double {
        config.declare("amplitude")
        let fallback = pow(10, -60.0 / 20)
        let expected = "expected a level such as \"-60dBFS\" or \"0.1%\", or a fraction of full scale in (0, 1]"
        switch config.values["amplitude"] {
        case nil:
            return fallback
        case .string(let text)?:
            let s = text.filter { !$0.isWhitespace }
            if s.lowercased().hasSuffix("dbfs") {
                guard let db = Double(s.dropLast(4)) else {
                    config.problem("amplitude", "\(expected), found \"\(text)\"")
                    return fallback
                }
                guard db <= 0 else {
                    config.problem("amplitude", "\(text) is above 0 dBFS (full scale); expected 0 dBFS or less, e.g. \"-60dBFS\"")
                    return fallback
                }
                return pow(10, db / 20)
            }
            if s.hasSuffix("%"), let p = Double(s.dropLast()) {
                guard p > 0, p <= 100 else {
                    config.problem("amplitude", "expected a percentage above 0% and at most 100% of full scale, found \"\(text)\"")
                    return fallback
                }
                return p / 100
            }
            config.problem("amplitude", "\(expected), found \"\(text)\"")
            return fallback
        case .float(let f)?:
            guard f > 0, f <= 1 else {
                config.problem("amplitude", "a fraction of full scale must be above 0 and at most 1, found \(f)")
                return fallback
            }
            return f
        case .integer(1)?:
            return 1
        case let other?:
            config.problem("amplitude", "\(expected), found \(other.typeName)")
            return fallback
        }
    }

    static func readPlay(_ config: ConfigReader, latency: Duration) -> PlayMode {
        let mode = config.choice("play", ["always", "periodic"], default: "always")
        guard mode == "periodic" else {
            for key in ["every", "for", "fade"] where config.values[key] != nil {
                config.declare(key)
                config.problem(key, "only applies to play = \"periodic\"")
            }
            return .always
        }
        let every = config.requirePositiveDuration("every")
        let length = config.requirePositiveDuration("for")
        let fade = config.duration("fade", default: min(.milliseconds(500), length / 4))
        if length >= every {
            config.problem("for", "must be shorter than every (\(every.vigilDescription)), found \(length.vigilDescription); use play = \"always\" to play without a pause")
        }
        if fade * 2 > length {
            config.problem("fade", "fade in plus fade out (2 × \(fade.vigilDescription)) must fit in for (\(length.vigilDescription))")
        }
        return .periodic(every: every, length: length, fade: fade)
    }
}

/// Everything a silent-audio instance was configured with.
public struct SilentAudioSettings: Sendable {
    /// libpulse server string; nil for libpulse's default.
    public var server: String?
    /// Sink name; nil for the server's default sink (`"@DEFAULT_SINK@"` in
    /// the config), followed when it changes.
    public var sink: String?
    public var signal: Signal
    public var play: PlayMode
    public var format: SampleFormat
    /// nil: the sink's own rate, so nothing is resampled.
    public var rate: Int?
    /// nil: the sink's own channel count.
    public var channels: Int?
    /// The stream's buffer (target length).
    public var latency: Duration
    /// Delays between reconnection attempts after a loss.
    public var reconnect: Backoff
    /// Close the stream (and release its lease) before each system sleep,
    /// under a logind delay lock, and open it again after resume.
    public var stopBeforeSleep = false
}

/// Why silent-audio could not play, in words for `LastError` and the log.
public enum SilentAudioError: Error, Sendable, CustomStringConvertible {
    case pulse(String)
    case noServer(server: String?, reason: String)
    case unknownSink(String, available: [String])
    case noDefaultSink
    case streamFailed(sink: String, reason: String)
    case connectionLost(String)
    case unsupported(String)

    public var description: String {
        switch self {
        case .pulse(let m): "libpulse: \(m)"
        case .noServer(let server, let reason):
            "no PulseAudio server at \(server ?? "the default address ($PULSE_SERVER, else $XDG_RUNTIME_DIR/pulse/native)"): \(reason)"
        case .unknownSink(let name, let available):
            "unknown sink \"\(name)\"; available sinks: \(available.isEmpty ? "none" : available.joined(separator: ", "))"
        case .noDefaultSink: "the server has no default sink (no output device); set `sink`"
        case .streamFailed(let sink, let reason): "cannot play on sink \"\(sink)\": \(reason)"
        case .connectionLost(let reason): "lost the connection to the server: \(reason)"
        case .unsupported(let m): m
        }
    }
}
