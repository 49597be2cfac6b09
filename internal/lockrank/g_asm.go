//go:build invariants && (amd64 || arm64)

package lockrank

// getg is the address of the calling goroutine's g: unique among the
// goroutines alive, and not moved by the collector.
func getg() uintptr
