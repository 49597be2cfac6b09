package pool

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/stream"
)

// The pool's model-based test: random allocations and frees on several
// streams with events, waits and synchronizes. The model tracks which
// bytes are live, on which stream each allocation lives, every stream's
// vector clock and every free's position. After every step: live
// allocations do not overlap; a block freed on one stream and handed to
// another was allowed to be (same stream, or an enabled policy that
// applies); the pool's figures and invariants agree. In stream order, each
// allocation's first and last 8 bytes are written with a tag when it is
// made and checked when it is freed, so a reuse that broke stream order
// shows as a clobbered tag at the next synchronize.

const poolModelStreams = 3

func runPoolModel(t *testing.T, d backend, data []byte) (reusedAcross int) {
	if len(data) < 1 {
		return 0
	}
	follow, opportunistic, internal := data[0]&1 != 0, data[0]&2 != 0, data[0]&4 != 0
	pe := d.poolEnv(t, Props{}, follow, opportunistic, internal)
	streams := []*stream.Stream{pe.a, pe.b}
	s3, err := stream.New(pe.drv, 0)
	require.NoError(t, err)
	defer s3.Destroy()
	streams = append(streams, s3)
	events := make([]*stream.Event, 3)
	for i := range events {
		events[i], err = stream.NewEvent(pe.drv, 0)
		require.NoError(t, err)
		defer events[i].Destroy()
	}

	// Model.
	type live struct {
		size uint64
		st   int
		tag  uint64
	}
	type freed struct {
		st    int
		pos   uint64         // the free's position on its stream
		clock map[int]uint64 // what the pool's event after the free carries
	}
	lives := map[driver.Addr]live{}
	lastFree := map[driver.Addr]freed{}
	pos := make([]uint64, poolModelStreams)           // operations per stream (model count)
	clock := make([]map[int]uint64, poolModelStreams) // stream -> other stream -> position ordered after
	evClock := make([]map[int]uint64, len(events))    // event -> recorded clock
	for i := range clock {
		clock[i] = map[int]uint64{}
	}
	ordered := func(s, t int, p uint64) bool { return s == t || clock[s][t] >= p }

	// tagAt returns how a host function puts a tag in the first and last 8
	// bytes of the live allocation p and gets them back: through its slice
	// where the driver maps memory into this process, else with the
	// driver's Write and Read (a host function may call the driver).
	tagAt := func(p driver.Addr, size uint64) (put func(tag uint64) error, get func() (first, last uint64, err error)) {
		if _, ok := pe.drv.(driver.HostMapper); ok {
			b, err := pe.p.Bytes(p)
			require.NoError(t, err)
			b = b[:size]
			first, last := b[:8], b[size-8:]
			put = func(tag uint64) error {
				binary.LittleEndian.PutUint64(first, tag)
				binary.LittleEndian.PutUint64(last, tag)
				return nil
			}
			get = func() (uint64, uint64, error) {
				return binary.LittleEndian.Uint64(first), binary.LittleEndian.Uint64(last), nil
			}
			return put, get
		}
		require.True(t, pe.p.Owns(p), "%s is live", p)
		ends := []driver.Addr{p, p + driver.Addr(size-8)}
		put = func(tag uint64) error {
			b := binary.LittleEndian.AppendUint64(nil, tag)
			for _, at := range ends {
				if err := pe.drv.Write(at, b); err != nil {
					return err
				}
			}
			return nil
		}
		get = func() (first, last uint64, err error) {
			var b [2][8]byte
			for i, at := range ends {
				if err := pe.drv.Read(at, b[i][:]); err != nil {
					return 0, 0, err
				}
			}
			return binary.LittleEndian.Uint64(b[0][:]), binary.LittleEndian.Uint64(b[1][:]), nil
		}
		return put, get
	}
	var used uint64
	for i := 1; i+3 <= len(data) && i < 3*200; i += 3 {
		op, x, y := data[i]%10, int(data[i+1]), int(data[i+2])
		si := x % poolModelStreams
		s := streams[si]
		switch {
		case op < 3: // malloc
			size := 16 + uint64(x*y)%(3*g)
			before := s.Position()
			p, err := pe.p.MallocAsync(size, s)
			require.NoError(t, err)
			waited := s.Position() - before
			require.LessOrEqual(t, waited, uint64(1))
			pos[si] += waited
			for q, l := range lives {
				require.False(t, p < q+driver.Addr(l.size) && q < p+driver.Addr(size), "allocation at %s overlaps live %s", p, q)
			}
			if f, ok := lastFree[p]; ok && f.st != si {
				legal := (follow && ordered(si, f.st, f.pos)) || opportunistic || internal
				require.True(t, legal, "block %s freed on stream %d reused on stream %d with no policy allowing it (follow %v, ordered %v)",
					p, f.st, si, follow, ordered(si, f.st, f.pos))
				reusedAcross++
			}
			if waited == 1 { // the pool made s wait for the free (internal dependency)
				require.True(t, internal, "a dependency was inserted with the internal policy off")
				f, ok := lastFree[p]
				require.True(t, ok && f.st != si, "a dependency was inserted for a block not freed on another stream")
				for k, v := range f.clock {
					if k != si && v > clock[si][k] {
						clock[si][k] = v
					}
				}
			}
			delete(lastFree, p)
			tag := uint64(i)<<8 | uint64(si)
			lives[p] = live{size, si, tag}
			used += size
			put, _ := tagAt(p, size)
			require.NoError(t, s.Launch("tag", func() error { return put(tag) }))
			pos[si]++
		case op < 6: // free, on the stream the allocation lives on
			if len(lives) == 0 {
				break
			}
			// pick the y-th live allocation in address order for determinism
			keys := make([]driver.Addr, 0, len(lives))
			for q := range lives {
				keys = append(keys, q)
			}
			for a := range keys {
				for b := a + 1; b < len(keys); b++ {
					if keys[b] < keys[a] {
						keys[a], keys[b] = keys[b], keys[a]
					}
				}
			}
			p := keys[y%len(keys)]
			l := lives[p]
			fs := streams[l.st]
			_, get := tagAt(p, l.size)
			want := l.tag
			require.NoError(t, fs.Launch("check tag", func() error {
				a, b, err := get()
				if err != nil {
					return err
				}
				if a != want || b != want {
					return errors.Newf("allocation %s: tags %x %x, want %x: written by someone else while live", p, a, b, want)
				}
				return nil
			}))
			pos[l.st]++
			if pe.p.poisonOn {
				pos[l.st]++ // the poison fill enqueued before the free
			}
			require.NoError(t, pe.p.FreeAsync(p, fs))
			c := map[int]uint64{}
			for k, v := range clock[l.st] {
				c[k] = v
			}
			c[l.st] = pos[l.st] + 1
			lastFree[p] = freed{st: l.st, pos: pos[l.st], clock: c}
			pos[l.st]++ // the pool records an event right after the free
			delete(lives, p)
			used -= l.size
		case op < 7: // record
			e := y % len(events)
			require.NoError(t, s.Record(events[e]))
			pos[si]++
			c := map[int]uint64{}
			for k, v := range clock[si] {
				c[k] = v
			}
			c[si] = pos[si]
			evClock[e] = c
		case op < 9: // wait
			e := y % len(events)
			require.NoError(t, s.Wait(events[e]))
			pos[si]++
			for k, v := range evClock[e] {
				if k != si && v > clock[si][k] {
					clock[si][k] = v
				}
			}
		default: // synchronize
			require.NoError(t, s.Synchronize(), "step %d", i/3)
		}
		// Model positions must match the streams' own counts.
		for k, st := range streams {
			require.Equal(t, pos[k], st.Position(), "stream %d position", k)
		}
		u, err := pe.p.Attribute(UsedMemCurrent)
		require.NoError(t, err)
		require.Equal(t, used, u)
		require.NoError(t, pe.p.Check(), "step %d", i/3)
	}
	for _, s := range streams {
		require.NoError(t, s.Synchronize())
	}
	for p, l := range lives {
		require.NoError(t, pe.p.FreeAsync(p, streams[l.st]))
	}
	for _, s := range streams {
		require.NoError(t, s.Synchronize())
	}
	return reusedAcross
}

