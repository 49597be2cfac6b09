package sim

// TearDown closes d whatever is mapped, for the conformance suite's
// subtests, which may end with memory mapped (Close refuses then).
var TearDown = (*Driver).tearDown

// Closing reports whether Close has begun closing d's streams.
func Closing(d *Driver) bool { return d.engine.Closed() }
