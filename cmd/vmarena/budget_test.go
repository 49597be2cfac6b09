package main

import (
	"os"
	"testing"
)

// TestMain serves as one server of vmarena budget simulate when the
// simulation re-executes this test binary, as main does.
func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		os.Exit(serveBudget(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}
