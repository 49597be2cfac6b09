//go:build !linux

package transfer_test

import "errors"

// fdFloodEnv names the Linux child of TestAcceptSurvivesDescriptorExhaustion.
const fdFloodEnv = "VMARENA_TRANSFER_FD_FLOOD"

func runFDFlood() error { return errors.New("the descriptor flood runs on Linux") }
