package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// devices checks what a driver reports about itself before any call.
func (s suite) devices(t *testing.T) {
	s.run(t, "NameNotEmpty", func(f *fixture) {
		require.NotEmpty(f.t, f.d.Name())
	})
	s.run(t, "CountInRange", func(f *fixture) {
		require.NotEmpty(f.t, f.devs)
		require.LessOrEqual(f.t, len(f.devs), driver.MaxDevices)
	})
	s.run(t, "IDIsIndex", func(f *fixture) {
		for i, d := range f.devs {
			require.Equal(f.t, driver.DeviceID(i), d.ID, "Devices()[%d].ID", i)
		}
	})
	s.run(t, "MinGranularityPowerOfTwo", func(f *fixture) {
		for _, d := range f.devs {
			g := d.MinGranularity
			require.Truef(f.t, g != 0 && g&(g-1) == 0, "device %d: MinGranularity %d is not a power of two", d.ID, g)
		}
	})
	s.run(t, "RecommendedGranularityMultipleOfMin", func(f *fixture) {
		for _, d := range f.devs {
			require.NotZero(f.t, d.RecommendedGranularity, "device %d: RecommendedGranularity", d.ID)
			require.Zerof(f.t, d.RecommendedGranularity%d.MinGranularity,
				"device %d: RecommendedGranularity %d is not a multiple of MinGranularity %d",
				d.ID, d.RecommendedGranularity, d.MinGranularity)
		}
	})
	s.run(t, "GranularityIsLargestMin", func(f *fixture) {
		var largest uint64
		for _, d := range f.devs {
			largest = max(largest, d.MinGranularity)
		}
		require.Equal(f.t, largest, f.d.Granularity())
	})
	s.run(t, "ReturnsCopy", func(f *fixture) {
		before := append([]driver.Device(nil), f.d.Devices()...)
		mine := f.d.Devices()
		for i := range mine {
			mine[i] = driver.Device{ID: 99, Name: "mutated", Capacity: 1, MinGranularity: 3}
		}
		require.Equal(f.t, before, f.d.Devices(), "mutating the slice Devices returned changed the driver's devices")
		// The driver still works from its own copy.
		base := f.reserve(f.gran)
		f.mapNew(base, 0, f.gran)
		f.requireNone(base)
	})
}
