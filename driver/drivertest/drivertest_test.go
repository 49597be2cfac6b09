package drivertest

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/internal/ledger"
	"github.com/vmarena/vmarena/internal/extent"
	"github.com/vmarena/vmarena/internal/units"
)

// TestMixedGranularity runs the suite against a ledger whose devices have
// different minimum granularities, which neither sim nor host offers: the
// suite must hold chunks, mappings and access ranges to each device's own
// granularity and reservations to the largest.
func TestMixedGranularity(t *testing.T) {
	for _, grans := range [][]uint64{
		{4 * units.KiB, 64 * units.KiB},
		{64 * units.KiB, 4 * units.KiB, 16 * units.KiB},
	} {
		t.Run(units.Bytes(grans[0])+"-first", func(t *testing.T) {
			Run(t, func(t *testing.T) driver.Driver {
				devs := make([]driver.Device, len(grans))
				for i, g := range grans {
					devs[i] = driver.Device{
						ID: driver.DeviceID(i), Name: "mixed", Kind: driver.KindSim,
						Capacity: 512 * units.KiB, MinGranularity: g, RecommendedGranularity: g, NUMANode: -1,
					}
				}
				l, err := ledger.New("mixed", devs, &space{extent.New(1<<40, 1<<46)}, false)
				require.NoError(t, err)
				t.Cleanup(func() {
					if err := ledger.TearDown(l); err != nil {
						t.Errorf("close: %v", err)
					}
				})
				return mixed{l}
			})
		})
	}
}

// mixed is a bookkeeping-only driver over a ledger, like sim.
type mixed struct{ *ledger.Ledger }

func (mixed) Name() string                 { return "mixed" }
func (mixed) Supports(driver.Feature) bool { return false }

func (m mixed) Read(addr driver.Addr, p []byte) error  { return m.touch("read", addr, p) }
func (m mixed) Write(addr driver.Addr, p []byte) error { return m.touch("write", addr, p) }

func (m mixed) touch(op string, addr driver.Addr, p []byte) error {
	return m.WithRange(op, addr, uint64(len(p)), driver.AccessNone, func(*ledger.Region) error {
		return errors.Wrap(driver.ErrUnsupported, "no memory behind the mixed driver")
	})
}

// space is a ledger backend that hands out numbers and does nothing else.
type space struct{ free *extent.Set }

func (s *space) Reserve(size, align uint64, _ driver.Addr) (driver.Addr, any, error) {
	at, ok := s.free.Alloc(size, align)
	if !ok {
		return 0, nil, errors.Wrapf(driver.ErrOutOfMemory, "no free range of %s", units.Bytes(size))
	}
	return driver.Addr(at), nil, nil
}

func (s *space) Unreserve(r *ledger.Region) error { return s.free.Free(uint64(r.Base), r.Size) }
func (s *space) Commit(*ledger.Chunk) error       { return nil }
func (s *space) Free(*ledger.Chunk) error         { return nil }
func (s *space) Map(*ledger.Mapping) error        { return nil }
func (s *space) Unmap(*ledger.Mapping) error      { return nil }
func (s *space) Close() error                     { return nil }

func (s *space) Protect(*ledger.Region, driver.Addr, uint64, driver.Access, driver.Access) error {
	return nil
}
