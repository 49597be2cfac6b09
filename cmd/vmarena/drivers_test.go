package main

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/acl"
	"github.com/vmarena/vmarena/driver/acl/acltest"
	"github.com/vmarena/vmarena/driver/cuda"
	"github.com/vmarena/vmarena/driver/cuda/cudatest"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// standinCUDA opens a CUDA stand-in of devices GPUs of 64 MiB, granularity
// 2 MiB, and returns the path of its library. The test fails at its end if
// the command left anything on the stand-in.
func standinCUDA(t *testing.T, devices int) string {
	t.Helper()
	return standinCUDAConfig(t, cudatest.Config{Devices: devices})
}

// standinCUDAConfig is standinCUDA with cfg's devices and features.
func standinCUDAConfig(t *testing.T, cfg cudatest.Config) string {
	t.Helper()
	cfg.Capacity, cfg.MinGranularity, cfg.RecommendedGranularity = 64*units.MiB, 2*units.MiB, 2*units.MiB
	_, lib := cudatest.Open(t, cfg, cuda.Options{})
	return lib.Path()
}

// standinACL opens an AscendCL stand-in of devices NPUs of 64 MiB,
// granularity 2 MiB, and returns the path of its library; the test fails
// at its end if the command left anything on it.
func standinACL(t *testing.T, devices int) string {
	t.Helper()
	cfg := acltest.Config{Devices: devices, Capacity: 64 * units.MiB, MinGranularity: 2 * units.MiB, RecommendedGranularity: 2 * units.MiB}
	_, lib := acltest.Open(t, cfg, acl.Options{})
	return lib.Path()
}

// steps counts the demo's numbered steps.
func steps(s string) int { return len(regexp.MustCompile(`(?m)^\d+\. `).FindAllString(s, -1)) }

// TestDevices: every driver has a section, and one that cannot run here
// says why in one line, which is not an error.
func TestDevices(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent")
	code, out, errOut := runCmd(t, "devices", "--cuda-library", missing+"/libcuda.so.1", "--acl-library", missing+"/libascendcl.so")
	require.Equal(t, 0, code, errOut)
	require.Empty(t, errOut)
	flat := flatten(out)
	require.Regexp(t, `(?m)^host: logical devices on this machine's memory; by default 1, sharing half of MemAvailable$`, flat)
	require.Regexp(t, `(?m)^device capacity min granularity recommended granularity NUMA node\n0 \d+ \S+ 2 MiB 2 MiB (-|\d+)$`, flat)
	require.Contains(t, flat, "\nsim: simulates whatever is asked, with no memory behind it; by default 1 device of 80 GiB, granularity 2 MiB\n")
	require.Regexp(t, `(?m)^cuda: unavailable: cuda: no NVIDIA driver found: cannot load .*absent/libcuda.so.1: .*$`, flat)
	require.Regexp(t, `(?m)^acl: unavailable: acl: no Ascend runtime found: cannot load .*absent/libascendcl.so: .*$`, flat)

	// With the default libraries, whatever this machine has: each vendor
	// section lists devices or says why not.
	code, out, errOut = runCmd(t, "devices")
	require.Equal(t, 0, code, errOut)
	for _, v := range []string{"cuda", "acl"} {
		require.Regexp(t, `(?m)^`+v+`: (unavailable: \S.*|\S+, .*devices?)$`, out)
	}
}

func TestDevicesFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--bogus"}, "vmarena devices: flag provided but not defined: -bogus"},
		{[]string{"--cuda-library"}, "vmarena devices: flag needs an argument: -cuda-library"},
		{[]string{"extra"}, `vmarena devices: unexpected argument "extra"`},
	} {
		code, out, errOut := runCmd(t, append([]string{"devices"}, tc.args...)...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out)
		require.Contains(t, errOut, tc.says)
		require.Equal(t, 2, strings.Count(errOut, "\n"), "one line and the hint: %q", errOut)
	}
	code, out, _ := runCmd(t, "devices", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: vmarena devices")
	require.Contains(t, out, "-cuda-library")
}

