package procmaps

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParse: any line is an entry whose Perms has its four letters (what
// Readable, Writable and Shared index) or an error; never a panic.
func FuzzParse(f *testing.F) {
	f.Add("7f1c2a000000-7f1c2a021000 rw-p 00000000 00:00 0 ")
	f.Add("55d4c6a00000-55d4c6a2c000 r--p 00000000 fd:01 1234567                    /usr/bin/a b")
	f.Add("7ffd-7ffe rw-s 0 00:05 9 /memfd:vmarena (deleted)")
	f.Add("x-y rwxp 0 0 0")
	f.Fuzz(func(t *testing.T, line string) {
		e, err := parse(line)
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "procmaps: "), "%v", err)
			return
		}
		require.Len(t, e.Perms, 4)
		_, _, _ = e.Readable(), e.Writable(), e.Shared()
	})
}
