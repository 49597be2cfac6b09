// Package errors is the module's error package: errors that wrap a cause
// with context (Wrap, Wrapf), carry hints and details a reader can take
// apart from the message, mark broken invariants (assertion failures),
// and keep a second error beside the first without letting Is see it.
//
// It has the names and semantics of the part of
// github.com/cockroachdb/errors the module uses, with only the standard
// library behind it: that package's reporting (sentry-go, gogo protobuf)
// brought net/http, TLS and protobuf into every program built on
// vmarena — a third of the CPU of a cold build of cmd/vmarena — for
// features nothing here uses (network encoding of errors, redaction,
// stack traces). What it keeps:
//
//   - Error() is the message chain: Wrap's context, ": ", the cause's
//     message. Hints, details, assertion marks and secondary errors do
//     not change it.
//   - Is and As are the standard library's: every wrapper here unwraps
//     to its cause, so a sentinel from package driver is found through
//     any number of them, by either package's Is. A secondary error
//     (CombineErrors, WithSecondaryError) and a Handled error's cause are
//     not causes: Is and As never see them.
//   - fmt's %+v prints the message, then every hint, detail and
//     secondary error of the chain, one a line; %v, %s and %q print
//     Error().
//   - Every function taking an error returns nil for a nil error, except
//     CombineErrors, which returns the other.
//
// It never captures stacks, allocates only the wrapper it returns, and
// is safe for concurrent use (its errors are immutable).
package errors

import (
	stderrors "errors"
	"fmt"
	"io"
	"strings"
)

// New returns an error whose message is msg.
func New(msg string) error { return &leaf{msg: msg} }

// Newf returns an error whose message is fmt.Sprintf(format, args...).
func Newf(format string, args ...any) error {
	return &leaf{msg: fmt.Sprintf(format, args...)}
}

// Wrap returns err with msg before its message ("msg: message"); nil
// for a nil err, err's message alone for an empty msg.
func Wrap(err error, msg string) error {
	if err == nil {
		return nil
	}
	return &withMessage{msg: msg, cause: err}
}

// Wrapf is Wrap with a formatted message.
func Wrapf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &withMessage{msg: fmt.Sprintf(format, args...), cause: err}
}

// WithHint returns err carrying hint, a suggestion for its reader
// (GetAllHints, FlattenHints, %+v); the message is err's.
func WithHint(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &withNote{note: hint, hint: true, cause: err}
}

// WithHintf is WithHint with a formatted hint.
func WithHintf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &withNote{note: fmt.Sprintf(format, args...), hint: true, cause: err}
}

// WithDetailf returns err carrying a detail (FlattenDetails, %+v): a
// fact about the failure, such as what a vendor runtime said.
func WithDetailf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &withNote{note: fmt.Sprintf(format, args...), cause: err}
}

// AssertionFailedf returns an error that reports a broken invariant
// (HasAssertionFailure says so), whose message is the formatted one.
func AssertionFailedf(format string, args ...any) error {
	return &assertion{cause: &leaf{msg: fmt.Sprintf(format, args...)}}
}

// WithAssertionFailure marks err as a broken invariant; its message and
// causes are err's.
func WithAssertionFailure(err error) error {
	if err == nil {
		return nil
	}
	return &assertion{cause: err}
}

// NewAssertionErrorWithWrappedErrf returns an assertion failure whose
// message is the formatted one, ": ", then err's; err is not a cause (Is
// does not see it: what failed is the invariant), but %+v prints it.
func NewAssertionErrorWithWrappedErrf(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if err != nil {
		msg += ": " + err.Error()
	}
	return &assertion{cause: &leaf{msg: msg, hidden: err}}
}

// HasAssertionFailure says whether err or any of its causes is an
// assertion failure.
func HasAssertionFailure(err error) bool {
	found := false
	walk(err, func(e error) bool {
		_, found = e.(*assertion)
		return !found
	})
	return found
}

// IsAssertionFailure is HasAssertionFailure.
func IsAssertionFailure(err error) bool { return HasAssertionFailure(err) }

// Handled returns an error with err's message whose cause Is and As do
// not see: err has been dealt with, and what it was must not decide
// what a caller does next. %+v still prints err.
func Handled(err error) error {
	if err == nil {
		return nil
	}
	return &leaf{msg: err.Error(), hidden: err}
}

// WithSecondaryError returns err carrying secondary, an error that
// happened while handling it (a rollback that failed too): err's message
// and causes, secondary printed by %+v only.
func WithSecondaryError(err, secondary error) error {
	if err == nil || secondary == nil {
		return err
	}
	return &withSecondary{cause: err, secondary: secondary}
}

// CombineErrors returns err with other as its secondary error, or
// whichever of the two is not nil.
func CombineErrors(err, other error) error {
	if err == nil {
		return other
	}
	return WithSecondaryError(err, other)
}

// Mark returns err that Is also reports as ref. Code of the module uses
// internal/sentinel's Mark (internal/doclint checks it); this one is for
// tests.
func Mark(err, ref error) error {
	if err == nil || ref == nil {
		return err
	}
	return &marked{cause: err, ref: ref}
}

// Safe returns v. It marks a value as safe to report where a caller of
// cockroachdb/errors redacted messages; here it formats as v.
func Safe(v any) any { return v }

// Is reports whether any error in err's chain is target (the standard
// library's errors.Is).
func Is(err, target error) bool { return stderrors.Is(err, target) }

// IsAny reports whether err Is any of targets.
func IsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if stderrors.Is(err, t) {
			return true
		}
	}
	return false
}

