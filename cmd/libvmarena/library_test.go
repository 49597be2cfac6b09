package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/leakcheck"
	"github.com/vmarena/vmarena/internal/units"
	"github.com/vmarena/vmarena/sleep"
)

// testEnv is the environment of the libraries these tests make: a small
// host device, so that nothing depends on the machine's free memory.
func testEnv(extra ...string) func(string) string {
	env := map[string]string{envCapacity: "64MiB", envTagMax: "16MiB"}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return func(k string) string { return env[k] }
}

func TestConfigFrom(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want config
		err  string
	}{
		{env: nil, want: config{Driver: "host"}},
		{env: []string{envDevices, "3", envCapacity, "1GiB"}, want: config{Driver: "host", Devices: []int{0, 1, 2}, Capacity: units.GiB}},
		{env: []string{envDriver, "cuda", envDevices, "2, 3", envTagMax, "4096"}, want: config{Driver: "cuda", Devices: []int{2, 3}, TagMax: 4096}},
		{env: []string{envDriver, "tpu"}, err: `VMARENA_DRIVER="tpu"`},
		{env: []string{envDevices, "0"}, err: `VMARENA_DEVICES="0"`},
		{env: []string{envDriver, "acl", envDevices, "1,1"}, err: `VMARENA_DEVICES="1,1"`},
		{env: []string{envDriver, "acl", envDevices, "1,-2"}, err: `VMARENA_DEVICES="1,-2"`},
		{env: []string{envDriver, "cuda", envDevices, "0,32"}, err: `VMARENA_DEVICES="0,32"`},
		{env: []string{envDriver, "cuda", envDevices, "9223372036854775807"}, err: `VMARENA_DEVICES="9223372036854775807"`},
		{env: []string{envCapacity, "lots"}, err: `VMARENA_CAPACITY="lots"`},
		{env: []string{envTagMax, "-1"}, err: `VMARENA_TAG_MAX="-1"`},
		{env: []string{envHostCache, "2GiB"}, want: config{Driver: "host", HostCache: 2 * units.GiB}},
		// sizes as units.Parse reads them: fractions of binary units, GB decimal
		{env: []string{envCapacity, "1.5GiB", envTagMax, "1GB"}, want: config{Driver: "host", Capacity: 3 * units.GiB / 2, TagMax: 1e9}},
		{env: []string{envHostCache, "some"}, err: `VMARENA_HOST_CACHE="some"`},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			env := map[string]string{envBackupDir: "/backups"}
			for i := 0; i+1 < len(tc.env); i += 2 {
				env[tc.env[i]] = tc.env[i+1]
			}
			c, err := configFrom(func(k string) string { return env[k] })
			if tc.err != "" {
				require.ErrorIs(t, err, driver.ErrInvalid)
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			tc.want.BackupDir = "/backups"
			require.Equal(t, tc.want, c)
		})
	}
}

// FuzzConfigFrom: any environment is a configuration of at most
// driver.MaxDevices distinct devices below driver.MaxDevices, or an error
// marked driver.ErrInvalid; never a panic.
func FuzzConfigFrom(f *testing.F) {
	f.Add("host", "3", "1GiB", "4096", "2GiB")
	f.Add("cuda", "2, 3", "", "1GB", "")
	f.Add("acl", "1,1", "lots", "-1", "some")
	f.Fuzz(func(t *testing.T, drv, devices, capacity, tagMax, hostCache string) {
		env := map[string]string{envDriver: drv, envDevices: devices, envCapacity: capacity, envTagMax: tagMax, envHostCache: hostCache}
		c, err := configFrom(func(k string) string { return env[k] })
		if err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			return
		}
		require.LessOrEqual(t, len(c.Devices), driver.MaxDevices)
		seen := map[int]bool{}
		for _, d := range c.Devices {
			require.True(t, d >= 0 && d < driver.MaxDevices && !seen[d], "%v", c.Devices)
			seen[d] = true
		}
	})
}

func TestCodeOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{nil, codeOK},
		{errors.Wrap(driver.ErrInvalid, "x"), codeInvalid},
		{errors.Wrap(driver.ErrNotAllocated, "x"), codeInvalid},
		{errors.Wrap(driver.ErrMisaligned, "x"), codeInvalid},
		{errors.Wrap(driver.ErrOutOfMemory, "x"), codeOutOfMemory},
		{errors.Wrap(driver.ErrBusy, "x"), codeBusy},
		{errors.Wrap(driver.ErrUnsupported, "x"), codeUnsupported},
		{errors.Wrap(driver.ErrClosed, "x"), codeClosed},
		{errors.Wrap(driver.ErrNoDevice, "x"), codeNoDevice},
		{errors.New("x"), codeOther},
		{panicError("alloc", "boom"), codeOther},
	} {
		require.Equal(t, tc.code, codeOf(tc.err), "%v", tc.err)
	}
}

// TestBadInputChangesNothing checks each bad call's error class, and that
// the state after it is the state before.
func TestBadInputChangesNothing(t *testing.T) {
	l := newLibrary(testEnv())
	p, err := l.alloc(0, 5000, 0)
	require.NoError(t, err)
	before, err := l.statsJSON()
	require.NoError(t, err)
	long := string(make([]byte, maxTagLen+1))
	for _, tc := range []struct {
		name string
		err  error
		is   error
	}{
		{"alloc of 0 bytes", func() error { _, err := l.alloc(0, 0, 0); return err }(), driver.ErrInvalid},
		{"alloc of -1 bytes", func() error { _, err := l.alloc(0, -1, 0); return err }(), driver.ErrInvalid},
		{"alloc on no device", func() error { _, err := l.alloc(0, 5000, 7); return err }(), driver.ErrNoDevice},
		{"alloc beyond the tag's max", func() error { _, err := l.alloc(0, 17*int64(units.MiB), 0); return err }(), driver.ErrOutOfMemory},
		{"free inside an allocation", l.free(p+1, 0, 0), driver.ErrNotAllocated},
		{"free with the wrong size", l.free(p, 4999, 0), driver.ErrInvalid},
		{"free on another device", l.free(p, 5000, 1), driver.ErrNoDevice},
		{"a tag too long", func() error { _, err := l.tagID(long); return err }(), driver.ErrInvalid},
		{"a tag not printable", func() error { _, err := l.tagID("kv\n"); return err }(), driver.ErrInvalid},
		{"sleep mode 3", l.sleep("", 3), driver.ErrInvalid},
		{"sleep mode -1", l.sleep("", -1), driver.ErrInvalid},
		{"shutdown with a live allocation", l.shutdown(), driver.ErrBusy},
	} {
		require.ErrorIs(t, tc.err, tc.is, tc.name)
		require.ErrorContains(t, tc.err, "libvmarena: ", tc.name)
	}
	after, err := l.statsJSON()
	require.NoError(t, err)
	// The failed frees are counted, and nothing else changed.
	var b, a statsJSON
	require.NoError(t, json.Unmarshal(before, &b))
	require.NoError(t, json.Unmarshal(after, &a))
	require.Equal(t, uint64(3), a.FreeErrors-b.FreeErrors)
	a.FreeErrors = b.FreeErrors
	require.Equal(t, b, a)
	require.NoError(t, l.check())
	require.NoError(t, l.free(p, 5000, 0))
	require.NoError(t, l.shutdown())
}

// panicking is a backend whose every call panics.
type panicking struct{ backend }

func (panicking) Alloc(string, uint64) (driver.Addr, error) { panic("alloc broke") }
func (panicking) Free(driver.Addr) error                    { panic("free broke") }
func (panicking) Size(driver.Addr) (uint64, error)          { panic("size broke") }
func (panicking) Sleep(mode, ...string) error               { panic("sleep broke") }