func poolOps(rng *rand.Rand, n int, policies byte) []byte {
	b := make([]byte, 1+3*n)
	b[0] = policies
	for i := 1; i < len(b); i++ {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

func TestPoolModel(t *testing.T) {
	onEveryDriver(t, func(t *testing.T, d backend) {
		across := map[byte]int{}
		for policies := byte(0); policies < 8; policies++ {
			for seed := uint64(0); seed < 3; seed++ {
				t.Run(fmt.Sprintf("policies%03b/%d", policies, seed), func(t *testing.T) {
					across[policies] += runPoolModel(t, d, poolOps(rand.New(rand.NewPCG(seed, uint64(policies))), 150, policies))
				})
			}
		}
		require.Zero(t, across[0], "with every policy off, nothing is reused across streams")
		reused := 0
		for p, n := range across {
			if p != 0 {
				reused += n
			}
		}
		require.Positive(t, reused, "with policies on, the sequences do reuse across streams")
	})
}

// FuzzPoolModel fuzzes the pool model's operation decoder (first byte: the
// three reuse policies).
func FuzzPoolModel(f *testing.F) {
	f.Add(poolOps(rand.New(rand.NewPCG(4, 4)), 40, 7))
	f.Add(poolOps(rand.New(rand.NewPCG(5, 5)), 40, 0))
	ds := fuzzDrivers(f, 2, 64*g) // poolEnv's machine
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range ds {
			_ = runPoolModel(t, d, data)
		}
	})
}