// As is the standard library's errors.As.
func As(err error, target any) bool { return stderrors.As(err, target) }

// Join is the standard library's errors.Join.
func Join(errs ...error) error { return stderrors.Join(errs...) }

// UnwrapAll returns the innermost cause of err's chain of single causes.
func UnwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		next := u.Unwrap()
		if next == nil {
			return err
		}
		err = next
	}
}

// GetAllHints returns the hints of err and its causes, innermost first,
// each once.
func GetAllHints(err error) []string { return notes(err, true) }

// FlattenHints returns GetAllHints joined by "\n--\n".
func FlattenHints(err error) string { return strings.Join(GetAllHints(err), "\n--\n") }

// FlattenDetails returns the details of err and its causes, innermost
// first, each once, joined by "\n--\n".
func FlattenDetails(err error) string { return strings.Join(notes(err, false), "\n--\n") }

// walk calls f on err and its causes, outermost first, following
// Unwrap() error and Unwrap() []error, until f returns false. It
// reports whether the walk ran to its end.
func walk(err error, f func(error) bool) bool {
	for err != nil {
		if !f(err) {
			return false
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if !walk(e, f) {
					return false
				}
			}
			return true
		default:
			return true
		}
	}
	return true
}

// notes returns the hints (or the details) of err's chain, innermost
// first, without repeats.
func notes(err error, hint bool) []string {
	var out []string
	walk(err, func(e error) bool {
		if n, ok := e.(*withNote); ok && n.hint == hint {
			out = append(out, n.note)
		}
		return true
	})
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	seen := make(map[string]bool, len(out))
	kept := out[:0]
	for _, n := range out {
		if !seen[n] {
			seen[n] = true
			kept = append(kept, n)
		}
	}
	return kept
}

// leaf is an error without a cause: New's, Newf's, and Handled's (whose
// hidden error %+v prints but nothing unwraps to).
type leaf struct {
	msg    string
	hidden error
}

func (e *leaf) Error() string { return e.msg }

func (e *leaf) Format(s fmt.State, verb rune) { format(e, s, verb) }

type withMessage struct {
	msg   string
	cause error
}

func (e *withMessage) Error() string {
	if e.msg == "" {
		return e.cause.Error()
	}
	return e.msg + ": " + e.cause.Error()
}

func (e *withMessage) Unwrap() error { return e.cause }

func (e *withMessage) Format(s fmt.State, verb rune) { format(e, s, verb) }

// withNote is a hint (hint set) or a detail.
type withNote struct {
	note  string
	hint  bool
	cause error
}

func (e *withNote) Error() string { return e.cause.Error() }

func (e *withNote) Unwrap() error { return e.cause }

// ErrorHint is the hint, for readers of hints through this method:
// cockroachdb/errors' GetAllHints among them, so a program using that
// package reads vmarena's hints with it.
func (e *withNote) ErrorHint() string {
	if e.hint {
		return e.note
	}
	return ""
}

// ErrorDetail is the detail, as ErrorHint is the hint.
func (e *withNote) ErrorDetail() string {
	if e.hint {
		return ""
	}
	return e.note
}

func (e *withNote) Format(s fmt.State, verb rune) { format(e, s, verb) }

type assertion struct{ cause error }

func (e *assertion) Error() string { return e.cause.Error() }

func (e *assertion) Unwrap() error { return e.cause }

func (e *assertion) Format(s fmt.State, verb rune) { format(e, s, verb) }

type withSecondary struct{ cause, secondary error }

func (e *withSecondary) Error() string { return e.cause.Error() }

func (e *withSecondary) Unwrap() error { return e.cause }

func (e *withSecondary) Format(s fmt.State, verb rune) { format(e, s, verb) }

type marked struct{ cause, ref error }

func (e *marked) Error() string { return e.cause.Error() }

func (e *marked) Unwrap() error { return e.cause }

func (e *marked) Is(target error) bool { return target == e.ref }

func (e *marked) Format(s fmt.State, verb rune) { format(e, s, verb) }

// format prints err for fmt: Error() for %v and %s, quoted for %q, and
// for %+v the message followed by the chain's hints, details, secondary
// and hidden errors (these last two in their own %+v, indented).
func format(err error, s fmt.State, verb rune) {
	switch {
	case verb == 'v' && s.Flag('+'):
		io.WriteString(s, err.Error())
		writeVerbose(s, err, "")
	case verb == 'q':
		fmt.Fprintf(s, "%q", err.Error())
	default:
		io.WriteString(s, err.Error())
	}
}

// writeVerbose writes the notes of err's chain, a line each, prefixed by
// indent.
func writeVerbose(w io.Writer, err error, indent string) {
	walk(err, func(e error) bool {
		var other error
		switch e := e.(type) {
		case *withNote:
			kind := "detail"
			if e.hint {
				kind = "hint"
			}
			fmt.Fprintf(w, "\n%s%s: %s", indent, kind, strings.ReplaceAll(e.note, "\n", "\n"+indent+"  "))
		case *withSecondary:
			fmt.Fprintf(w, "\n%ssecondary error: %s", indent, e.secondary.Error())
			other = e.secondary
		case *leaf:
			if e.hidden != nil {
				fmt.Fprintf(w, "\n%shandled error: %s", indent, e.hidden.Error())
				other = e.hidden
			}
		case *assertion:
			fmt.Fprintf(w, "\n%sassertion failure", indent)
		}
		if other != nil {
			writeVerbose(w, other, indent+"  ")
		}
		return true
	})
}
