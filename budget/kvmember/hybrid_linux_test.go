//go:build linux

package kvmember

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
	"github.com/vmarena/vmarena/kvcache"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// newHybrid makes a hybrid cache of a full-attention group, a window
// group of 16 tokens and a recurrent group on a sim driver of capacity
// bytes: 8 KiB a token in each attention group (8 tokens a 64 KiB page).
func newHybrid(t testing.TB, capacity uint64) (*sim.Driver, *physical.Memory, *kvcache.Hybrid) {
	t.Helper()
	drv, err := sim.New(sim.Options{Devices: 1, Capacity: capacity, Granularity: page})
	require.NoError(t, err)
	mem := physical.New(drv)
	h, err := kvcache.NewHybrid(vaspace.New(drv), mem, kvcache.HybridConfig{Groups: []kvcache.Group{
		{Kind: kvcache.FullAttention, Layers: 2, KVHeads: 8, HeadDim: 128},
		{Kind: kvcache.SlidingWindow, Layers: 2, KVHeads: 8, HeadDim: 128, Window: 16},
		{Kind: kvcache.Recurrent, Layers: 1, StateBytes: 16 << 10},
	}, DType: tensor.Float16, BlockTokens: 8, MaxContext: 64, MaxSeqs: 8, PageSize: page,
		MapAhead: -1}) // the figures exact: no goroutine commits between the calls
	require.NoError(t, err)
	return drv, mem, h
}

// admitHybrid admits prompt through k, appends and marks it written.
func admitHybrid(k *Member, prompt []int, more int) (*kvcache.HybridSeq, error) {
	q, err := k.AdmitHybrid(prompt, more)
	if err != nil {
		return nil, err
	}
	if _, err := q.Append(prompt[q.Len():]); err != nil {
		return nil, errors.CombineErrors(err, q.Free())
	}
	return q, errors.CombineErrors(q.MarkWritten(q.Len()), nil)
}

// TestHybridMember: a hybrid cache is a member as a Cache is. It grows
// to admit (AdmitHybrid), and when a Cache's member asks for memory it
// gives back its cached units, checkpoints and idle pages
// (kvcache.Hybrid.GiveBack) and never a running sequence's: the one still
// running keeps its tokens, nothing is preempted, its budget stays its
// hold and its committed memory (the driver's count) within it; its next
// admission asks the Cache's member back for what it holds idle. Admit
// and AdmitHybrid refuse the other kind's member; JoinHybrid refuses a
// nil cache.
func TestHybridMember(t *testing.T) {
	b := openBook(t, 48*page)
	defer b.Close()
	drv, mem, h := newHybrid(t, 48*page)
	hk, err := JoinHybrid(b, "hybrid", 2*page, 48*page, h)
	require.NoError(t, err)
	require.Same(t, h, hk.Hybrid())
	require.Nil(t, hk.Cache())
	c := newCache(t, 48*page, 8)
	c.k, err = Join(b, "cache", 2*page, 48*page, c.c)
	require.NoError(t, err)

	next := 0
	run, err := admitHybrid(hk, tokens(&next, 40), 0)
	require.NoError(t, err)
	var done []*kvcache.HybridSeq
	for range 3 {
		q, err := admitHybrid(hk, tokens(&next, 40), 0)
		require.NoError(t, err)
		done = append(done, q)
	}
	for _, q := range done {
		require.NoError(t, q.Free())
	}
	require.NoError(t, hk.Sync())
	grown := hk.Stats()
	require.Greater(t, grown.Hold, uint64(2*page), "it grew to admit")
	spare := h.Spare()
	require.Positive(t, spare, "the freed sequences' units are cached, their pages idle")

	// The cache member takes all the book has and what the hybrid spares.
	in, err := b.Members()
	require.NoError(t, err)
	var held uint64
	for _, m := range in {
		held += m.Committed
	}
	ask := 48*page - held + spare
	require.NoError(t, c.k.Grow(ask))
	st := hk.Stats()
	require.Equal(t, 1, st.Asked)
	require.Equal(t, spare, st.GivenBack, "all it could spare")
	require.Equal(t, grown.Hold-spare, st.Hold)
	require.Equal(t, st.Hold, st.Budget)
	require.Equal(t, 40, run.Len(), "the running sequence keeps its tokens")
	hs := h.Stats()
	require.Zero(t, hs.Preemptions)
	require.Equal(t, 1, hs.Running)
	u, err := mem.Usage(0)
	require.NoError(t, err)
	require.LessOrEqual(t, u.Used, st.Hold, "the driver's count within the hold")
	require.NoError(t, hk.Check())
	require.NoError(t, c.k.Check())

	// The other way: the cache member holds what it grew by, idle; the
	// hybrid's next admission asks it back.
	require.NoError(t, c.k.Sync())
	q, err := admitHybrid(hk, tokens(&next, 40), 0)
	require.NoError(t, err)
	cs := c.k.Stats()
	require.Equal(t, 1, cs.Asked)
	require.Positive(t, cs.GivenBack)
	require.NoError(t, q.Free())
	require.NoError(t, hk.Check())
	require.NoError(t, c.k.Check())

	_, err = hk.Admit([]int{1}, 0, 0)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	_, err = c.k.AdmitHybrid([]int{1}, 0)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)
	_, err = JoinHybrid(b, "nil", 0, page, nil)
	require.True(t, errors.Is(err, driver.ErrInvalid), "%v", err)

	require.NoError(t, run.Free())
	require.True(t, errors.Is(hk.Close(), driver.ErrBusy), "the hybrid cache is open")
	require.NoError(t, h.Close())
	require.NoError(t, hk.Close())
	require.NoError(t, drv.Close())
	c.close(t)
}
