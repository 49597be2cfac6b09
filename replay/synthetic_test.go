package replay

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/units"
)

// TestRandomLifetimesDeterministic: a seed gives the same events every
// time, another seed others; Synthetic is the workload with its defaults
// but the number of events.
func TestRandomLifetimesDeterministic(t *testing.T) {
	a, err := Synthetic("random-lifetimes", 7, 20_000)
	require.NoError(t, err)
	b, err := RandomLifetimes{Seed: 7, Events: 20_000}.Generate()
	require.NoError(t, err)
	require.Equal(t, a, b)
	again, err := Synthetic("random-lifetimes", 7, 20_000)
	require.NoError(t, err)
	require.Equal(t, a, again)
	other, err := Synthetic("random-lifetimes", 8, 20_000)
	require.NoError(t, err)
	require.NotEqual(t, a[:100], other[:100])
	require.Len(t, a, 20_000)
}

// TestRandomLifetimesShape: the default workload's sizes are log-uniform
// from 512 B to 4 GiB, it keeps about 56 GiB live (within a largest
// allocation of it once there) and never more than 80 GiB, every free
// frees a live allocation of the same size and address, and the summary
// reads it as a whole trace with no segment events.
func TestRandomLifetimesShape(t *testing.T) {
	const GiB = units.GiB
	events, err := Synthetic("random-lifetimes", 1, 0)
	require.NoError(t, err)
	require.Len(t, events, 100_000)

	live := map[int64]Event{}
	var bytes, peak uint64
	reached := false
	var belowMean, allocs int
	var mean float64
	var sampled int
	addrs := map[uint64]bool{}
	for i, ev := range events { // plain checks: require costs seconds over 100,000 events
		if ev.Seq != uint64(i) || ev.Line != i+2 || ev.Device != 0 || !ev.HasAddr || ev.Size < 512 || ev.Size > 4*GiB {
			t.Fatalf("event %d: %+v", i, ev)
		}
		switch ev.Op {
		case OpAlloc:
			if _, ok := live[ev.AllocID]; ok || addrs[ev.Addr] {
				t.Fatalf("event %d allocates a live id or reuses an address: %+v", i, ev)
			}
			addrs[ev.Addr] = true
			if ev.Size < 1536*units.KiB { // √(512 B × 4 GiB) = 1.5 MiB: the middle of the logarithms
				belowMean++
			}
			allocs++
			live[ev.AllocID] = ev
			bytes += ev.Size
		case OpFreeCompleted:
			a, ok := live[ev.AllocID]
			if !ok || a.Size != ev.Size || a.Addr != ev.Addr {
				t.Fatalf("event %d frees no live allocation of its size and address: %+v", i, ev)
			}
			delete(live, ev.AllocID)
			bytes -= ev.Size
		default:
			t.Fatalf("event %d: op %s", i, ev.Op)
		}
		peak = max(peak, bytes)
		if bytes > 80*GiB {
			t.Fatalf("event %d: %d bytes live, over 80 GiB", i, bytes)
		}
		if bytes >= 56*GiB {
			reached = true
		}
		if reached {
			if bytes <= 52*GiB || bytes >= 60*GiB {
				t.Fatalf("event %d: %s live, not within 4 GiB of 56 GiB", i, units.Bytes(bytes))
			}
			mean += float64(bytes)
			sampled++
		}
	}
	require.True(t, reached)
	require.InDelta(t, 56, mean/float64(sampled)/float64(GiB), 2, "about 56 GiB live")
	require.InDelta(t, 0.5, float64(belowMean)/float64(allocs), 0.02, "log-uniform: half the sizes below the geometric middle")
	require.InDelta(t, 50_000, allocs, 1000, "about as many allocs as frees")
	require.Greater(t, len(live), 100, "the live set is many allocations, long-lived ones among them")

	sums := Summarize(events)
	require.Len(t, sums, 1)
	s := sums[0]
	require.Equal(t, peak, s.PeakAllocated)
	require.False(t, s.MidRun())
	require.Zero(t, s.MismatchedFrees)
	require.Zero(t, s.UnmatchedFrees)
	require.Zero(t, s.SegmentEvents)
}

