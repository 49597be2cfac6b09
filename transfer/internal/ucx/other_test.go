//go:build !(ucx && linux && cgo)

package ucx

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
)

// TestUnavailable: a build without the ucx tag has the API, and every call
// answers ErrUnsupported.
func TestUnavailable(t *testing.T) {
	require.False(t, Available)
	w, err := NewWorker(true)
	require.ErrorIs(t, err, driver.ErrUnsupported)
	require.Nil(t, w)
	require.Contains(t, err.Error(), "ucx: NewWorker")
}
