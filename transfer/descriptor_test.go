package transfer_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/transfer"
)

func TestDescriptorRoundTrip(t *testing.T) {
	for _, d := range []transfer.Descriptor{
		{Engine: "127.0.0.1:5000", ID: 1, Gen: 2, Addr: 0x7f00_0000_0000, Len: 4096, Writable: true},
		{Engine: "h:1", ID: 9, Gen: 1 << 63, Addr: 4096, Len: 1, Key: []byte{1, 2, 3}},
	} {
		b, err := d.MarshalBinary()
		require.NoError(t, err)
		var got transfer.Descriptor
		require.NoError(t, got.UnmarshalBinary(b))
		require.Equal(t, d, got)
	}
	for _, d := range []transfer.Descriptor{{}, {Engine: "e", Len: 1}, {Engine: "e", ID: 1}, {Engine: "e", ID: 1, Len: 2, Addr: 1<<64 - 1},
		{Engine: "e", ID: 1, Len: 1, Key: make([]byte, 4097)}} {
		_, err := d.MarshalBinary()
		drivertest.RequireIs(t, err, driver.ErrInvalid, "transfer: marshal a descriptor")
	}
	// A refused unmarshal leaves the descriptor as it was.
	d := transfer.Descriptor{Engine: "keep", ID: 3, Len: 3}
	good, err := d.MarshalBinary()
	require.NoError(t, err)
	for _, b := range [][]byte{nil, good[:len(good)-1], append(good, 0), append([]byte("XXXX"), good[4:]...)} {
		got := d
		drivertest.RequireIs(t, got.UnmarshalBinary(b), driver.ErrInvalid, "transfer: unmarshal a descriptor")
		require.Equal(t, d, got)
	}
	drivertest.RequireIs(t, (*transfer.Descriptor)(nil).UnmarshalBinary(good), driver.ErrInvalid)
}

// FuzzDescriptor: UnmarshalBinary never panics, refuses with ErrInvalid
// and leaves the descriptor as it was, or accepts bytes that
// MarshalBinary writes back exactly.
func FuzzDescriptor(f *testing.F) {
	for _, d := range []transfer.Descriptor{
		{Engine: "127.0.0.1:5000", ID: 1, Gen: 2, Addr: 0x7f00_0000_0000, Len: 4096, Writable: true},
		{Engine: "h:1", ID: 9, Gen: 1 << 63, Addr: 4096, Len: 1, Key: []byte{1, 2, 3}},
	} {
		b, err := d.MarshalBinary()
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		was := transfer.Descriptor{Engine: "was", ID: 1, Len: 1}
		d := was
		if err := d.UnmarshalBinary(b); err != nil {
			require.ErrorIs(t, err, driver.ErrInvalid)
			require.Equal(t, was, d)
			return
		}
		out, err := d.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, b, out)
	})
}
