package cachingmodel

import "math/rand/v2"

// pool is a set of free blocks ordered by less (size, then segment, then
// offset): a treap, a binary search tree kept balanced in expectation by
// a random priority per node, so that an insert, a removal and the
// best-fit search each cost the logarithm of the blocks pooled, as
// PyTorch's std::set does. The priorities are math/rand/v2's: the
// tree's shape, never its order, depends on them, so the model's results
// do not.
type pool struct {
	root *node
	n    int
}

type node struct {
	b           *block
	prio        uint64
	left, right *node
}

// split parts t into the nodes before key and those from key on.
func split(t *node, key *block) (l, r *node) {
	if t == nil {
		return nil, nil
	}
	if less(t.b, key) < 0 {
		t.right, r = split(t.right, key)
		return t, r
	}
	l, t.left = split(t.left, key)
	return l, t
}

// merge joins l and r, every key of l before every key of r.
func merge(l, r *node) *node {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = merge(l.right, r)
		return l
	}
	r.left = merge(l, r.left)
	return r
}

func (p *pool) insert(b *block) {
	l, r := split(p.root, b)
	p.root = merge(merge(l, &node{b: b, prio: rand.Uint64()}), r)
	p.n++
}

// remove takes b out; false when b is not pooled (the pool unchanged).
func (p *pool) remove(b *block) bool {
	l, r := split(p.root, b)
	if r == nil {
		p.root = merge(l, r)
		return false
	}
	first := r
	for first.left != nil {
		first = first.left
	}
	if first.b != b {
		p.root = merge(l, r)
		return false
	}
	p.root = merge(l, removeFirst(r))
	p.n--
	return true
}

// removeFirst returns t less its first node.
func removeFirst(t *node) *node {
	if t.left == nil {
		return t.right
	}
	t.left = removeFirst(t.left)
	return t
}

// ceil is the first block not before key, or nil.
func (p *pool) ceil(key *block) *block {
	var best *block
	for t := p.root; t != nil; {
		if less(t.b, key) < 0 {
			t = t.right
		} else {
			best, t = t.b, t.left
		}
	}
	return best
}

// blocks lists the pooled blocks in order (for the OOM path, which walks
// them as PyTorch's release does, and for Check).
func (p *pool) blocks() []*block {
	out := make([]*block, 0, p.n)
	var walk func(*node)
	walk = func(t *node) {
		if t == nil {
			return
		}
		walk(t.left)
		out = append(out, t.b)
		walk(t.right)
	}
	walk(p.root)
	return out
}