// TestDevicesCUDA lists the stand-in's GPUs as cuda.Probe reports them.
func TestDevicesCUDA(t *testing.T) {
	lib := standinCUDA(t, 2)
	code, out, errOut := runCmd(t, "devices", "--cuda-library", lib)
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "\ncuda: "+lib+", driver version ")
	require.Contains(t, flat, ", 2 devices\nordinal name memory VMM POSIX fd export pools min granularity recommended granularity\n")
	require.Regexp(t, `(?m)^0 .+ 64\.00 MiB yes yes yes 2 MiB 2 MiB\n1 .+ 64\.00 MiB yes yes yes 2 MiB 2 MiB$`, flat)
	require.NotContains(t, flat, "cuda: unavailable")
}

// TestDevicesACL lists the stand-in's NPUs as acl.Probe reports them.
func TestDevicesACL(t *testing.T) {
	lib := standinACL(t, 2)
	code, out, errOut := runCmd(t, "devices", "--acl-library", lib)
	require.Equal(t, 0, code, errOut)
	flat := flatten(out)
	require.Contains(t, flat, "\nacl: "+lib+", 2 devices\n")
	require.Regexp(t, `(?m)^0 .+ #0 64\.00 MiB 64\.00 MiB 2 MiB 2 MiB\n1 .+ #1 64\.00 MiB 64\.00 MiB 2 MiB 2 MiB$`, flat)
	require.NotContains(t, flat, "acl: unavailable")
}

// TestDemoSim: on the sim driver every step runs but those that move
// bytes, which say why they are skipped; the refusals are the same.
func TestDemoSim(t *testing.T) {
	code, out, errOut := runCmd(t, "demo", "--driver", "sim")
	require.Equal(t, 0, code, errOut)
	flat := strings.Join(strings.Fields(out), " ")
	require.Contains(t, flat, "vmarena demo: sim driver, 2 devices of 64 MiB with no memory behind them, granularity 2 MiB")
	require.Contains(t, flat, "skipped: the write and the read: the sim driver has no memory behind its ranges (no host-access)")
	require.Contains(t, flat, "skipped: the read through the alias")
	require.Contains(t, flat, "skipped: writing at offset 0x200000 before the move and reading it after")
	for _, want := range []string{
		"0x0 2 MiB accessible 0 1 +0x0 dev0:read-write dev1:read",
		"device 1 has read access at",
		"is not mapped: not mapped",
		"out of memory",
		"device 0 has no access at",
		"device 0: 0 B used (peak 4 MiB) of 64 MiB; device 1: 0 B used (peak 2 MiB) of 64 MiB",
		"trim: committed 12 MiB -> 6 MiB",
		"stitches 1",
		"offset size device 0x0 6 MiB 0 0x600000 2 MiB 1",
	} {
		require.Contains(t, flat, want)
	}
	require.NotContains(t, out, "kernel mappings", "the kernel's view is the host driver's alone")
	require.NotContains(t, out, "expected a refusal")
	require.Equal(t, 14, steps(out), out)
}

