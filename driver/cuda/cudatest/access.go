package cudatest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// Access is what the emulated GPU itself lets CUDA device dev (an
// ordinal; driver device i is ordinal i unless cuda.Options.Devices says
// otherwise) do at the mapped address addr: the stand-in's own books
// (Lib.Access), under the driver and its record. A test uses it to prove
// that a call that failed left the access the hardware holds as the
// record says: Driver.Access answers from the record, and every copy the
// driver makes is checked against the record before CUDA sees it, so
// neither would show access that CUDA grants and the record does not. It
// fails t where CUDA maps nothing at addr.
func Access(t testing.TB, lib *Lib, addr driver.Addr, dev int) driver.Access {
	t.Helper()
	a := lib.Access(uint64(addr), dev)
	require.GreaterOrEqual(t, a, 0, "CUDA maps nothing at %#x, or has no device %d", uint64(addr), dev)
	return driver.Access(a)
}
