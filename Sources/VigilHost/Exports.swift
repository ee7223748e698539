// The host's users (vigild, the tests, the fuzzers, vigil-bench) see the
// shared pieces and the survival store (writer and reader) as part of the
// host's API, as they did before these moved into modules of their own that
// vigilctl links without the host.
@_exported import VigilCommon
@_exported import VigilSurvival