func TestPanicsBecomeErrors(t *testing.T) {
	l := newLibrary(testEnv())
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	real := l.devs[0]
	l.devs[0] = panicking{}
	_, err = callAlloc(l, 0, 4096, 0)
	require.ErrorContains(t, err, "alloc broke")
	require.Equal(t, codeOther, codeOf(err))
	require.ErrorContains(t, callFree(l, p, 0, 0, 0), "free broke")
	require.ErrorContains(t, callFree(l, p, 4096, 0, 0), "size broke")
	require.ErrorContains(t, call("sleep", func() error { return l.sleep("", 1) }), "sleep broke")
	// The library's lock was released on the way out.
	l.devs[0] = real
	require.NoError(t, l.free(p, 4096, 0))
	require.NoError(t, l.shutdown())
}

// TestModesAreTheSleepPackages: the C API's modes convert to the sleep
// package's by value, and there are as many.
func TestModesAreTheSleepPackages(t *testing.T) {
	require.Equal(t, []sleep.Mode{sleep.Discard, sleep.Host, sleep.File},
		[]sleep.Mode{sleep.Mode(modeDiscard), sleep.Mode(modeHost), sleep.Mode(modeFile)})
	require.Equal(t, "file", modeFile.String())
	require.Equal(t, int(sleep.File)+1, int(modeCount))
}

// TestSleepAndWakeCalls checks sleep and wake's answers: no tag is
// invalid, and a tag that exists sleeps and wakes.
func TestSleepAndWakeCalls(t *testing.T) {
	l := newLibrary(testEnv())
	require.NoError(t, l.sleep("", 1), "nothing allocated: nothing to sleep")
	require.ErrorIs(t, l.sleep("weights", 1), driver.ErrInvalid, "no such tag")
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	require.ErrorIs(t, l.wake("weights"), driver.ErrInvalid, "no such tag")
	for _, err := range []error{l.sleep("default", 0), l.sleep("", 2), l.wake("default"), l.wake("")} {
		require.NoError(t, err)
	}
	require.NoError(t, l.free(p, 0, 0))
	require.NoError(t, l.shutdown())
}

// TestShutdownGivesEverythingBack checks that a library that allocated,
// freed and shut down holds no descriptor or mapping, and that it opens
// again after.
func TestShutdownGivesEverythingBack(t *testing.T) {
	l := newLibrary(testEnv())
	work := func() {
		var ps []driver.Addr
		for i, tag := range []string{"", "weights", "kv", "weights"} {
			id, err := l.tagID(tag)
			require.NoError(t, err)
			p, err := l.alloc(id, int64(i+1)*int64(units.MiB)+3, 0)
			require.NoError(t, err)
			ps = append(ps, p)
		}
		for _, p := range ps {
			require.NoError(t, l.free(p, 0, 0))
		}
		require.NoError(t, l.check())
		require.NoError(t, l.shutdown())
	}
	before, after, same, err := leakcheck.Compare(3, work)
	require.NoError(t, err)
	require.True(t, same, "before %s\nafter  %s", before, after)
}

// libModel is what the library should hold: the reference the model test
// compares it with.
type libModel struct {
	tag     string                // the thread's tag
	live    map[driver.Addr]int64 // size by address
	tagOf   map[driver.Addr]string
	made    map[string]bool // tags that have allocated (Stats lists them)
	backend bool            // device 0's backend exists
	// The tags asleep, the mode of
	// each tag's last sleep and its completed sleep and wake cycles.
	asleep map[string]bool
	mode   map[string]mode
	cycles map[string]int
}

// The tags and sizes the model test draws from.
var (
	modelTags  = []string{"", "weights", "kv_cache", "graph"}
	modelSizes = []int64{1, 4095, 4096, 100_000, int64(units.MiB), 3*int64(units.MiB) + 7}
)

