// Package backoff is the pause an accept loop takes after an accept
// fails for a while (out of file descriptors, a connection aborted in
// the backlog), as net/http's server takes it: 5 ms, doubling to 1 s,
// back to 5 ms after an accept that succeeds. Trying again at once would
// spin a core while the cause lasts; giving up would leave the listener
// serving no one after it.
package backoff

import "time"

const (
	first = 5 * time.Millisecond
	most  = time.Second
)

// Pause is an accept loop's pause; the zero value is ready.
type Pause struct{ d time.Duration }

// Wait waits the next pause, and reports false, at once, if done is
// closed first (the listener's owner closing it).
func (p *Pause) Wait(done <-chan struct{}) bool {
	t := time.NewTimer(p.next())
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}

// next is the next pause, which it makes the current one.
func (p *Pause) next() time.Duration {
	p.d = min(max(2*p.d, first), most)
	return p.d
}

// Reset starts the next pause from the first again.
func (p *Pause) Reset() { p.d = 0 }