// TestDemoCUDA runs the demo on the CUDA driver over the stand-in: two
// GPUs, every step; one GPU, the second device's parts skipped. Either way
// it frees everything it made (cudatest checks the stand-in at the end).
func TestDemoCUDA(t *testing.T) {
	t.Run("two devices", func(t *testing.T) {
		lib := standinCUDA(t, 2)
		code, out, errOut := runCmd(t, "demo", "--driver", "cuda", "--library", lib)
		require.Equal(t, 0, code, errOut)
		flat := strings.Join(strings.Fields(out), " ")
		require.Regexp(t, `^vmarena demo: cuda driver, 2 devices \(.+\), 64 MiB of each for the demo, granularity 2 MiB `, flat)
		for _, want := range []string{
			`device 1 reads it back: "hello from device 0"`,
			`Device 1 reads "hello from device 0" through the alias`,
			"0x800000000 2 MiB accessible 0 1 +0x0 dev1:read",
			"out of memory",
			"device 0: 0 B used (peak 4 MiB) of 64 MiB; device 1: 0 B used (peak 2 MiB) of 64 MiB",
			"by mapping 3 scattered free chunks side by side (1 map event)",
			`offset 0x200000 still reads "written before the move"`,
		} {
			require.Contains(t, flat, want)
		}
		require.NotContains(t, out, "skipped")
		require.NotContains(t, out, "kernel mappings")
		require.NotContains(t, out, "expected a refusal")
		require.Equal(t, 14, steps(out), out)
	})
	t.Run("two devices, not peers", func(t *testing.T) {
		lib := standinCUDAConfig(t, cudatest.Config{Devices: 2, NoPeer: true})
		code, out, errOut := runCmd(t, "demo", "--driver", "cuda", "--library", lib)
		require.Equal(t, 0, code, errOut)
		flat := strings.Join(strings.Fields(out), " ")
		why := "devices 0 and 1 of the cuda driver cannot reach each other's memory (no peer access)"
		for _, want := range []string{
			"Create 4 MiB and 2 MiB on device 0 and map them side by side",
			"skipped: device 1's read access over the first: " + why,
			"skipped: the striped arena: " + why,
		} {
			require.Contains(t, flat, want)
		}
		require.NotContains(t, out, "expected a refusal")
		require.Equal(t, 14, steps(out), out)
	})
	t.Run("one device", func(t *testing.T) {
		lib := standinCUDA(t, 1)
		code, out, errOut := runCmd(t, "demo", "--driver", "cuda", "--library", lib)
		require.Equal(t, 0, code, errOut)
		flat := strings.Join(strings.Fields(out), " ")
		for _, want := range []string{
			"vmarena demo: cuda driver, 1 device (",
			"Create 4 MiB and 2 MiB on device 0 and map them side by side",
			"skipped: device 1's read access over the first: the cuda driver has one device",
			`Device 0 writes "hello from device 0" at the base and reads it back: "hello from device 0"`,
			`Device 0 reads "hello from device 0" through the alias`,
			"skipped: the striped arena: the cuda driver has one device",
		} {
			require.Contains(t, flat, want)
		}
		require.NotContains(t, out, "expected a refusal")
		require.Equal(t, 14, steps(out), out)
	})
}

func TestDemoFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"extra"}, `vmarena demo: unexpected argument "extra"`},
		{[]string{"--driver", "gpu"}, `invalid value "gpu" for flag -driver: unknown driver "gpu", want host, sim, cuda or acl`},
		{[]string{"--library", "/x/libcuda.so.1"}, "--library is for --driver cuda or acl; the host driver loads no library"},
		{[]string{"--driver", "sim", "--library", "/x/libcuda.so.1"}, "the sim driver loads no library"},
		{[]string{"--bogus"}, "flag provided but not defined: -bogus"},
	} {
		code, out, errOut := runCmd(t, append([]string{"demo"}, tc.args...)...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out)
		require.Contains(t, errOut, tc.says)
		require.Equal(t, 2, strings.Count(errOut, "\n"), "one line and the hint: %q", errOut)
	}
	code, out, _ := runCmd(t, "demo", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: vmarena demo [--driver host|sim|cuda|acl]")

	// A vendor driver that cannot run here is a failure that says why.
	code, out, errOut := runCmd(t, "demo", "--driver", "cuda", "--library", filepath.Join(t.TempDir(), "libcuda.so.1"))
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "vmarena demo: cuda: no NVIDIA driver found: cannot load")
}

// handmadeOnDevices are the figures of the hand-written two-device trace
// that TestReplay checks on the sim driver: on any driver whose devices
// hold it, the allocator does the same.
var handmadeOnDevices = []string{
	"\nallocs / frees replayed 4 / 3 4 / 2\n",
	"\nPyTorch out of memory at (vmarena) line 20 (seq 18): not served line 19 (seq 17): served\n",
	"\npeak committed (vmarena) 18.00 MiB 32.00 MiB\n",
	"\ncommitted / allocated (vmarena) 1.1250 1.0667\n",
	"\nchunk maps (driver calls) 7 11\n",
	"\nstitches 0 0\n",
}

