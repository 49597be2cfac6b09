// Package progress shows how far long work has got (a replay of a large
// trace, a serving simulation, a benchmark run) as a bar on a terminal,
// and writes nothing anywhere else: a log, a pipe or a test's buffer
// stays as it would be without it.
//
// It owns the bar's line on the writer while the bar runs; it must never
// decide what work is done or how often it is counted: callers update it
// every so many items, never per item, so that a bar costs nothing
// measurable in the loop it watches. Every method is safe on a nil *Bar,
// which is what New returns when there is nothing to show, so callers
// need no branch of their own.
package progress

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Options configure a bar beyond New's arguments.
type Options struct {
	// Terminal shows the bar on any writer, terminal or not: for tests,
	// which have no terminal.
	Terminal bool
	// Throttle is the least time between two redraws (0: 100 ms). The
	// bar is always drawn when it reaches its total.
	Throttle time.Duration
}

// Bar is a progress bar on one writer. A nil *Bar shows nothing.
type Bar struct {
	// mu guards ended; the bar below has a lock of its own.
	mu    sync.Mutex
	ended bool // Done or Close has ended the bar's line
	bar   *progressbar.ProgressBar
	// spinner says the total is unknown: the library then redraws from a
	// goroutine of its own until the bar is finished, so Close finishes
	// it rather than leave that goroutine running.
	spinner bool
}

// IsTerminal says whether w is an *os.File on a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && f != nil && term.IsTerminal(int(f.Fd()))
}

// New returns a bar counting to total on w, labelled with description,
// when w is a terminal, and nil (a bar that shows nothing) otherwise. A
// total below 1 is a count of unknown length (a spinner).
func New(w io.Writer, total int64, description string) *Bar {
	return NewWithOptions(w, total, description, Options{})
}

// NewWithOptions is New with options: with Terminal set, the bar is
// shown on w whatever w is.
func NewWithOptions(w io.Writer, total int64, description string, opts Options) *Bar {
	if w == nil || (!opts.Terminal && !IsTerminal(w)) {
		return nil
	}
	if total < 1 {
		total = -1
	}
	if opts.Throttle <= 0 {
		opts.Throttle = 100 * time.Millisecond
	}
	b := &Bar{spinner: total < 0}
	b.bar = progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(description),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(opts.Throttle),
		progressbar.OptionSetRenderBlankState(true),
		// The bar ends its own line when it reaches its total; Close ends
		// it where it stands otherwise.
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	return b
}

// Set moves the bar to n of its total.
func (b *Bar) Set(n int64) {
	if b == nil {
		return
	}
	_ = b.bar.Set64(n) // a bar that cannot draw changes nothing else
}

// Add moves the bar on by n.
func (b *Bar) Add(n int64) {
	if b == nil {
		return
	}
	_ = b.bar.Add64(n)
}

// Describe changes the bar's label.
func (b *Bar) Describe(description string) {
	if b == nil {
		return
	}
	b.bar.Describe(description)
}

// Done fills the bar to its total and ends its line. Once Done or Close
// has run, the bar shows nothing more.
func (b *Bar) Done() {
	if b == nil || !b.end() {
		return
	}
	if !b.bar.IsFinished() {
		_ = b.bar.Finish() // draws at 100% and ends the line
	}
}

// Close ends the bar's line where the bar stands (work that stopped
// early: an error is about to follow on the same writer). After Done it
// does nothing, so `defer bar.Close()` beside a Done is safe.
func (b *Bar) Close() {
	if b == nil || !b.end() {
		return
	}
	switch {
	case b.bar.IsFinished():
	case b.spinner:
		_ = b.bar.Finish() // stops the library's redrawing goroutine
	default:
		_ = b.bar.Exit() // ends the line, keeping what it showed
	}
}

// end marks the bar ended, and says whether this call did.
func (b *Bar) end() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return false
	}
	b.ended = true
	return true
}
