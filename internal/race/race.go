// Package race says whether the race detector is on, so that tests whose
// work runs on one goroutine — long deterministic replays — can skip
// runs where the detector multiplies their time and can find nothing.
package race
