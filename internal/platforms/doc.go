// Package platforms holds no code: its test checks that the whole module
// builds and vets on platforms other than the one the tests run on.
// Memory system calls live in _linux.go files of driver/host and ipc;
// elsewhere a small _other.go stub answers driver.ErrUnsupported, so a
// program importing the library still compiles on macOS or Windows.
// By default it builds for darwin/arm64 and windows/amd64, which between
// them compile every file; VMARENA_ALL_PLATFORMS=1 adds darwin/amd64 and
// freebsd/amd64.
package platforms
