#if canImport(Glibc)
import Glibc
#endif

/// Sample encodings the stream can use, as PulseAudio names them.
public enum SampleFormat: String, CaseIterable, Sendable {
    case s16le
    case s32le
    case float32le

    public var bytesPerSample: Int {
        switch self {
        case .s16le: 2
        case .s32le, .float32le: 4
        }
    }
}

/// The colour of a noise signal: how its power falls with frequency.
public enum NoiseColor: String, CaseIterable, Sendable {
    /// Flat spectrum.
    case white
    /// -3 dB per octave.
    case pink
    /// -6 dB per octave (integrated white noise).
    case brown
}

/// What the stream plays.
public enum Signal: Sendable, Hashable, CustomStringConvertible {
    /// Digital silence.
    case zero
    /// The smallest non-zero sample, alternating sign every frame
    /// (SoundKeeper's default): inaudible, but not "digital zero".
    case fluctuate
    /// A sine of `frequency` Hz with a peak of `amplitude` (1 = full scale).
    case sine(frequency: Double, amplitude: Double)
    /// Noise whose peaks stay within `amplitude` (1 = full scale).
    case noise(NoiseColor, amplitude: Double)

    public var description: String {
        switch self {
        case .zero: "zero"
        case .fluctuate: "fluctuate"
        case .sine(let f, let a): "sine \(Self.hertz(f)) Hz at \(Self.dBFS(a)) dBFS"
        case .noise(let c, let a): "\(c.rawValue) noise at \(Self.dBFS(a)) dBFS"
        }
    }

    static func dBFS(_ amplitude: Double) -> String {
        // One decimal, without a trailing ".0": "-60", "-46.5", "0".
        let tenths = (20 * log10(amplitude) * 10).rounded()
        if tenths == 0 { return "0" }
        return tenths.truncatingRemainder(dividingBy: 10) == 0 ? String(Int(tenths / 10)) : String(tenths / 10)
    }

    static func hertz(_ f: Double) -> String {
        f == f.rounded() ? String(Int64(f)) : String(f)
    }
}

/// A periodic burst: `frames` of signal, faded in and out over `fadeFrames`,
/// then zeros until the next ``SignalRenderer/restartBurst()``.
public struct BurstEnvelope: Sendable, Hashable {
    public var frames: Int
    public var fadeFrames: Int
}

/// Produces interleaved samples for a ``Signal``.
///
/// Runs in libpulse's write callback, so the common case is a `memcpy` from a
/// precomputed cycle: silence, the ±1 LSB pattern and a sine of a whole number
/// of hertz repeat exactly. Only noise, fractional frequencies and fades are
/// computed sample by sample.
public struct SignalRenderer: Sendable {
    public let signal: Signal
    public let format: SampleFormat
    public let channels: Int
    public let rate: Int
    public let envelope: BurstEnvelope?

    public var bytesPerFrame: Int { format.bytesPerSample * channels }

    /// Encoded interleaved frames that repeat exactly, when the signal does.
    private let cycle: [UInt8]
    private var cycleOffset = 0
    /// One mono period as full-scale values, for the sample-by-sample path.
    private let monoCycle: [Float]
    private var monoIndex = 0
    /// Phase (in cycles) of a sine whose period is not a whole number of frames.
    private var phase: Double = 0
    private var frameInBurst = 0

    public init(signal: Signal, format: SampleFormat, channels: Int, rate: Int, envelope: BurstEnvelope? = nil) {
        self.signal = signal
        self.format = format
        self.channels = max(1, channels)
        self.rate = max(1, rate)
        self.envelope = envelope
        var noiseState = NoiseState()
        let rate = self.rate
        let mono: [Float]? = if case .noise(let color, let amplitude) = signal {
            // Noise is generated once and looped: computing it per sample
            // would cost more CPU than the whole stream otherwise does.
            Self.noiseLoop(color, amplitude: amplitude, frames: rate * Self.noiseLoopSeconds, &noiseState)
        } else {
            Self.periodFrames(signal, rate: rate).map { period in
                (0..<period).map { Self.periodicValue(signal, frame: $0, rate: rate, format: format) }
            }
        }
        if let mono {
            let period = mono.count
            monoCycle = mono
            // Repeat short periods so that one memcpy covers many frames.
            let repeats = max(1, (4096 + period - 1) / period)
            let channelCount = self.channels
            var bytes = [UInt8](repeating: 0, count: period * repeats * format.bytesPerSample * channelCount)
            bytes.withUnsafeMutableBytes { raw in
                var offset = 0
                for _ in 0..<repeats {
                    for v in mono {
                        for _ in 0..<channelCount {
                            Self.encode(v, format, signal == .fluctuate, into: raw.baseAddress! + offset) // proven: non-empty buffer
                            offset += format.bytesPerSample
                        }
                    }
                }
            }
            cycle = bytes
        } else {
            monoCycle = []
            cycle = []
        }
    }

