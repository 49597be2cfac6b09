package sim

// TearDown closes d whatever is mapped, for the conformance suite's
// subtests, which may end with memory mapped (Close refuses then).
var TearDown = (*Driver).tearDown
