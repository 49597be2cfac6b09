package transfer_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/transfer"
)

// fdFloodEnv runs this test binary as runFDFlood's child: the test
// lowers the process's file descriptor limit, which no other test may
// share.
const fdFloodEnv = "VMARENA_TRANSFER_FD_FLOOD"

// TestAcceptSurvivesDescriptorExhaustion: peers that connect until the
// process has no file descriptor left make the engine's accept fail
// (EMFILE) for as long as they hold on; once they are gone the engine
// serves a new peer's hello again (it had stopped accepting for good).
// It runs in a child process, which lowers its own limit.
func TestAcceptSurvivesDescriptorExhaustion(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fdFloodEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "served again after")
}

// runFDFlood is the child's side: an engine, the descriptor limit
// lowered to a few past those open, connections until dials fail, then
// all closed and the limit restored, and a good hello answered.
func runFDFlood() error {
	e, err := transfer.New(transfer.Config{LeaseTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer e.Close()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		return err
	}
	open, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	low := old
	low.Cur = uint64(len(open) + 20)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		return err
	}
	var held []net.Conn
	for range 60 { // each costs two descriptors here, the dial's and the accept's
		c, err := net.DialTimeout("tcp", e.Addr(), time.Second)
		if err != nil {
			continue
		}
		_, _ = c.Write(hello())
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond) // the engine's accepts meet the limit meanwhile
	for _, c := range held {
		_ = c.Close()
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		return err
	}
	const tries = 30 // the engine pauses at most a second between accepts
	for try := 1; try <= tries; try++ {
		if answered(e.Addr()) {
			fmt.Printf("served again after %d tries (%d connections held)\n", try, len(held))
			return nil
		}
	}
	return fmt.Errorf("the engine answered no hello in %d tries after the flood (%d connections held)", tries, len(held))
}

// hello is a tcp initiator's hello frame.
func hello() []byte { return helloFrame(wireVersion, "tcp") }

// answered reports whether a hello to addr is answered with status 0
// within 10 s (a liveness bound, not a timing: an engine that accepts
// answers at once).
func answered(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		time.Sleep(50 * time.Millisecond)
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(hello()); err != nil {
		return false
	}
	var h [8]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return false
	}
	return h[0] == 0 && binary.BigEndian.Uint32(h[4:]) > 0
}
