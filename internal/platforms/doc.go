// Package platforms holds no code: its test checks that the whole module
// builds and vets on platforms other than the one the tests run on.
// Memory system calls live in _linux.go files of driver/host and ipc;
// elsewhere a small _other.go stub answers driver.ErrUnsupported, so a
// program importing the library still compiles on macOS or Windows.
// By default it vets the whole module for windows/amd64 (every !linux
// and !unix file) and, for darwin/arm64, the packages whose files there
// differ from Windows' (those with unix files, which must then be Linux's
// files, so their importers see Linux's API): between them every file
// compiles. VMARENA_ALL_PLATFORMS=1 vets darwin/arm64 whole and adds
// darwin/amd64 and freebsd/amd64. The targets run side by side, their
// packages compiled without optimization (vet needs only their types).
// It skips under the race detector (scripts/test runs it without).
package platforms
