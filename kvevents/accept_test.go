package kvevents

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// failingListener's Accept fails with EMFILE, as a process out of file
// descriptors does, noting when each call came.
type failingListener struct {
	mu    sync.Mutex
	calls []time.Time
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls = append(l.calls, time.Now())
	l.mu.Unlock()
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
}
func (l *failingListener) Close() error   { return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{} }

func (l *failingListener) times() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.calls...)
}

// TestAcceptPausesOnErrors: an accept that keeps failing (no file
// descriptor left) is tried again after a pause that doubles from 5 ms,
// not at once in a loop that spins a core, and Close ends the pause.
func TestAcceptPausesOnErrors(t *testing.T) {
	p := &Publisher{peers: map[*peer]struct{}{}, quit: make(chan struct{})}
	ln := &failingListener{}
	p.wg.Add(1)
	go p.accept(ln, true)
	for len(ln.times()) < 5 {
		time.Sleep(time.Millisecond)
	}
	p.mu.Lock()
	p.closed = true
	close(p.quit)
	p.mu.Unlock()
	p.wg.Wait()
	calls := ln.times()
	for i, want := 1, 5*time.Millisecond; i < 5; i, want = i+1, 2*want {
		require.GreaterOrEqual(t, calls[i].Sub(calls[i-1]), want, "the pause before try %d", i+1)
	}
	require.Zero(t, p.Stats().Refused)
}
