package sleep

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver"
)

// stitchedTag makes tag "w" of m hold a stitched allocation, as
// arena's TestStitch does: the tag's allocator gets no more address space
// than its Max of eight chunks and keeps nothing beyond the live set, eight
// one-chunk allocations fill it, every other one is freed, and a request
// of three chunks then fits no free block and no hole: the allocator maps
// three of the free chunks side by side in its stitch range. Each of those
// chunks is then mapped twice — at its own address in the heap range
// (lent, neither free nor allocatable) and in the stitched allocation —
// so the tag's records hold aliased mappings. It returns the live
// allocations' bytes (the stitched one's included) and the stitched
// allocation's address.
func stitchedTag(t *testing.T, d driver.Driver, m *Manager) (map[driver.Addr][]byte, driver.Addr) {
	t.Helper()
	m.tagOptions = func(o *arena.AllocatorOptions) {
		o.Max, o.AddressSpace = 8*testCS, 8*testCS
		o.ReleaseThreshold = 1
	}
	want := map[driver.Addr][]byte{}
	var ps []driver.Addr
	for i := range 8 {
		p, err := m.Alloc("w", testCS)
		require.NoError(t, err)
		b := pattern(uint64(i), testCS)
		require.NoError(t, d.Write(p, b))
		ps = append(ps, p)
		want[p] = b
	}
	for i := 0; i < 8; i += 2 {
		require.NoError(t, m.Free(ps[i]))
		delete(want, ps[i])
	}
	big, err := m.Alloc("w", 3*testCS)
	require.NoError(t, err)
	b := pattern(100, 3*testCS)
	require.NoError(t, d.Write(big, b))
	want[big] = b

	tg := m.tags["w"]
	require.Equal(t, 1, tg.al.Stats().Stitches, "the three-chunk request was stitched")
	require.True(t, tg.al.Ranges()[2].Contains(big), "served from the stitch range")
	require.Len(t, aliases(tg.drv), 3, "each stitched chunk is mapped twice")
	require.NoError(t, m.Check())
	return want, big
}

// aliases lists, for each chunk of td mapped at more than one address,
// its mappings' addresses in order.
func aliases(td *tagDriver) [][]driver.Addr {
	td.mu.Lock()
	defer td.mu.Unlock()
	var out [][]driver.Addr
	for _, c := range td.chunks {
		if len(c.maps) < 2 {
			continue
		}
		as := make([]driver.Addr, 0, len(c.maps))
		for a := range c.maps {
			as = append(as, a)
		}
		sort.Slice(as, func(i, j int) bool { return as[i] < as[j] })
		out = append(out, as)
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// requireAliased checks that every address of each alias group reaches
// the same memory: they read the same bytes, and a byte written through
// one is read through the others (then put back).
func requireAliased(t *testing.T, d driver.Driver, groups [][]driver.Addr) {
	t.Helper()
	for _, g := range groups {
		first := read(t, d, g[0], testCS)
		for _, a := range g[1:] {
			require.Equal(t, first, read(t, d, a, testCS), "%s and %s map the same chunk", g[0], a)
		}
		flip := []byte{first[7] ^ 0xff}
		require.NoError(t, d.Write(g[len(g)-1]+7, flip))
		for _, a := range g {
			require.Equal(t, flip, read(t, d, a+7, 1), "a write at %s is seen at %s", g[len(g)-1], a)
		}
		require.NoError(t, d.Write(g[len(g)-1]+7, first[7:8]))
	}
}

// TestStitchedSleepWake: a stitched allocation — three chunks borrowed
// from the tag's heap range, mapped side by side in its stitch range —
// and the aliased mappings it makes (each borrowed chunk at its own
// address and in the stitch) sleep and wake, in Host and File modes,
// twice: every live allocation keeps its address and its bytes, the alias
// groups are the same addresses and still one memory each, the device
// holds nothing of the tag while it sleeps (each aliased chunk is
// released once: Check, and the device's used bytes), and Check passes
// after each step. Then the stitched allocation is freed while the tag
// sleeps and the tag wakes without it.
func TestStitchedSleepWake(t *testing.T) {
	for _, mode := range []Mode{Host, File} {
		t.Run(mode.String(), func(t *testing.T) {
			d := openHost(t, testCap)
			m := newManager(t, d)
			want, big := stitchedTag(t, d, m)
			groups := aliases(m.tags["w"].drv)
			requireAliased(t, d, groups)
			require.Equal(t, 8*testCS, stats(t, m, "w").AwakeBytes, "seven chunks live, one free")
			require.Equal(t, 8*testCS, d.Used(0))
			const held = 7 * testCS // the free chunk goes for good at the first sleep
			for range 2 {
				require.NoError(t, m.Sleep(mode))
				require.NoError(t, m.Check())
				s := stats(t, m, "w")
				require.True(t, s.Asleep)
				require.Zero(t, d.Used(0), "every chunk, aliased ones included, went back")
				require.Equal(t, 7*testCS, s.BackupBytes, "four one-chunk allocations and the three-chunk stitch")
				require.Equal(t, held, s.AsleepBytes)

				require.NoError(t, m.Wake())
				require.NoError(t, m.Check())
				require.Equal(t, held, d.Used(0))
				require.Equal(t, held, stats(t, m, "w").AwakeBytes)
				require.Equal(t, groups, aliases(m.tags["w"].drv), "the same chunks at the same addresses")
				requireContents(t, d, want)
				requireAliased(t, d, groups)
				for p, b := range want {
					n, err := m.Size(p)
					require.NoError(t, err)
					require.Equal(t, uint64(len(b)), n, "%s is live at its size", p)
				}
			}

			// Free the stitch while asleep: its backup goes, its chunks
			// return to the heap (still asleep), and the wake commits
			// only what is left.
			require.NoError(t, m.Sleep(mode))
			require.NoError(t, m.Free(big))
			delete(want, big)
			require.NoError(t, m.Check())
			require.Equal(t, 4*testCS, stats(t, m, "w").BackupBytes)
			require.Zero(t, d.Used(0))
			require.NoError(t, m.Wake())
			require.NoError(t, m.Check())
			require.Empty(t, aliases(m.tags["w"].drv), "the stitch is gone: no chunk is mapped twice")
			requireContents(t, d, want)
			require.Equal(t, stats(t, m, "w").AwakeBytes, d.Used(0))
			closeAll(t, m)
			require.Zero(t, d.Used(0))
		})
	}
}
