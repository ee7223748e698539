import Foundation
import Glibc
import Testing
import VigilTestSupport

/// vigild with a state_dir it cannot use: one line naming the path, the
/// cause and what to do (not NSCocoaErrorDomain codes or "disk I/O error").
extension EndToEnd {
    @Suite struct StateDirEndToEndTests {
        /// Runs vigild (directly, or after `shell` in a private mount
        /// namespace) and returns its status and stderr.
        static func start(_ config: String, shell: String? = nil, as uid: UInt32? = nil) throws -> CommandResult {
            var argv = [Build.vigild, "--config", config]
            if let uid {
                argv = ["/usr/bin/setpriv", "--reuid", "\(uid)", "--regid", "\(uid)", "--clear-groups"] + argv
            }
            if let shell {
                argv = ["/usr/bin/unshare", "-m", "/bin/sh", "-c", shell + " && exec \"$@\"", "vigil-test"] + argv
            }
            return try ProcessRunner.run(argv[0], Array(argv.dropFirst()))
        }

        @Test func eachStateDirProblemGetsOneLine() throws {
            let dir = try TempDir("vigil-statedir")
            chmod(dir.path, 0o755)
            func config(_ state: String) throws -> String {
                try dir.write("vigil.toml", hostConfig(stateDir: state, extra: "bus = \"unix:path=/nonexistent/bus\""))
            }

            let file = try dir.write("a-file", "not a directory\n")
            let notADirectory = try Self.start(try config(file))
            #expect(notADirectory.status == 1)
            #expect(notADirectory.stderr.contains("state_dir \(file): is not a directory (it is a regular file); move it away or set another state_dir in [host]"), "\(notADirectory.stderr)")

            let readOnly = dir.file("ro")
            mkdir(readOnly, 0o755)
            let ro = try Self.start(try config(readOnly), shell: "mount -t tmpfs -o ro,size=1m vigil-ro \(readOnly)")
            #expect(ro.status == 1)
            #expect(ro.stderr.contains("state_dir \(readOnly): it is on a read-only filesystem; make it writable"), "\(ro.stderr)")

            let full = dir.file("full")
            mkdir(full, 0o755)
            let fullRun = try Self.start(try config(full), shell: "mount -t tmpfs -o size=64k vigil-full \(full) && (cat /dev/zero > \(full)/fill 2>/dev/null; true)")
            #expect(fullRun.status == 1)
            #expect(fullRun.stderr.contains("state_dir \(full): its filesystem is full (no free space); free some space there"), "\(fullRun.stderr)")

            let missingParent = file + "/state"
            let cannotCreate = try Self.start(try config(missingParent))
            #expect(cannotCreate.status == 1)
            #expect(cannotCreate.stderr.contains("state_dir \(missingParent): cannot create it: \(file) is not a directory"), "\(cannotCreate.stderr)")

            let rootOwned = dir.file("root-owned")
            mkdir(rootOwned, 0o755)
            let notOurs = try Self.start(try config(rootOwned), as: 65534)
            #expect(notOurs.status == 1)
            #expect(notOurs.stderr.contains("state_dir \(rootOwned): belongs to uid 0, not to this user (uid 65534)"), "\(notOurs.stderr)")

            for result in [notADirectory, ro, fullRun, cannotCreate, notOurs] {
                #expect(!result.stderr.contains("NSCocoaErrorDomain") && !result.stderr.contains("disk I/O error"), "\(result.stderr)")
            }
        }
    }
}