// TestReplayOnDevices replays the hand-written trace on the host driver and
// on the CUDA driver over the stand-in: the same figures as on sim, each
// device's capacity in the table; and a trace larger than the devices
// fails, saying so.
// TestDemoACL runs the demo on the AscendCL driver over the stand-in: two
// NPUs, every step, and everything it made freed (acltest checks). AscendCL
// binds a reservation to one NPU's memory, so the parts that map a second
// NPU's chunks in the demo's ranges are skipped, saying why.
func TestDemoACL(t *testing.T) {
	lib := standinACL(t, 2)
	code, out, errOut := runCmd(t, "demo", "--driver", "acl", "--library", lib)
	require.Equal(t, 0, code, errOut)
	flat := strings.Join(strings.Fields(out), " ")
	require.Regexp(t, `^vmarena demo: acl driver, 2 devices \(.+\), 64 MiB of each for the demo, granularity 2 MiB `, flat)
	for _, want := range []string{
		"out of memory",
		"skipped: the striped arena: the acl driver binds a reservation to one device's memory (AscendCL)",
	} {
		require.Contains(t, flat, want)
	}
	require.NotContains(t, out, "expected a refusal")
	require.Equal(t, 14, steps(out), out)
}

func TestReplayOnDevices(t *testing.T) {
	handmade := filepath.Join(traceDir, "handmade_two_devices.csv")
	large := filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv") // peaks at 1018.85 MiB allocated
	check := func(t *testing.T, out, header, capacities string) {
		t.Helper()
		flat := flatten(out)
		require.True(t, strings.HasPrefix(flat, header), flat)
		require.Contains(t, flat, "\ntrace handmade_two_devices [dev 0] handmade_two_devices [dev 1]\n"+capacities+"\n")
		for _, want := range handmadeOnDevices {
			require.Contains(t, flat, want)
		}
		// Only the sim driver counts and prices its calls; PyTorch's
		// calls are the trace's, and are counted all the same.
		for _, want := range []string{
			"\ndriver calls (vmarena): create / map / set access / unmap / release n/a n/a\n",
			"\ndriver calls (PyTorch, modelled): create / map / set access / unmap / release 3 / 3 / 3 / 1 / 1 4 / 4 / 4 / 1 / 1\n",
			"\naddress reserves / frees (vmarena, all the trace's devices) n/a n/a\n",
			"\nmodelled driver time on A100 (vmarena) n/a n/a\n",
			"\nmodelled driver time on A100 (PyTorch) 717.91 µs 948.67 µs\n",
			"\nmodelled driver time on A100, vmarena ÷ PyTorch n/a n/a\n",
			"\nmodelled driver time on H100 (vmarena) n/a n/a\n",
			"\ntarget: modelled driver time ≤ PyTorch's n/a n/a\n",
		} {
			require.Contains(t, flat, want)
		}
		require.NotContains(t, flat, "priced by")
	}

	t.Run("host", func(t *testing.T) {
		code, out, errOut := runReplay(t, "--driver", "host", "--capacity", "64MiB", "--trace", handmade)
		require.Equal(t, 0, code, errOut)
		check(t, out, "vmarena replay: host driver (host0, host1), one device per trace device, granularity 2 MiB, allocator policy default, stitching on, slack live/256\n",
			"device capacity (host) 64 MiB 64 MiB")

		code, out, errOut = runReplay(t, "--driver", "host", "--capacity", "64MiB", "--trace", large)
		require.Equal(t, 1, code)
		require.Contains(t, out, "select_n_snapshot_v1f2f548 (stopped after ", "the table shows what was replayed")
		require.Contains(t, errOut, "select_n_snapshot_v1f2f548.csv: the trace does not fit in the host driver's devices of 64 MiB: replay: line ")
		require.Contains(t, errOut, "out of memory")
	})

	t.Run("cuda", func(t *testing.T) {
		lib := standinCUDA(t, 2)
		code, out, errOut := runReplay(t, "--driver", "cuda", "--library", lib, "--trace", handmade)
		require.Equal(t, 0, code, errOut)
		check(t, out, "vmarena replay: cuda driver (", "device capacity (cuda) 64 MiB 64 MiB")

		// --capacity caps the GPUs' own.
		code, out, errOut = runReplay(t, "--driver", "cuda", "--library", lib, "--capacity", "40MiB", "--trace", handmade)
		require.Equal(t, 0, code, errOut)
		check(t, out, "vmarena replay: cuda driver", "device capacity (cuda) 40 MiB 40 MiB")

		code, out, errOut = runReplay(t, "--driver", "cuda", "--library", lib, "--trace", large)
		require.Equal(t, 1, code)
		require.Contains(t, out, "select_n_snapshot_v1f2f548 (stopped after ", "the table shows what was replayed")
		require.Contains(t, errOut, "select_n_snapshot_v1f2f548.csv: the trace does not fit in the cuda driver's devices of 64 MiB: replay: line ")
	})

	t.Run("acl", func(t *testing.T) {
		lib := standinACL(t, 2)
		code, out, errOut := runReplay(t, "--driver", "acl", "--library", lib, "--trace", handmade)
		require.Equal(t, 0, code, errOut)
		check(t, out, "vmarena replay: acl driver (", "device capacity (acl) 64 MiB 64 MiB")
	})

	t.Run("cuda, one device", func(t *testing.T) {
		lib := standinCUDA(t, 1)
		code, out, errOut := runReplay(t, "--driver", "cuda", "--library", lib, "--trace", handmade)
		require.Equal(t, 1, code)
		require.Empty(t, out)
		require.Contains(t, errOut, "handmade_two_devices.csv: the trace names 2 devices and the cuda driver has 1 device")
	})
}

