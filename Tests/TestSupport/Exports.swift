// The SDK's test kit (manual clock, clock-driven wake timer, process
// runner, waitable log), for every test target that uses this support.
@_exported import VigilKitTesting
