// swift-tools-version: 6.0
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Vigil",
    products: [
        .executable(name: "vigild", targets: ["vigild"]),
        .executable(name: "vigilctl", targets: ["vigilctl"]),
        // Built-in strategies: one dynamic library per kind, named
        // libvigil-<kind>.so so the host finds a kind's plugin by file name
        // without loading anything else.
        .library(name: "vigil-periodic-wake", type: .dynamic, targets: ["PeriodicWake"]),
        .library(name: "vigil-background-task", type: .dynamic, targets: ["BackgroundTask"]),
        .library(name: "vigil-download-session", type: .dynamic, targets: ["DownloadSession"]),
        .library(name: "vigil-voip-socket", type: .dynamic, targets: ["VoipSocket"]),
        .library(name: "vigil-silent-audio", type: .dynamic, targets: ["SilentAudio"]),
        // The host's modules for the fuzzers (Fuzz/, a package of its own so a
        // plain build never builds them); not an API for anyone else.
        .library(name: "VigilHostModules", targets: ["VigilHost", "VigilDBus", "VigilSurvival"]),
        // What vigil-bench (Benchmarks/, a package of its own) needs besides
        // those: the test helpers (private buses, stand-ins, servers) and
        // voip-socket's C sockets and TLS for its bare reference loop. Not an
        // API for anyone else either.
        .library(name: "VigilBenchmarkModules", targets: ["VigilTestSupport", "VigilClient", "CVoipSocket", "CVoipTLS"]),
    ],
    dependencies: [
        .package(path: "Plugins/VigilKit"),
        // The SDK's test kit (a package of its own beside the SDK, on its
        // VigilKit product): the tests' clock, timer, runner and logs.
        .package(path: "Plugins/VigilKit/VigilKitTesting"),
        .package(url: "https://github.com/LebJe/TOMLKit", from: "0.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        // The Prometheus text exposition format (docs/metrics.md).
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        .target(name: "CTimer", path: "Sources/CTimer"),
        .target(name: "CVoipSocket", path: "Sources/CVoipSocket"),
        // netlink, eventfd, setns and the proc connector for `when` conditions.
        .target(name: "CConditions", path: "Sources/CConditions"),
        // OpenSSL (libssl-dev) for voip-socket's TLS and SIP digest.
        .target(name: "CVoipTLS", path: "Sources/CVoipTLS", linkerSettings: [.linkedLibrary("ssl"), .linkedLibrary("crypto")]),
        .systemLibrary(
            name: "CDBus",
            path: "Sources/CDBus",
            pkgConfig: "dbus-1",
            providers: [.apt(["libdbus-1-dev"])]
        ),
        .target(name: "CDBusShim", dependencies: ["CDBus"], path: "Sources/CDBusShim"),
        .target(
            name: "VigilDBus",
            // VigilAPI (in the VigilKit product) for ClientText, the one way an
            // error quotes a client's text, and the contract; VigilKit for Lock
            // and the host's event loop (EventLoop, CVigilLoop's timers).
            dependencies: ["CDBus", "CDBusShim", .product(name: "VigilKit", package: "VigilKit")],
            swiftSettings: strict
        ),
        // The typed client of the org.vigil.Vigil1 API (vigilctl, vigil-bench, tests).
        .target(name: "VigilClient", dependencies: ["VigilDBus"], swiftSettings: strict),
        // What vigild and vigilctl share without the host: default paths,
        // finding the bus, the version, terminal escaping, the display time
        // zone, the metrics address and its one-shot scrape.
        .target(
            name: "VigilCommon",
            dependencies: ["VigilDBus", .product(name: "VigilKit", package: "VigilKit")],
            swiftSettings: strict
        ),
        // The survival store on GRDB: its schema and migrations, the writer
        // (Store/) and the read-only reader (Report/: reports, picture,
        // costs, the bus's runs). The only module with SQL; vigild writes
        // through it, vigilctl reads through it without the host.
        .target(
            name: "VigilSurvival",
            dependencies: ["VigilCommon", "VigilDBus", .product(name: "VigilKit", package: "VigilKit"), .product(name: "GRDB", package: "GRDB.swift")],
            path: "Sources/Survival",
            swiftSettings: strict
        ),
        .target(
            name: "VigilHost",
            dependencies: [
                .product(name: "VigilKit", package: "VigilKit"),
                "CTimer",
                "CConditions",
                "VigilDBus",
                "VigilCommon",
                "VigilSurvival",
                .product(name: "TOMLKit", package: "TOMLKit"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                // ServiceLifecycle comes with VigilKit: it is linked into
                // libVigilKit.so (see Plugins/VigilKit/Package.swift).
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "vigild",
            dependencies: ["VigilHost", "VigilDBus", "CTimer", .product(name: "VigilKit", package: "VigilKit"), .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "vigilctl",
            // Not VigilHost: vigilctl links neither TOMLKit nor Prometheus.
            // check-config and metrics ask vigild (--check,
            // --print-metrics-settings); the store is read through
            // VigilSurvival (GRDB, read-only).
            dependencies: ["VigilClient", "VigilCommon", "VigilSurvival", .product(name: "ArgumentParser", package: "swift-argument-parser"), .product(name: "VigilKit", package: "VigilKit")],
            swiftSettings: strict
        ),
        .target(
            name: "BackgroundTask",
            dependencies: [.product(name: "VigilKit", package: "VigilKit")],
            path: "Plugins/BackgroundTask",
            swiftSettings: strict
        ),
        .target(
            name: "PeriodicWake",
            dependencies: [.product(name: "VigilKit", package: "VigilKit")],
            path: "Plugins/PeriodicWake",
            swiftSettings: strict
        ),
        // libcurl, for the download-session strategy (docs/download-session.md).
        .systemLibrary(
            name: "CCurl",
            path: "Sources/CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        .target(name: "CCurlShim", dependencies: ["CCurl"], path: "Sources/CCurlShim"),
        .target(
            name: "DownloadSession",
            dependencies: [.product(name: "VigilKit", package: "VigilKit"), "CCurl", "CCurlShim"],
            path: "Plugins/DownloadSession",
            swiftSettings: strict
        ),
        .target(
            name: "VoipSocket",
            dependencies: [.product(name: "VigilKit", package: "VigilKit"), "CVoipSocket", "CVoipTLS"],
            path: "Plugins/VoipSocket",
            swiftSettings: strict
        ),
        // libpulse, for silent-audio only: a host that never loads that
        // plugin never loads libpulse. Its headers are in /usr/include
        // and the module map links it, so no pkg-config: libpulse.pc's
        // only flag, -D_REENTRANT (a no-op with glibc), is one SwiftPM
        // refuses, with a warning in every build. Scripts/packages
        // installs libpulse-dev.
        .systemLibrary(
            name: "CPulse",
            path: "Sources/CPulse"
        ),
        .target(
            name: "SilentAudio",
            dependencies: [.product(name: "VigilKit", package: "VigilKit"), "CPulse"],
            path: "Plugins/SilentAudio",
            swiftSettings: strict
        ),
        // VIGIL_TEST_EXECUTOR=1 runs the test bundle on vigild's executor.
        .target(name: "CTestExecutor", dependencies: [.product(name: "VigilKit", package: "VigilKit")], path: "Tests/CTestExecutor"),
        // Shared test helpers (a private dbus-daemon), used by the test targets.
        .target(
            name: "VigilTestSupport",
            dependencies: ["VigilDBus", "CTestExecutor", .product(name: "VigilKitTesting", package: "VigilKitTesting")],
            path: "Tests/TestSupport",
            swiftSettings: strict
        ),
        .testTarget(
            name: "VigilHostTests",
            dependencies: ["VigilHost", "VigilSurvival", "VigilDBus", "VigilClient", "VigilTestSupport", "CTestExecutor", .product(name: "VigilKit", package: "VigilKit"), .product(name: "VigilKitTesting", package: "VigilKitTesting")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["VigilHost", "VigilDBus", "VigilClient", "VigilTestSupport", .product(name: "VigilKit", package: "VigilKit"), .product(name: "VigilKitTesting", package: "VigilKitTesting")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "DownloadSessionTests",
            dependencies: ["DownloadSession"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VigilDBusTests",
            dependencies: ["VigilDBus", "VigilTestSupport", .product(name: "VigilKit", package: "VigilKit"), .product(name: "VigilKitTesting", package: "VigilKitTesting")],
            swiftSettings: strict
        ),
    ],
    swiftLanguageModes: [.v6]
)
