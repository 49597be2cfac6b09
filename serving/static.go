package serving

// The static baseline: the maximum context reserved for every sequence.

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/internal/invariants"
	"github.com/vmarena/vmarena/internal/units"
)

// StaticReservation reserves MaxContext tokens of KV for every sequence at
// admission, as serving systems did before paging (FasterTransformer,
// Orca): a sequence's KV is one contiguous buffer for the longest context
// it may reach, since its output length is not known. Pure bookkeeping,
// with no memory behind it. The budget holds Budget / (MaxContext *
// TokenBytes) reservations; a request is admitted while one is free, and
// its appends never fail within MaxContext, so it is never preempted for
// memory. Nothing is shared or cached.
type StaticReservation struct {
	maxContext int
	tokenBytes uint64
	// slots is the reservations the budget holds, at least 1.
	slots int
	// seqs holds each running sequence's tokens, by request ID; each holds
	// one reservation, so len(seqs) <= slots.
	seqs map[int]int
	// logical is the tokens of all sequences.
	logical int
	// commits counts reservations made.
	commits int64
}

// NewStaticReservation makes a static scheme over cfg's budget. cfg must
// pass Config.Check.
func NewStaticReservation(cfg Config) (*StaticReservation, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	tb := cfg.Model.TokenBytes()
	return &StaticReservation{
		maxContext: cfg.MaxContext,
		tokenBytes: tb,
		slots:      int(min(cfg.Budget/(uint64(cfg.MaxContext)*tb), maxKVSeqs)),
		seqs:       map[int]int{},
	}, nil
}

// Name is "static".
func (s *StaticReservation) Name() string { return "static" }

// Slots is the number of reservations the budget holds.
func (s *StaticReservation) Slots() int {
	if s == nil {
		return 0
	}
	return s.slots
}

func (s *StaticReservation) made(op string) error {
	if s == nil || s.seqs == nil {
		return errors.Wrapf(driver.ErrInvalid, "serving: static: %s: the scheme was not made by NewStaticReservation", op)
	}
	return nil
}

func (s *StaticReservation) usable(op string, r *SimRequest) error {
	if err := s.made(op); err != nil {
		return err
	}
	return checkRequest("static", op, r)
}

// CanAdmit says whether a reservation is free and r's context fits in one.
func (s *StaticReservation) CanAdmit(r *SimRequest) bool {
	if s.usable("can admit", r) != nil {
		return false
	}
	_, running := s.seqs[r.id]
	return !running && len(s.seqs) < s.slots && r.context <= s.maxContext
}

// Admit takes a reservation for r. It holds nothing of r yet: 0. With no
// reservation free, the error is marked driver.ErrOutOfMemory.
func (s *StaticReservation) Admit(r *SimRequest) (int, error) { return s.start("admit", r) }

// Resume takes a reservation again, as Admit does: r's KV was dropped.
func (s *StaticReservation) Resume(r *SimRequest) (int, error) { return s.start("resume", r) }

func (s *StaticReservation) start(op string, r *SimRequest) (int, error) {
	if err := s.usable(op, r); err != nil {
		return 0, err
	}
	if _, running := s.seqs[r.id]; running {
		return 0, errors.Wrapf(driver.ErrInvalid, "serving: static: %s request %d: it is running already", op, r.id)
	}
	if len(s.seqs) == s.slots {
		return 0, errors.Wrapf(driver.ErrOutOfMemory, "serving: static: %s request %d: all %d reservations of %d tokens (%s) are taken",
			op, r.id, s.slots, s.maxContext, units.Bytes(uint64(s.maxContext)*s.tokenBytes))
	}
	s.seqs[r.id] = 0
	s.commits++
	s.checkAfter(op)
	return 0, nil
}

// Append counts n more tokens in r's reservation; past MaxContext the
// error is marked driver.ErrOutOfMemory.
func (s *StaticReservation) Append(r *SimRequest, n int) error {
	if err := s.usable("append", r); err != nil {
		return err
	}
	held, running := s.seqs[r.id]
	switch {
	case !running:
		return errors.Wrapf(driver.ErrInvalid, "serving: static: append to request %d: it is not running", r.id)
	case n < 0:
		return errors.Wrapf(driver.ErrInvalid, "serving: static: append %d tokens to request %d: want at least 0", n, r.id)
	case n > s.maxContext-held:
		return errors.Wrapf(driver.ErrOutOfMemory, "serving: static: append %d tokens to request %d: %d held of its reservation of %d",
			n, r.id, held, s.maxContext)
	}
	s.seqs[r.id] = held + n
	s.logical += n
	s.checkAfter("append")
	return nil
}

// Finish gives r's reservation back.
func (s *StaticReservation) Finish(r *SimRequest) error {
	if err := s.release("finish", r); err != nil {
		return err
	}
	s.checkAfter("finish")
	return nil
}

// Preempt gives r's reservation back; its KV is dropped (recompute).
func (s *StaticReservation) Preempt(r *SimRequest) (recompute bool, err error) {
	if err := s.release("preempt", r); err != nil {
		return false, err
	}
	s.checkAfter("preempt")
	return true, nil
}

func (s *StaticReservation) release(op string, r *SimRequest) error {
	if err := s.usable(op, r); err != nil {
		return err
	}
	held, running := s.seqs[r.id]
	if !running {
		return errors.Wrapf(driver.ErrInvalid, "serving: static: %s request %d: it is not running", op, r.id)
	}
	s.logical -= held
	delete(s.seqs, r.id)
	return nil
}

// Stats: InUse is the reservations taken, Stored and Logical the
// tokens in them.
func (s *StaticReservation) Stats() Stats {
	if s == nil {
		return Stats{}
	}
	return Stats{
		InUse:   uint64(len(s.seqs)) * uint64(s.maxContext) * s.tokenBytes,
		Stored:  uint64(s.logical) * s.tokenBytes,
		Logical: uint64(s.logical) * s.tokenBytes,
		Commits: s.commits,
	}
}

func (s *StaticReservation) checkAfter(op string) {
	if invariants.Enabled {
		invariants.Fail("serving: static: "+op, s.Check())
	}
}

// Check reports every inconsistency: more sequences than reservations, a
// sequence past its reservation, a token count that disagrees with a
// recount.
func (s *StaticReservation) Check() error {
	if err := s.made("check"); err != nil {
		return err
	}
	var errs error
	fail := func(format string, args ...any) {
		errs = errors.CombineErrors(errs, errors.AssertionFailedf("serving: static: "+format, args...))
	}
	if len(s.seqs) > s.slots {
		fail("%d sequences hold %d reservations", len(s.seqs), s.slots)
	}
	sum := 0
	for id, n := range s.seqs {
		if n < 0 || n > s.maxContext {
			fail("request %d holds %d tokens in a reservation of %d", id, n, s.maxContext)
		}
		sum += n
	}
	if sum != s.logical {
		fail("tokens: counted %d, recounted %d", s.logical, sum)
	}
	return errs
}

// String is the scheme's state in a line.
func (s *StaticReservation) String() string {
	if s == nil || s.seqs == nil {
		return "static: not made by NewStaticReservation"
	}
	return fmt.Sprintf("static: %d of %d reservations of %d tokens taken, %d tokens stored", len(s.seqs), s.slots, s.maxContext, s.logical)
}
