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
	"strings"
	"sync"
	"time"

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

// width is the bar's width in cells.
const width = 30

// Bar is a progress bar on one writer. A nil *Bar shows nothing.
type Bar struct {
	mu          sync.Mutex // guards everything below
	w           io.Writer
	total       int64 // -1: unknown (a spinner)
	n           int64
	description string
	throttle    time.Duration
	start       time.Time
	drawn       time.Time // the last redraw; zero before the first
	ended       bool      // Done or Close has ended the bar's line
	spins       int
	line        int // the width of the last line drawn, to blank its rest
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
	b := &Bar{w: w, total: total, description: description, throttle: opts.Throttle, start: time.Now()}
	b.mu.Lock()
	b.drawLocked(true)
	b.mu.Unlock()
	return b
}

// Set moves the bar to n of its total.
func (b *Bar) Set(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.moveLocked(n)
}

// Add moves the bar on by n.
func (b *Bar) Add(n int64) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.moveLocked(b.n + n)
}

// Describe changes the bar's label.
func (b *Bar) Describe(description string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.description = description
	b.drawLocked(false)
}

// Done fills the bar to its total and ends its line. Once Done or Close
// has run, the bar shows nothing more.
func (b *Bar) Done() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	if b.total > 0 {
		b.n = b.total
	}
	b.drawLocked(true)
	b.endLocked()
}

// Close ends the bar's line where the bar stands (work that stopped
// early: an error is about to follow on the same writer). After Done it
// does nothing, so `defer bar.Close()` beside a Done is safe.
func (b *Bar) Close() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.drawLocked(true)
	b.endLocked()
}

// moveLocked sets the count to n (at most the total) and redraws; a bar
// that reaches its total ends its line.
func (b *Bar) moveLocked(n int64) {
	if b.ended {
		return
	}
	if b.total > 0 && n >= b.total {
		b.n = b.total
		b.drawLocked(true)
		b.endLocked()
		return
	}
	b.n = max(n, 0)
	b.drawLocked(false)
}

// endLocked ends the bar's line.
func (b *Bar) endLocked() {
	b.ended = true
	_, _ = io.WriteString(b.w, "\n") // a bar that cannot draw changes nothing else
}

// drawLocked redraws the line, unless the last redraw is more recent
// than the throttle and force is not set.
func (b *Bar) drawLocked(force bool) {
	now := time.Now()
	if !force && !b.drawn.IsZero() && now.Sub(b.drawn) < b.throttle {
		return
	}
	b.drawn = now
	elapsed := now.Sub(b.start)
	var sb strings.Builder
	sb.WriteString("\r")
	sb.WriteString(b.description)
	if b.total > 0 {
		pct := int(b.n * 100 / b.total)
		filled := int(b.n * width / b.total)
		fmt.Fprintf(&sb, " %3d%% |%s%s| (%d/%d, %s/s) [%s:%s]", pct,
			strings.Repeat("█", filled), strings.Repeat(" ", width-filled),
			b.n, b.total, rate(b.n, elapsed), round(elapsed), eta(b.n, b.total, elapsed))
	} else {
		b.spins++
		fmt.Fprintf(&sb, " %c (%d, %s/s) [%s]", `|/-\`[b.spins%4], b.n, rate(b.n, elapsed), round(elapsed))
	}
	n := sb.Len()
	if pad := b.line - n; pad > 0 {
		sb.WriteString(strings.Repeat(" ", pad))
	}
	b.line = n
	_, _ = io.WriteString(b.w, sb.String())
}

// rate formats n items over d per second.
func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	r := float64(n) / d.Seconds()
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	default:
		return fmt.Sprintf("%.2f", r)
	}
}

// eta is the time left at the rate so far, "?" before any progress.
func eta(n, total int64, elapsed time.Duration) string {
	if n <= 0 {
		return "?"
	}
	return round(time.Duration(float64(elapsed) * float64(total-n) / float64(n))).String()
}

// round rounds d to the second (to the tenth below ten seconds).
func round(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}