    /// Starts the next burst from its fade-in.
    public mutating func restartBurst() { frameInBurst = 0 }

    /// Fills `frames` whole frames at `buffer`.
    public mutating func render(into buffer: UnsafeMutableRawPointer, frames: Int) {
        guard frames > 0 else { return }
        let byteCount = frames * bytesPerFrame
        if signal == .zero {
            memset(buffer, 0, byteCount)
            return
        }
        if let envelope {
            renderBurst(into: buffer, frames: frames, envelope)
        } else if !cycle.isEmpty {
            copyCycle(into: buffer, byteCount: byteCount)
        } else {
            renderComputed(into: buffer, frames: frames, gain: { _ in 1 })
        }
    }

    private mutating func copyCycle(into buffer: UnsafeMutableRawPointer, byteCount: Int) {
        var written = 0
        cycle.withUnsafeBytes { src in
            while written < byteCount {
                let n = min(byteCount - written, src.count - cycleOffset)
                memcpy(buffer + written, src.baseAddress! + cycleOffset, n) // proven: cycle is non-empty here
                written += n
                cycleOffset = (cycleOffset + n) % src.count
            }
        }
    }

    private mutating func renderBurst(into buffer: UnsafeMutableRawPointer, frames: Int, _ envelope: BurstEnvelope) {
        // Frames of this call that are still inside the burst; the rest is silence.
        let inBurst = max(0, min(frames, envelope.frames - frameInBurst))
        if inBurst > 0 {
            let start = frameInBurst
            let fade = envelope.fadeFrames
            let total = envelope.frames
            let fadesApply = fade > 0 && signal != .fluctuate
            if !fadesApply && !cycle.isEmpty {
                copyCycle(into: buffer, byteCount: inBurst * bytesPerFrame)
            } else {
                renderComputed(into: buffer, frames: inBurst) { i in
                    guard fadesApply else { return 1 }
                    let f = start + i
                    let fromEnd = total - f
                    if f < fade { return Float(f) / Float(fade) }
                    if fromEnd < fade { return Float(fromEnd) / Float(fade) }
                    return 1
                }
            }
        }
        if inBurst < frames {
            memset(buffer + inBurst * bytesPerFrame, 0, (frames - inBurst) * bytesPerFrame)
        }
        frameInBurst += frames
    }

    private mutating func renderComputed(into buffer: UnsafeMutableRawPointer, frames: Int, gain: (Int) -> Float) {
        let isFluctuate = signal == .fluctuate
        var out = buffer
        for i in 0..<frames {
            let v = nextValue() * gain(i)
            for _ in 0..<channels {
                Self.encode(v, format, isFluctuate, into: out)
                out += format.bytesPerSample
            }
        }
    }

    /// The next mono value, full scale = 1.
    private mutating func nextValue() -> Float {
        if !monoCycle.isEmpty {
            let v = monoCycle[monoIndex]
            monoIndex = (monoIndex + 1) % monoCycle.count
            return v
        }
        switch signal {
        case .zero, .fluctuate:
            return 0
        case .sine(let frequency, let amplitude):
            let v = Float(amplitude * sin(2 * Double.pi * phase))
            phase += frequency / Double(rate)
            if phase >= 1 { phase -= 1 }
            return v
        case .noise:
            return 0 // looped from monoCycle
        }
    }

    /// Length of the noise loop. Long enough that no pattern is heard in
    /// noise at an inaudible level.
    static let noiseLoopSeconds = 4