// TestRandomLifetimesOptions: each option shapes the workload, and the
// limit holds however tight.
func TestRandomLifetimesOptions(t *testing.T) {
	const MiB = units.MiB
	w := RandomLifetimes{Seed: 3, Events: 5000, MinSize: 4096, MaxSize: 8 * MiB, Live: 60 * MiB, Limit: 64 * MiB}
	events, err := w.Generate()
	require.NoError(t, err)
	require.Len(t, events, 5000)
	var bytes uint64
	for _, ev := range events {
		require.GreaterOrEqual(t, ev.Size, uint64(4096))
		require.LessOrEqual(t, ev.Size, 8*MiB)
		if ev.Op == OpAlloc {
			bytes += ev.Size
		} else {
			bytes -= ev.Size
		}
		require.LessOrEqual(t, bytes, 64*MiB)
	}
	// One size, one event.
	events, err = RandomLifetimes{Events: 1, MinSize: 4096, MaxSize: 4096}.Generate()
	require.NoError(t, err)
	require.Equal(t, []Event{{Line: 2, Op: OpAlloc, Size: 4096, HasAddr: true}}, events)
	// Live at the limit: frees make room.
	events, err = RandomLifetimes{Events: 3000, MaxSize: 8 * MiB, Live: 16 * MiB, Limit: 16 * MiB}.Generate()
	require.NoError(t, err)
	require.Len(t, events, 3000)
	res, err := Replay(events, Options{Capacity: 32 * MiB, CheckEvery: 100, Verify: true, Drain: true})
	require.NoError(t, err)
	checkReplayed(t, res.Devices[0])
}

// TestRandomLifetimesBadOptions: options no workload can be made with
// are ErrInvalid, saying what is wrong; an unknown workload names the
// known ones.
func TestRandomLifetimesBadOptions(t *testing.T) {
	for _, c := range []struct {
		w    RandomLifetimes
		says string
	}{
		{RandomLifetimes{Events: -1}, "-1 events: want 1 to 16777216 (0 for the default 100000)"},
		{RandomLifetimes{Events: MaxSyntheticEvents + 1}, "16777217 events: want 1 to 16777216"},
		{RandomLifetimes{Events: math.MaxInt}, "9223372036854775807 events: want 1 to"},
		{RandomLifetimes{MinSize: 8 * units.GiB}, "sizes from 8 GiB to 4 GiB: the least is above the most"},
		{RandomLifetimes{MinSize: 2048, MaxSize: 1024}, "sizes from 2 KiB to 1 KiB"},
		{RandomLifetimes{Limit: 2 * units.GiB}, "limit 2 GiB is below the largest size 4 GiB"},
		{RandomLifetimes{MaxSize: units.GiB, Limit: 2 * units.GiB}, "limit 2 GiB is below the live bytes 56 GiB to keep"},
		{RandomLifetimes{Live: 100 * units.GiB}, "limit 80 GiB is below the live bytes 100 GiB"},
	} {
		err := c.w.Check()
		require.True(t, errors.Is(err, driver.ErrInvalid), "%+v: %v", c.w, err)
		require.ErrorContains(t, err, "replay: random-lifetimes: "+c.says)
		events, err := c.w.Generate()
		require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
		require.Nil(t, events)
	}
	require.NoError(t, RandomLifetimes{}.Check(), "the defaults")

	_, err := Synthetic("random", 1, 0)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.ErrorContains(t, err, `unknown synthetic workload "random", want random-lifetimes`)
	_, err = Synthetic("", 1, 0)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.True(t, strings.Contains(strings.Join(Workloads, ","), "random-lifetimes"))
	_, err = Synthetic("random-lifetimes", 1, -5)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	require.ErrorContains(t, err, "-5 events")
	events, err := Synthetic("random-lifetimes", 1, 10)
	require.NoError(t, err)
	require.Len(t, events, 10)
}