func TestReplayDriverFlags(t *testing.T) {
	small := filepath.Join(traceDir, "select_n_snapshot_v1f2f548.csv")
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--trace", small, "--driver", "gpu"}, `invalid value "gpu" for flag -driver: unknown driver "gpu", want host, sim, cuda or acl`},
		{[]string{"--trace", small, "--library", "/x/libcuda.so.1"}, "--library is for --driver cuda or acl; the sim driver loads no library"},
	} {
		code, out, errOut := runReplay(t, tc.args...)
		require.Equal(t, 2, code, "%v", tc.args)
		require.Empty(t, out)
		require.Contains(t, errOut, tc.says)
		require.Contains(t, errOut, "\nrun 'vmarena replay --help' for usage\n")
	}
	code, out, errOut := runReplay(t, "--trace", small, "--driver", "cuda", "--library", filepath.Join(t.TempDir(), "libcuda.so.1"))
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "vmarena replay: "+small+": cuda: no NVIDIA driver found: cannot load")
}

// TestFirstDevices: the first want devices of a probe, the largest
// granularity among them, and ErrNoDevice for a probe that found none.
func TestFirstDevices(t *testing.T) {
	devs := []cuda.DeviceReport{{Ordinal: 3, MinGranularity: 2 * units.MiB}, {Ordinal: 5, MinGranularity: 4 * units.MiB}, {Ordinal: 7, MinGranularity: 8 * units.MiB}}
	pick := func(d cuda.DeviceReport) (int, uint64) { return d.Ordinal, d.MinGranularity }
	ids, gran, err := firstDevices(devs, 2, pick)
	require.NoError(t, err)
	require.Equal(t, []int{3, 5}, ids)
	require.Equal(t, 4*units.MiB, gran, "the largest of the two picked, not of all")
	ids, _, err = firstDevices(devs, 9, pick)
	require.NoError(t, err)
	require.Equal(t, []int{3, 5, 7}, ids, "all of them when there are fewer than wanted")
	_, _, err = firstDevices(nil, 2, pick)
	drivertest.RequireIs(t, err, driver.ErrNoDevice)
}
