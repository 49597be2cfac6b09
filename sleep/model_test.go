package sleep

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/tensor"
)

// The Manager's model-based test: random allocations, frees, writes,
// sleeps, wakes, tensors and trims over three tags, against a model that knows
// each tag's state, each live allocation's tag and bytes (unknown after a
// Discard sleep) and which tensors Tensor handed out are still open (until
// a Sleep of their tag or a Free of their allocation). After every step:
// Check passes; each tag's figures agree with the model (live count,
// asleep, backup bytes = live bytes of a tag asleep in Host or File mode,
// nothing committed while asleep); the device's used bytes are the awake
// tags' sum; every awake allocation whose bytes are known holds them; and
// every open tensor holds its allocation's known bytes while every closed
// one answers ErrClosed. After a Trim, each awake tag named holds no more
// than the chunks its live allocations may touch.

var modelTags = []string{"", "weights", "kv"}

type modelAlloc struct {
	tag  string
	data []byte // nil: unknown (discarded)
}

type modelTag struct {
	made, asleep bool
	mode         Mode
}

// modelTensor is a tensor Tensor handed out over the allocation at p,
// open until its tag sleeps or p is freed.
type modelTensor struct {
	p    driver.Addr
	tag  string
	t    *tensor.Tensor
	open bool
}

// modelTensorsKept is how many of the latest tensors the model checks.
const modelTensorsKept = 8

func runModel(t *testing.T, d *host.Driver, data []byte) {
	m := newManager(t, d)
	defer closeAll(t, m)
	tags := map[string]*modelTag{}
	for _, n := range modelTags {
		tags[n] = &modelTag{}
	}
	live := map[driver.Addr]*modelAlloc{}
	var tensors []*modelTensor
	order := []driver.Addr{} // live addresses in allocation order, for picking
	pick := func(b byte) (driver.Addr, bool) {
		if len(order) == 0 {
			return 0, false
		}
		return order[int(b)%len(order)], true
	}
	tagArgs := func(b byte) []string {
		if b%4 == 3 {
			return nil
		}
		return []string{modelTags[b%3]}
	}
	selected := func(args []string) []*modelTag {
		var out []*modelTag
		for _, n := range modelTags {
			if (args == nil && tags[n].made) || (args != nil && args[0] == n) {
				out = append(out, tags[n])
			}
		}
		return out
	}
	seq := uint64(0)
	for len(data) >= 3 {
		op, a, b := data[0]%8, data[1], data[2]
		data = data[3:]
		seq++
		switch op {
		case 0: // alloc
			name := modelTags[a%3]
			size := uint64(b)*1024 + uint64(a) + 1
			p, err := m.Alloc(name, size)
			if tags[name].asleep {
				require.ErrorIs(t, err, driver.ErrBusy)
				continue
			}
			require.NoError(t, err)
			tags[name].made = true
			buf := pattern(seq, size)
			require.NoError(t, d.Write(p, buf))
			live[p] = &modelAlloc{tag: name, data: buf}
			order = append(order, p)
		case 1: // free
			p, ok := pick(a)
			if !ok {
				continue
			}
			require.NoError(t, m.Free(p))
			delete(live, p)
			for _, mt := range tensors {
				mt.open = mt.open && mt.p != p
			}
			for i, q := range order {
				if q == p {
					order = append(order[:i], order[i+1:]...)
					break
				}
			}
		case 2: // sleep
			mode, args := Mode(a%3), tagArgs(b)
			err := m.Sleep(mode, args...)
			if args != nil && !tags[args[0]].made {
				require.ErrorIs(t, err, driver.ErrInvalid)
				continue
			}
			require.NoError(t, err)
			for _, mt := range tensors {
				if args == nil || args[0] == mt.tag {
					mt.open = false
				}
			}
			for _, mt := range selected(args) {
				if !mt.asleep {
					mt.asleep, mt.mode = true, mode
				}
			}
		case 3: // wake
			args := tagArgs(a)
			err := m.Wake(args...)
			if args != nil && !tags[args[0]].made {
				require.ErrorIs(t, err, driver.ErrInvalid)
				continue
			}
			require.NoError(t, err)
			for n, mt := range tags {
				if mt.asleep && (args == nil || args[0] == n) {
					mt.asleep = false
					if mt.mode == Discard {
						for _, al := range live {
							if al.tag == n {
								al.data = nil
							}
						}
					}
				}
			}
		case 4: // write
			p, ok := pick(a)
			if !ok || tags[live[p].tag].asleep {
				continue
			}
			buf := pattern(seq, uint64(b)%64+1)
			n := min(uint64(len(buf)), mustSize(t, m, p))
			require.NoError(t, d.Write(p, buf[:n]))
			if live[p].data != nil {
				copy(live[p].data, buf[:n])
			}
		case 5: // read everything back
			for p, al := range live {
				if !tags[al.tag].asleep && al.data != nil {
					require.True(t, bytes.Equal(al.data, read(t, d, p, uint64(len(al.data)))), "contents at %s", p)
				}
			}
		case 6: // a tensor over an allocation, written through when b is odd
			p, ok := pick(a)
			if !ok {
				continue
			}
			al := live[p]
			tt, err := m.Tensor(p)
			if tags[al.tag].asleep {
				require.ErrorIs(t, err, driver.ErrBusy)
				continue
			}
			require.NoError(t, err)
			if b%2 == 1 {
				buf := pattern(seq, uint64(b)%64+1)
				require.NoError(t, tt.Access(true, func(mem []byte) error {
					n := copy(mem, buf)
					if al.data != nil {
						copy(al.data, buf[:n])
					}
					return nil
				}))
			}
			tensors = append(tensors, &modelTensor{p: p, tag: al.tag, t: tt, open: true})
			if len(tensors) > modelTensorsKept {
				tensors = tensors[1:]
			}
		case 7: // trim: an awake tag keeps only chunks its live allocations touch
			args := tagArgs(a)
			err := m.Trim(args...)
			if args != nil && !tags[args[0]].made {
				require.ErrorIs(t, err, driver.ErrInvalid)
				continue
			}
			require.NoError(t, err)
			for _, n := range modelTags {
				if mt := tags[n]; mt.made && !mt.asleep && (args == nil || args[0] == n) {
					var want uint64
					for p, al := range live {
						if al.tag == n {
							want += alignUp(mustSize(t, m, p), testCS) + testCS // it may straddle a chunk boundary
						}
					}
					require.LessOrEqual(t, stats(t, m, n).AwakeBytes, want, "tag %q after Trim", n)
				}
			}
		}
		compareModel(t, m, d, tags, live)
		compareTensors(t, tensors, live)
	}
}

