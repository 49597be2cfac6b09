package sleep

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/tensor"
)

// TestWakeFaults: a wake the driver refuses part-way — the n-th chunk
// create (out of memory), map, access grant or restoring write, for
// every n the wake makes — leaves the tag asleep with its backup whole
// and nothing of the device held; the next wake, unrefused, restores
// every byte. The first, a middle and the last call are refused: the
// rollback from the first step, an inner one and the final one.
func TestWakeFaults(t *testing.T) {
	for _, mode := range []Mode{Host, File} {
		for _, op := range []string{"create", "map", "access", "write"} {
			// Count the calls of op one wake makes.
			f := newFaulty(t, testCap)
			m := newManager(t, f)
			fillModel(t, f, m)
			require.NoError(t, m.Sleep(mode))
			f.arm("", 0)
			require.NoError(t, m.Wake())
			n := f.count(op)
			require.NotZero(t, n, "a wake makes %s calls", op)
			closeAll(t, m)
			for _, at := range points(n) {
				t.Run(fmt.Sprintf("%s/%s#%d", mode, op, at), func(t *testing.T) {
					f := newFaulty(t, testCap)
					m := newManager(t, f)
					want := fillModel(t, f, m)
					require.NoError(t, m.Sleep(mode))
					before := stats(t, m, "w")
					f.arm(op, at)
					err := m.Wake()
					require.True(t, errors.Is(err, errInjected), "%v", err)
					require.Equal(t, before, stats(t, m, "w"), "the tag sleeps on, unchanged")
					require.Zero(t, f.Used(0), "nothing of the device is held")
					require.NoError(t, m.Check())
					f.arm("", 0)
					require.NoError(t, m.Wake())
					requireContents(t, f, want)
					closeAll(t, m)
					require.Zero(t, f.doubles)
					require.Empty(t, f.live)
				})
			}
		}
	}
}

// TestSleepFaults: a sleep whose unmap the driver refuses leaves the tag
// awake with its bytes in place and no backup held. The tensors over its
// allocations were revoked before the sleep began its work, and stay
// closed; new ones hold the bytes.
func TestSleepFaults(t *testing.T) {
	for at := 1; at <= 3; at++ {
		f := newFaulty(t, testCap)
		m := newManager(t, f)
		want := fillModel(t, f, m)
		used := f.Used(0)
		var old []*tensor.Tensor
		for p := range want {
			old = append(old, mustTensor(t, m, p))
		}
		f.arm("unmap", at)
		err := m.Sleep(Host)
		require.True(t, errors.Is(err, errInjected), "%v", err)
		s := stats(t, m, "w")
		require.False(t, s.Asleep)
		require.Zero(t, s.BackupBytes)
		require.LessOrEqual(t, f.Used(0), used)
		require.NoError(t, m.Check())
		requireContents(t, f, want)
		for _, tt := range old {
			require.True(t, tt.Released())
		}
		for p, b := range want {
			require.Equal(t, b, tensorBytes(t, mustTensor(t, m, p)))
		}
		f.arm("", 0)
		closeAll(t, m)
		require.Zero(t, f.doubles)
	}
}

// points are the calls to refuse of n: the first, a middle one, the last.
func points(n int) []int {
	switch {
	case n <= 1:
		return []int{1}
	case n == 2:
		return []int{1, 2}
	}
	return []int{1, (n + 1) / 2, n}
}