// runModel decodes data into operations on a fresh library and checks
// each against the model: the op decoder the fuzz target drives.
func runModel(t *testing.T, data []byte) {
	l := newLibrary(testEnv())
	m := libModel{live: map[driver.Addr]int64{}, tagOf: map[driver.Addr]string{}, made: map[string]bool{},
		asleep: map[string]bool{}, mode: map[string]mode{}, cycles: map[string]int{}}
	var freed []driver.Addr
	var tag int32
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	keys := func() []driver.Addr {
		ks := make([]driver.Addr, 0, len(m.live))
		for p := range m.live {
			ks = append(ks, p)
		}
		slices.Sort(ks)
		return ks
	}
	for step := 0; len(data) > 0 && step < 200; step++ {
		op, arg := next()%8, next()
		switch op {
		case 0: // set the tag
			name := modelTags[int(arg)%len(modelTags)]
			id, err := l.tagID(name)
			require.NoError(t, err)
			tag, m.tag = id, name
		case 1, 2: // allocate
			size := modelSizes[int(arg)%len(modelSizes)]
			p, err := l.alloc(tag, size, 0)
			name := m.tag
			if name == "" {
				name = defaultTag
			}
			var held int64
			for q, s := range m.live {
				if m.tagOf[q] == name {
					held += s
				}
			}
			if m.asleep[name] {
				require.ErrorIs(t, err, driver.ErrBusy, "step %d: alloc under sleeping %q", step, name)
				break
			}
			if err != nil {
				require.ErrorIs(t, err, driver.ErrOutOfMemory, "step %d", step)
				require.Greater(t, held+size, int64(8*units.MiB), "step %d: out of memory with little held", step)
				break
			}
			m.backend, m.made[name] = true, true
			_, dup := m.live[p]
			require.False(t, dup, "step %d: %#x handed out twice", step, p)
			m.live[p], m.tagOf[p] = size, name
			freed = slices.DeleteFunc(freed, func(q driver.Addr) bool { return q == p })
		case 3, 4: // free a live allocation, with or without its size
			ks := keys()
			if len(ks) == 0 {
				break
			}
			p := ks[int(arg)%len(ks)]
			size := uint64(0)
			if op == 4 {
				size = uint64(m.live[p])
			}
			require.NoError(t, l.free(p, size, 0), "step %d", step)
			delete(m.live, p)
			delete(m.tagOf, p)
			freed = append(freed, p)
		case 5: // free what is not live: changes nothing
			if len(freed) == 0 {
				require.NoError(t, l.free(0, 0, 0))
				break
			}
			err := l.free(freed[int(arg)%len(freed)], 0, 0)
			require.ErrorIs(t, err, driver.ErrNotAllocated, "step %d", step)
		case 6: // sleep or wake
			var err error
			md, name := int(arg%5), modelTags[int(arg/5)%len(modelTags)]
			if md == 4 {
				err = l.wake(name)
			} else {
				err = l.sleep(name, md)
			}
			switch {
			case md == 3:
				require.ErrorIs(t, err, driver.ErrInvalid, "step %d", step)
			case name != "" && !m.made[name]:
				require.ErrorIs(t, err, driver.ErrInvalid, "step %d: no tag %q", step, name)
			default:
				require.NoError(t, err, "step %d", step)
				targets := []string{name}
				if name == "" {
					targets = slices.Collect(maps.Keys(m.made))
				}
				for _, n := range targets {
					switch {
					case md == 4 && m.asleep[n]:
						m.asleep[n] = false
						m.cycles[n]++
					case md < 3 && !m.asleep[n]:
						m.asleep[n], m.mode[n] = true, mode(md)
					}
				}
			}
		case 7: // the stats
			s := statsOf(t, l)
			// Live counts exactly; awake bytes are the memory committed
			// under the tag, at least its live bytes.
			want, liveBytes := map[string]tagJSON{}, map[string]uint64{}
			for name := range m.made {
				want[name] = tagJSON{Tag: name, Mode: m.mode[name].String(), Asleep: m.asleep[name], Cycles: m.cycles[name]}
			}
			for p, size := range m.live {
				tj := want[m.tagOf[p]]
				tj.Live++
				want[m.tagOf[p]] = tj
				liveBytes[m.tagOf[p]] += uint64(size)
			}
			got := map[string]tagJSON{}
			for _, d := range s.Devices {
				require.Equal(t, 0, d.Device)
				for _, tj := range d.Tags {
					switch {
					case !tj.Asleep:
						require.GreaterOrEqual(t, tj.AwakeBytes, liveBytes[tj.Tag], "step %d: tag %q", step, tj.Tag)
					case tj.Mode != "discard":
						require.GreaterOrEqual(t, tj.BackupBytes, liveBytes[tj.Tag], "step %d: tag %q's backup", step, tj.Tag)
					}
					tj.AwakeBytes, tj.AsleepBytes, tj.BackupBytes = 0, 0, 0
					got[tj.Tag] = tj
				}
			}
			require.Equal(t, want, got, "step %d", step)
		}
		require.NoError(t, l.check(), "step %d", step)
	}
	err := l.shutdown()
	if len(m.live) > 0 {
		require.ErrorIs(t, err, driver.ErrBusy)
		for _, p := range keys() {
			require.NoError(t, l.free(p, uint64(m.live[p]), 0))
		}
		err = l.shutdown()
	}
	require.NoError(t, err)
}