func mustSize(t *testing.T, m *Manager, p driver.Addr) uint64 {
	n, err := m.Size(p)
	require.NoError(t, err)
	return n
}

func compareModel(t *testing.T, m *Manager, d *host.Driver, tags map[string]*modelTag, live map[driver.Addr]*modelAlloc) {
	t.Helper()
	require.NoError(t, m.Check())
	var awake uint64
	for _, s := range m.Stats() {
		mt := tags[s.Tag]
		require.True(t, mt.made)
		var n int
		for _, al := range live {
			if al.tag == s.Tag {
				n++
			}
		}
		require.Equal(t, n, s.Live, "tag %q", s.Tag)
		require.Equal(t, mt.asleep, s.Asleep, "tag %q", s.Tag)
		if mt.asleep {
			require.Zero(t, s.AwakeBytes)
			require.Equal(t, mt.mode, s.Mode)
			var want uint64
			if mt.mode != Discard {
				for p, al := range live {
					if al.tag == s.Tag {
						want += mustSize(t, m, p)
					}
				}
			}
			require.Equal(t, want, s.BackupBytes, "tag %q", s.Tag)
		} else {
			require.Zero(t, s.BackupBytes)
			require.Zero(t, s.AsleepBytes)
		}
		awake += s.AwakeBytes
	}
	require.Equal(t, awake, d.Used(0), "the device holds the awake tags' memory")
}

// compareTensors checks that each open tensor holds its allocation's
// bytes, where known, and that each closed one answers ErrClosed.
func compareTensors(t *testing.T, tensors []*modelTensor, live map[driver.Addr]*modelAlloc) {
	t.Helper()
	for _, mt := range tensors {
		err := mt.t.Access(false, func(mem []byte) error {
			if al := live[mt.p]; al != nil && al.data != nil {
				require.True(t, bytes.Equal(al.data, mem), "the tensor over %s", mt.p)
			}
			return nil
		})
		if mt.open {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, driver.ErrClosed, "the tensor over %s", mt.p)
		}
	}
}

// modelOps are n random operations for runModel.
func modelOps(r *rand.Rand, n int) []byte {
	out := make([]byte, 0, 3*n)
	for range n {
		out = append(out, byte(r.IntN(8)), byte(r.Uint32()), byte(r.Uint32()))
	}
	return out
}

func TestModel(t *testing.T) {
	d := openHost(t, testCap)
	for seed := range 4 {
		runModel(t, d, modelOps(rand.New(rand.NewPCG(uint64(seed), 21)), 100))
	}
	require.Zero(t, d.Used(0))
}

// FuzzModel fuzzes the model's operation decoder: three bytes an
// operation (kind, then two arguments).
func FuzzModel(f *testing.F) {
	f.Add(modelOps(rand.New(rand.NewPCG(1, 1)), 40))
	f.Add([]byte{0, 0, 5, 2, 1, 3, 1, 0, 0, 3, 3, 0})
	d := openHost(f, testCap)
	f.Fuzz(func(t *testing.T, data []byte) {
		runModel(t, d, data)
		require.Zero(t, d.Used(0), "the device holds nothing after the run")
	})
}

// alignUp rounds n up to a multiple of the power of two a.
func alignUp(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }
