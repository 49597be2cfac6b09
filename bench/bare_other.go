//go:build !linux

package bench

import (
	"time"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Off Linux the bare baselines have no system calls to make (memfd,
// fallocate, MADV_POPULATE): each answers ErrUnsupported, as the host
// driver they are compared with does.

func bareUnsupported(what string) error {
	return errors.Wrapf(driver.ErrUnsupported, "bench: %s: the bare baselines need Linux", what)
}

type bareRegion struct{}

func newBareRegion(uint64) (*bareRegion, error) { return nil, bareUnsupported("bare region") }

func (r *bareRegion) close() error              { return bareUnsupported("close") }
func (r *bareRegion) mapAccessUnmap(bool) error { return bareUnsupported("map, access, unmap") }
func (r *bareRegion) commit() error             { return bareUnsupported("commit") }
func (r *bareRegion) commitPunch() error        { return bareUnsupported("commit and punch") }
func (r *bareRegion) growStep() error           { return bareUnsupported("grow step") }
func (r *bareRegion) undoStep() error           { return bareUnsupported("undo grow step") }
func bareReserveFree(uint64) error              { return bareUnsupported("reserve and free") }

type streamCopier struct{ src, dst []byte }

func newStreamCopier(uint64) (*streamCopier, error) { return nil, bareUnsupported("stream copier") }

func (cp *streamCopier) copy() (time.Duration, error) { return 0, bareUnsupported("copy") }
func (cp *streamCopier) close() error                 { return bareUnsupported("close") }

type bareSharer struct{}

func newBareSharer(uint64) (*bareSharer, error) { return nil, bareUnsupported("bare sharer") }

func (s *bareSharer) close() error                                { return bareUnsupported("close") }
func (s *bareSharer) share(uint64, func()) (time.Duration, error) { return 0, bareUnsupported("share") }