// modelOps are random operations for runModel.
func modelOps(r *rand.Rand, n int) []byte {
	b := make([]byte, 2*n)
	for i := range b {
		b[i] = byte(r.UintN(256))
	}
	return b
}

func TestLibraryModel(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			runModel(t, modelOps(rand.New(rand.NewPCG(seed, 21)), 150))
		})
	}
}

func FuzzLibraryModel(f *testing.F) {
	f.Add(modelOps(rand.New(rand.NewPCG(1, 1)), 60))
	f.Add([]byte{1, 4, 0, 1, 1, 5, 6, 1, 3, 0, 5, 0, 7, 0})
	f.Fuzz(runModel)
}

// TestDevicesAreSeparate checks that each device has its own memory: a
// pointer of one is not the other's to free or size.
func TestDevicesAreSeparate(t *testing.T) {
	l := newLibrary(testEnv(envDevices, "2"))
	p0, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	p1, err := l.alloc(0, 8192, 1)
	require.NoError(t, err)
	require.ErrorIs(t, l.free(p0, 0, 1), driver.ErrNotAllocated)
	require.ErrorIs(t, l.free(p1, 8192, 0), driver.ErrNotAllocated)
	_, err = l.alloc(0, 4096, 2)
	require.ErrorIs(t, err, driver.ErrNoDevice)
	s := statsOf(t, l)
	require.Len(t, s.Devices, 2)
	for i, want := range []uint64{4096, 8192} {
		require.Equal(t, i, s.Devices[i].Device)
		require.Len(t, s.Devices[i].Tags, 1)
		tj := s.Devices[i].Tags[0]
		require.GreaterOrEqual(t, tj.AwakeBytes, want)
		tj.AwakeBytes = 0
		require.Equal(t, tagJSON{Tag: defaultTag, Live: 1, Mode: "discard"}, tj)
	}
	require.Equal(t, uint64(2), s.FreeErrors)
	require.NoError(t, l.free(p0, 4096, 0))
	require.NoError(t, l.free(p1, 0, 1))
	require.NoError(t, l.shutdown())
}

