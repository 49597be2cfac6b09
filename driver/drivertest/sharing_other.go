//go:build !linux

package drivertest

import (
	"testing"

	"github.com/vmarena/vmarena/driver"
)

// closeLater has nothing to close: no driver shares descriptors here.
func (f *fixture) closeLater(driver.Shareable) {}

// sharingDescriptors: the rules of shared descriptors need Linux's memfds
// to test (sharing_linux.go).
func (s suite) sharingDescriptors(t *testing.T) {
	t.Run("Descriptors", func(t *testing.T) { t.Skip("descriptor rules are tested on Linux") })
}
