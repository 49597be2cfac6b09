package kvcache

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/internal/units"
)

// TestWindowConfigRefusals: a Window or Ring New cannot hold is refused
// naming the field, and reserves nothing.
func TestWindowConfigRefusals(t *testing.T) {
	e := hostEnv(t, 16*units.MiB)
	good := tinyConfig(PerLayer, 64, 2)
	for _, c := range []struct {
		name     string
		change   func(*Config)
		sentinel error
		mentions string
	}{
		{"negative window", func(c *Config) { c.Window = -1 }, driver.ErrInvalid, "Window -1"},
		{"window past context", func(c *Config) { c.Window = 65 }, driver.ErrInvalid, "MaxContext 64"},
		{"ring without window", func(c *Config) { c.Ring = true }, driver.ErrInvalid, "Ring"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.change(&cfg)
			_, err := New(e.space, e.mem, cfg)
			drivertest.RequireIs(t, err, c.sentinel, c.mentions)
			require.Empty(t, e.space.Reservations())
		})
	}
}
