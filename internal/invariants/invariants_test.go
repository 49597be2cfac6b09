package invariants

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFail(t *testing.T) {
	require.NotPanics(t, func() { Fail("grow", nil) })
	require.PanicsWithValue(t, "invariants: after grow: broken", func() { Fail("grow", errors.New("broken")) })
}