// TestConcurrentCalls runs allocations, frees, tags and stats from several
// goroutines at once (the race detector watches the library's lock).
func TestConcurrentCalls(t *testing.T) {
	l := newLibrary(testEnv())
	done := make(chan error)
	for g := range 4 {
		go func() {
			done <- func() error {
				id, err := l.tagID(fmt.Sprintf("g%d", g))
				if err != nil {
					return err
				}
				for i := range 50 {
					p, err := l.alloc(id, int64(4096*(i%3+1)), 0)
					if err != nil {
						return err
					}
					if _, err := l.statsJSON(); err != nil {
						return err
					}
					if err := l.free(p, uint64(4096*(i%3+1)), 0); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range 4 {
		require.NoError(t, <-done) // a deadlock hangs here until go test's -timeout, with every goroutine's stack
	}
	require.NoError(t, l.check())
	require.NoError(t, l.shutdown())
}

// TestOpenFailures checks that a bad environment or a missing vendor
// library fails the calls that need a device, naming the cause, and that
// the library opens once the cause is gone.
func TestOpenFailures(t *testing.T) {
	env := map[string]string{envDriver: "tpu", envCapacity: "64MiB"}
	l := newLibrary(func(k string) string { return env[k] })
	_, err := l.alloc(0, 4096, 0)
	require.ErrorIs(t, err, driver.ErrInvalid)
	require.ErrorContains(t, err, `VMARENA_DRIVER="tpu"`)

	env[envDriver] = "cuda"
	t.Setenv("VMARENA_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
	_, err = l.alloc(0, 4096, 0)
	require.Error(t, err)
	require.ErrorContains(t, err, "libvmarena: open the cuda driver")
	require.Equal(t, codeUnsupported, codeOf(err), "%v", err)

	env[envDriver] = "host"
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	require.NoError(t, l.free(p, 4096, 0))
	require.NoError(t, l.shutdown())
}

// syncing is a driver that waits for streams by their handles, as the cuda
// driver does (streamSyncer): sync says what each wait does.
type syncing struct {
	driver.Driver
	sync func(dev driver.DeviceID, stream uintptr) error
}

func (s *syncing) SyncStreamHandle(dev driver.DeviceID, stream uintptr) error {
	return s.sync(dev, stream)
}

// TestFreeWaitsForTheStream: on a driver that can, a free waits for the
// work of the stream it names, on the device it names, before it frees;
// a bad free waits for nothing; a wait that fails or panics frees
// nothing, is counted, and leaves the library usable.
func TestFreeWaitsForTheStream(t *testing.T) {
	l := newLibrary(testEnv(envDevices, "2"))
	p, err := l.alloc(0, 5000, 1)
	require.NoError(t, err)
	p0, err := l.alloc(0, 4096, 0) // device 0's backend is made before the driver is wrapped
	require.NoError(t, err)
	type wait struct {
		dev    driver.DeviceID
		stream uintptr
		live   int // allocations live while it waited
	}
	var waits []wait
	var fail error
	l.mu.Lock()
	l.d = &syncing{Driver: l.d, sync: func(dev driver.DeviceID, stream uintptr) error {
		// The library's lock is free in the wait: stats can be read.
		s := statsOf(t, l)
		waits = append(waits, wait{dev, stream, s.Devices[1].Tags[0].Live})
		if fail != nil {
			if fail.Error() == "panic" {
				panic("the wait broke")
			}
			return fail
		}
		return nil
	}}
	l.mu.Unlock()
	stats := func() statsJSON { return statsOf(t, l) }
	before := stats()

	// Bad frees wait for nothing.
	require.ErrorIs(t, l.freeOn(p+1, 0, 1, 0xabc), driver.ErrNotAllocated)
	require.ErrorIs(t, l.freeOn(p, 4999, 1, 0xabc), driver.ErrInvalid)
	require.ErrorIs(t, l.freeOn(p, 5000, 0, 0xabc), driver.ErrNotAllocated)
	require.Empty(t, waits)

	// A wait that fails, or panics, frees nothing.
	fail = errors.Wrap(driver.ErrDeviceFault, "the stream's kernel failed")
	err = l.freeOn(p, 5000, 1, 0xabc)
	require.ErrorIs(t, err, driver.ErrDeviceFault)
	require.ErrorContains(t, err, "wait for the work of stream 0xabc")
	fail = errors.New("panic")
	err = callFree(l, p, 5000, 1, 0xabc)
	require.ErrorContains(t, err, "the wait broke")
	require.Equal(t, codeOther, codeOf(err))
	after := stats()
	require.Equal(t, uint64(5), after.FreeErrors-before.FreeErrors)
	after.FreeErrors = before.FreeErrors
	require.Equal(t, before, after, "the failed frees changed nothing")

	// A good free waits on the caller's device (driver device 1 is
	// ordinal 1), for its stream, while p is still live.
	fail = nil
	waits = nil
	require.NoError(t, l.freeOn(p, 5000, 1, 0xabc))
	require.Equal(t, []wait{{1, 0xabc, 1}}, waits)
	require.Zero(t, stats().Devices[1].Tags[0].Live)
	require.NoError(t, l.freeOn(p0, 0, 0, 0))
	require.Equal(t, wait{0, 0, 0}, waits[1])
	require.NoError(t, l.check())
	require.NoError(t, l.shutdown())
}

// TestFreeOnAnUnusedDeviceMakesNothing: a free that names a device with
// no allocation yet is refused, and the device stays unused: no backend is
// made for it, so the stats do not list it.
func TestFreeOnAnUnusedDeviceMakesNothing(t *testing.T) {
	l := newLibrary(testEnv(envDevices, "2"))
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	stats := func() statsJSON { return statsOf(t, l) }
	before := stats()
	for _, size := range []uint64{0, 4096} {
		err := l.free(p, size, 1)
		require.ErrorIs(t, err, driver.ErrNotAllocated)
		require.Equal(t, codeInvalid, codeOf(err))
		require.ErrorContains(t, err, "libvmarena: ")
	}
	after := stats()
	require.Equal(t, uint64(2), after.FreeErrors-before.FreeErrors)
	after.FreeErrors = before.FreeErrors
	require.Equal(t, before, after, "the bad frees changed nothing")
	require.Nil(t, l.devs[1], "a free made device 1's backend")
	require.NoError(t, l.free(p, 4096, 0))
	require.NoError(t, l.shutdown())
}

// TestSizesTheDriverRefusesNameTheVariable: a capacity or tag maximum
// that parses but that the driver or the backend refuses (not a multiple
// of the granularity) fails the call with codeInvalid, naming the
// variable, as vmarena.h says of every bad value.
func TestSizesTheDriverRefusesNameTheVariable(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{envCapacity, "3MiB"},
		{envCapacity, "1"},
		{envTagMax, "4095"},
	} {
		l := newLibrary(testEnv(tc.name, tc.value))
		_, err := l.alloc(0, 4096, 0)
		require.Error(t, err, "%s=%s", tc.name, tc.value)
		require.Equal(t, codeInvalid, codeOf(err), "%v", err)
		require.ErrorContains(t, err, tc.name, "%s=%s", tc.name, tc.value)
		require.NoError(t, l.shutdown())
	}
}

// TestFailedFirstAllocMakesNothing: an allocation refused on a device that
// had none leaves the device unused, as a bad call leaves everything: its
// backend is closed again, so the stats do not list the device or the tag,
// and sleeping the tag is still no such tag.
func TestFailedFirstAllocMakesNothing(t *testing.T) {
	l := newLibrary(testEnv(envDevices, "2"))
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	id, err := l.tagID("kv")
	require.NoError(t, err)
	before, err := l.statsJSON()
	require.NoError(t, err)
	_, err = l.alloc(id, 17*int64(units.MiB), 1) // beyond the tag's max
	require.ErrorIs(t, err, driver.ErrOutOfMemory)
	after, err := l.statsJSON()
	require.NoError(t, err)
	require.JSONEq(t, string(before), string(after))
	require.Nil(t, l.devs[1])
	require.ErrorIs(t, l.sleep("kv", 0), driver.ErrInvalid)
	require.NoError(t, l.free(p, 4096, 0))
	require.NoError(t, l.shutdown())
}

// TestFileSleepNamesTheBackupDir: a file-mode sleep that cannot write
// under VMARENA_BACKUP_DIR fails naming the variable and its value, and
// leaves the tag awake.
func TestFileSleepNamesTheBackupDir(t *testing.T) {
	l := newLibrary(testEnv(envBackupDir, "/nonexistent/vmarena-backups"))
	p, err := l.alloc(0, 4096, 0)
	require.NoError(t, err)
	err = l.sleep("", int(modeFile))
	require.Error(t, err)
	require.ErrorContains(t, err, `VMARENA_BACKUP_DIR="/nonexistent/vmarena-backups"`)
	s := statsOf(t, l)
	require.False(t, s.Devices[0].Tags[0].Asleep)
	require.NoError(t, l.free(p, 4096, 0))
	require.NoError(t, l.shutdown())
}

// statsOf is l's stats JSON, decoded.
func statsOf(t testing.TB, l *library) statsJSON {
	t.Helper()
	js, err := l.statsJSON()
	require.NoError(t, err)
	var s statsJSON
	require.NoError(t, json.Unmarshal(js, &s))
	return s
}
