package pool

import (
	"fmt"

	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// Attr names a pool attribute; the values are CUDA's cudaMemPoolAttr.
type Attr int

const (
	ReuseFollowEventDependencies   Attr = 1
	ReuseAllowOpportunistic        Attr = 2
	ReuseAllowInternalDependencies Attr = 3
	ReleaseThreshold               Attr = 4
	ReservedMemCurrent             Attr = 5
	ReservedMemHigh                Attr = 6
	UsedMemCurrent                 Attr = 7
	UsedMemHigh                    Attr = 8
)

func (a Attr) String() string {
	switch a {
	case ReuseFollowEventDependencies:
		return "reuse-follow-event-dependencies"
	case ReuseAllowOpportunistic:
		return "reuse-allow-opportunistic"
	case ReuseAllowInternalDependencies:
		return "reuse-allow-internal-dependencies"
	case ReleaseThreshold:
		return "release-threshold"
	case ReservedMemCurrent:
		return "reserved-mem-current"
	case ReservedMemHigh:
		return "reserved-mem-high"
	case UsedMemCurrent:
		return "used-mem-current"
	case UsedMemHigh:
		return "used-mem-high"
	}
	return fmt.Sprintf("pool-attribute(%d)", int(a))
}

// SetAttribute sets a pool attribute (cudaMemPoolSetAttribute): the release
// threshold in bytes; the reuse policies 1 (on) or 0 (off); the
// high-water marks may only be reset, with 0, to the current value; the
// current values cannot be set. A refused value changes nothing.
func (p *Pool) SetAttribute(attr Attr, value uint64) error {
	if p.unmade() {
		return unmade("Pool.SetAttribute", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return p.errDestroyed("set attribute")
	}
	defer p.checkAfterLocked("set attribute")
	flag := func(f *bool) error {
		if value > 1 {
			return errors.Wrapf(driver.ErrInvalid, "pool: attribute %s takes 0 or 1, not %d", attr, value)
		}
		*f = value == 1
		return nil
	}
	switch attr {
	case ReleaseThreshold:
		p.threshold = value
		return nil
	case ReuseFollowEventDependencies:
		return flag(&p.follow)
	case ReuseAllowOpportunistic:
		return flag(&p.opportunistic)
	case ReuseAllowInternalDependencies:
		return flag(&p.internal)
	case ReservedMemHigh, UsedMemHigh:
		if value != 0 {
			return errors.WithHint(errors.Wrapf(driver.ErrInvalid, "pool: attribute %s can only be reset (set to 0), not set to %d", attr, value),
				"a high-water mark is measured, not chosen")
		}
		if attr == UsedMemHigh {
			p.usedHigh = p.usedCur
		} else {
			p.reservedHigh = alCommitted(p.al)
		}
		return nil
	case ReservedMemCurrent, UsedMemCurrent:
		return errors.Wrapf(driver.ErrInvalid, "pool: attribute %s is read-only", attr)
	}
	return errors.Wrapf(driver.ErrInvalid, "pool: unknown attribute %d", int(attr))
}

// Attribute reads a pool attribute (cudaMemPoolGetAttribute); flags read
// as 1 or 0.
func (p *Pool) Attribute(attr Attr) (uint64, error) {
	if p.unmade() {
		return 0, unmade("Pool.Attribute", "New")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b := func(f bool) uint64 {
		if f {
			return 1
		}
		return 0
	}
	switch attr {
	case ReleaseThreshold:
		return p.threshold, nil
	case ReuseFollowEventDependencies:
		return b(p.follow), nil
	case ReuseAllowOpportunistic:
		return b(p.opportunistic), nil
	case ReuseAllowInternalDependencies:
		return b(p.internal), nil
	case ReservedMemCurrent:
		return p.committedLocked(), nil
	case ReservedMemHigh:
		return max(p.reservedHigh, p.committedLocked()), nil
	case UsedMemCurrent:
		return p.usedCur, nil
	case UsedMemHigh:
		return p.usedHigh, nil
	}
	return 0, errors.Wrapf(driver.ErrInvalid, "pool: unknown attribute %d", int(attr))
}

// committedLocked is the memory behind the pool: none once destroyed.
func (p *Pool) committedLocked() uint64 {
	if p.destroyed {
		return 0
	}
	return alCommitted(p.al)
}
