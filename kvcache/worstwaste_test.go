package kvcache

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLeastMulMod: leastMulMod and firstMulIn against a walk over every
// n, on random moduli up to 3,000, and on 64-bit moduli where the answer
// is known.
func TestLeastMulMod(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		m := uint64(2 + r.IntN(3000))
		a := uint64(1 + r.IntN(int(m)-1))
		lo := uint64(r.IntN(int(m)))
		hi := lo + uint64(r.IntN(int(m-lo)))
		wn, wok := uint64(0), false
		for n := range m {
			if v := a * n % m; v >= lo && v <= hi {
				wn, wok = n, true
				break
			}
		}
		gn, gok := firstMulIn(a, m, lo, hi)
		require.Equal(t, wok, gok, "firstMulIn(%d, %d, %d, %d)", a, m, lo, hi)
		require.Equal(t, wn, gn, "firstMulIn(%d, %d, %d, %d)", a, m, lo, hi)
		if gcd(a, m) != 1 {
			continue
		}
		most := uint64(1 + r.IntN(int(m)-1))
		want := m
		for n := uint64(1); n <= most; n++ {
			want = min(want, a*n%m)
		}
		require.Equal(t, want, leastMulMod(a, m, most), "leastMulMod(%d, %d, %d)", a, m, most)
	}
	for _, c := range []struct{ a, m, most, want uint64 }{
		{1, 1 << 62, 1 << 40, 1},
		{1<<62 - 1, 1 << 62, 1 << 40, 1<<62 - 1<<40}, // -n mod m: least at n = most
		{3, 1 << 63, 1 << 62, 1},                     // 3n = 2^64 + 1 at n = (2^64+1)/3
		{1<<64 - 2, 1<<64 - 1, 5, 1<<64 - 6},
	} {
		require.Equal(t, c.want, leastMulMod(c.a, c.m, c.most), "leastMulMod(%d, %d, %d)", c.a, c.m, c.most)
	}
}

// TestWorstWasteMatchesEveryLength: the per-layer and contiguous worst
// waste, worked out from the residues, is the most any length from 1 to
// MaxContext leaves, on random strides, pages and contexts; and a
// context of 2^40 tokens on a 2^62-byte page is answered (the walk over
// every length took hours).
func TestWorstWasteMatchesEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 5000 {
		g := geometry{layout: Contiguous, regions: 1 + r.IntN(3), stride: uint64(1 + r.IntN(5000)),
			page: uint64(1+r.IntN(64)) * 512, maxCtx: 1 + r.IntN(3000)}
		var worst uint64
		for n := 1; n <= g.maxCtx; n++ {
			worst = max(worst, (g.page-uint64(n)*g.stride%g.page)%g.page)
		}
		require.Equal(t, uint64(g.regions)*worst, g.worstWaste(), "%+v", g)
	}
	cfg := tinyConfig(PerLayer, 1<<40, 1) // 16 KiB a token
	cfg.PageSize = 1 << 62
	w, err := WorstWaste(cfg, Contiguous)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<62-1<<14), w, "one 16 KiB token in a 2^62-byte page")
	l, err := PickLayout(cfg)
	require.NoError(t, err, "per-layer overflows there; the others hold it")
	require.Equal(t, TokenMajor, l)
}
