package serving

// The pool of blocks the paged schemes share their bookkeeping of: every
// block of the budget, the free list, and the cache of hashed blocks.

// blockPool is a budget cut into blocks. A block is in use (ref > 0, by
// ref running sequences' tables) or free (ref == 0) and then on the free
// list. A full block may be hashed: then cached[hash] is its id, and its
// content stays findable while it is free (it is cached).
type blockPool struct {
	blocks []pagedBlock
	// free is the list of free blocks, least recently freed at its head:
	// blocks[].prev/next link it, none marks its ends, and freeLen counts
	// it.
	freeHead, freeTail int32
	freeLen            int
	// cached maps a hash to the one block registered under it.
	cached map[uint64]int32
}

// newBlockPool is a pool of n blocks, all free, in id order.
func newBlockPool(n int) blockPool {
	p := blockPool{blocks: make([]pagedBlock, n), freeHead: none, freeTail: none, cached: map[uint64]int32{}}
	for b := range p.blocks {
		p.blocks[b].prev, p.blocks[b].next = none, none
		p.pushFree(int32(b))
	}
	return p
}

func (p *blockPool) pushFree(b int32) {
	blk := &p.blocks[b]
	blk.prev, blk.next = p.freeTail, none
	if p.freeTail == none {
		p.freeHead = b
	} else {
		p.blocks[p.freeTail].next = b
	}
	p.freeTail = b
	p.freeLen++
}

func (p *blockPool) unlinkFree(b int32) {
	blk := &p.blocks[b]
	if blk.prev == none {
		p.freeHead = blk.next
	} else {
		p.blocks[blk.prev].next = blk.next
	}
	if blk.next == none {
		p.freeTail = blk.prev
	} else {
		p.blocks[blk.next].prev = blk.prev
	}
	blk.prev, blk.next = none, none
	p.freeLen--
}

// extendChain is c, r's chained block hashes, extended to its first n
// blocks of blockTokens tokens: a block's hash is of its parent's (a
// constant for the first) and its tokens (SimRequest.Token).
func extendChain(c []uint64, r *SimRequest, n, blockTokens int) []uint64 {
	var buf [64]int
	for k := len(c); k < n; k++ {
		h := uint64(0x6b76_6361_6368_6531) // the first block's parent
		if k > 0 {
			h = c[k-1]
		}
		for i, end := k*blockTokens, (k+1)*blockTokens; i < end; i += len(buf) {
			for _, tok := range r.Tokens(buf[:0], i, min(end, i+len(buf))) {
				h = mix64(h ^ uint64(tok))
			}
		}
		c = append(c, h)
	}
	return c
}
