package physical

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/sim"
)

// TestNilArguments: a Memory made with a nil (or typed-nil) driver, a zero
// Memory and a zero Chunk answer with errors, never a panic; nothing of a
// real Memory changes meanwhile.
func TestNilArguments(t *testing.T) {
	for name, m := range map[string]*Memory{
		"New(nil)":   New(nil),
		"typed nil":  New((*sim.Driver)(nil)),
		"zero":       {},
		"nil iface ": New(driver.Driver(nil)),
	} {
		t.Run(name, func(t *testing.T) {
			require.Nil(t, m.Driver())
			requireIs(t, createErr(m.Create(0, gran, driver.ChunkOptions{})), driver.ErrInvalid, "physical: create", "the memory has no driver")
			requireIs(t, createErr(m.Import(driver.Shareable{}, 0)), driver.ErrInvalid, "physical: import", "no driver")
			requireIs(t, m.Close(), driver.ErrInvalid, "physical: close", "no driver")
			requireIs(t, m.Check(), driver.ErrInvalid, "no driver")
			_, err := m.Usage(0)
			requireIs(t, err, driver.ErrNoDevice)
			require.Empty(t, m.Chunks())
		})
	}
	require.Nil(t, (*Memory)(nil).Driver())

	real, d := newMemory(t)
	c, err := real.Create(0, gran, driver.ChunkOptions{})
	require.NoError(t, err)
	before := stateOf(t, real, d)

	zero := &Chunk{}
	require.True(t, zero.Released())
	require.Zero(t, zero.Mappings())
	requireIs(t, zero.Release(), driver.ErrBadHandle, "not made by Memory.Create")
	_, err = zero.Export()
	requireIs(t, err, driver.ErrBadHandle, "physical: export", "not made by Memory.Create")
	_, ok := zero.Exported()
	require.False(t, ok)
	requireIs(t, zero.SetAllowedPIDs(1), driver.ErrBadHandle, "not made by Memory.Create")
	require.False(t, zero.Allowed(1))
	require.Nil(t, zero.Memory())

	require.Equal(t, before, stateOf(t, real, d))
	require.NoError(t, real.Check())
	require.NoError(t, c.Release())
}