    /// `frames` of noise whose end flows into its start: the first tenth
    /// is cross-faded from what the generator played right after the last
    /// frame, so the loop point has no step.
    static func noiseLoop(_ color: NoiseColor, amplitude: Double, frames: Int, _ state: inout NoiseState) -> [Float] {
        let fade = max(1, frames / 10)
        var x = (0..<(frames + fade)).map { _ in Float(amplitude) * state.next(color) }
        // Blend the head into the tail's continuation: out[i] for the first
        // `fade` frames moves from x[frames + i] (which follows x[frames - 1])
        // to x[i].
        for i in 0..<fade {
            let w = Float(i) / Float(fade)
            x[i] = x[i] * w + x[frames + i] * (1 - w)
        }
        return Array(x.prefix(frames))
    }

    /// The period in frames of a signal that repeats exactly, or nil.
    static func periodFrames(_ signal: Signal, rate: Int) -> Int? {
        switch signal {
        case .zero: return 1
        case .fluctuate: return 2
        case .sine(let f, _):
            guard f == f.rounded(), f > 0 else { return nil }
            // A whole number of hertz repeats after rate / gcd(rate, f) frames.
            let period = rate / gcd(rate, Int(f))
            return period <= rate ? period : nil
        case .noise: return nil
        }
    }

    private static func periodicValue(_ signal: Signal, frame: Int, rate: Int, format: SampleFormat) -> Float {
        switch signal {
        case .zero, .noise: return 0
        case .fluctuate: return frame % 2 == 0 ? 1 : -1
        case .sine(let f, let a): return Float(a * sin(2 * Double.pi * f * Double(frame) / Double(rate)))
        }
    }

    private static func gcd(_ a: Int, _ b: Int) -> Int {
        var (a, b) = (a, b)
        while b != 0 { (a, b) = (b, a % b) }
        return a
    }

    /// Writes one sample. For `fluctuate`, `v` is ±1 and means one least
    /// significant bit of the format (1/32768 for float, the 16-bit LSB, so
    /// that it survives a conversion to 16 bits).
    @inline(__always)
    static func encode(_ v: Float, _ format: SampleFormat, _ lsbUnits: Bool, into out: UnsafeMutableRawPointer) {
        switch format {
        case .s16le:
            let s: Int16 = lsbUnits ? Int16(v) : Int16(clamping: Int32((v * 32767).rounded()))
            out.storeBytes(of: s.littleEndian, as: Int16.self)
        case .s32le:
            let s: Int32 = lsbUnits ? Int32(v) : Int32(clamping: Int64((Double(v) * 2_147_483_647).rounded()))
            out.storeBytes(of: s.littleEndian, as: Int32.self)
        case .float32le:
            let f: Float = lsbUnits ? v / 32768 : v
            out.storeBytes(of: f.bitPattern.littleEndian, as: UInt32.self)
        }
    }
}

/// Noise generators: xorshift64* for white noise, Paul Kellet's economy
/// filter for pink, a leaky integrator for brown. Each stays within ±1.
struct NoiseState: Sendable {
    private var seed: UInt64 = 0x9E37_79B9_7F4A_7C15
    private var b0: Float = 0, b1: Float = 0, b2: Float = 0
    private var brown: Float = 0

    /// Uniform in [-1, 1).
    mutating func white() -> Float {
        seed ^= seed >> 12
        seed ^= seed << 25
        seed ^= seed >> 27
        let bits = (seed &* 0x2545_F491_4F6C_DD1D) >> 40
        return Float(bits) / Float(1 << 23) - 1
    }

    mutating func next(_ color: NoiseColor) -> Float {
        let w = white()
        switch color {
        case .white:
            return w
        case .pink:
            b0 = 0.99765 * b0 + w * 0.0990460
            b1 = 0.96300 * b1 + w * 0.2965164
            b2 = 0.57000 * b2 + w * 1.0526913
            // The filter's peak gain is about 3.5; scale back to ±1.
            return max(-1, min(1, (b0 + b1 + b2 + w * 0.1848) / 3.5))
        case .brown:
            brown = (brown + 0.02 * w) / 1.02
            return max(-1, min(1, brown * 3.5))
        }
    }
}
