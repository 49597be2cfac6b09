// Package sentinel marks an error with a sentinel so that errors.Is finds
// it, the standard library's and any other that walks Unwrap and asks an
// error's Is method (internal/errors', github.com/cockroachdb/errors' in a
// user's program). Mark keeps the marked error's message and its chain
// (a system call's errno stays reachable with errors.Is and errors.As);
// the sentinel is matched by an Is method, which both packages call.
package sentinel

// Mark returns err marked with s: errors.Is(Mark(err, s), s) is true with
// either errors package, and so is errors.Is(Mark(err, s), t) for every t
// in err's own chain. The message is err's. A nil err stays nil; a nil s
// returns err unchanged.
func Mark(err, s error) error {
	if err == nil || s == nil {
		return err
	}
	return &marked{err: err, sentinel: s}
}

// marked is err with one more sentinel; sentinel is comparable (the
// module's sentinels are pointers made by errors.New).
type marked struct {
	err      error
	sentinel error
}

func (m *marked) Error() string { return m.err.Error() }

// Unwrap keeps err's chain walkable by errors.Is and errors.As.
func (m *marked) Unwrap() error { return m.err }

// Is reports whether target is the sentinel: both errors packages ask an
// error's Is method before unwrapping it.
func (m *marked) Is(target error) bool { return target == m.sentinel }
