//go:build race

package transformer

// raceEnabled: the race detector is on. This package runs on the caller's
// goroutine alone, so the detector has nothing to find in it and only
// multiplies the time of the long sequences, which then run shorter.
const raceEnabled = true
