package kvcache

// tokenLog is a sequence's tokens past its prompt (the prompt's own are
// its prompt), kept in blocks of logBlock tokens: appending never moves
// a full block. A slice regrown by doubling would copy the whole context
// now and then, and that one Append would cost as much as the context.
// The first block starts at firstBlock tokens and doubles up to logBlock
// as it fills (at most logBlock/2 tokens copied, once each size): most
// sequences generate a few hundred tokens, and a block of logBlock made
// up front for each would be 8 KiB allocated and cleared by the first
// Append of every sequence — in a decode step, by the step that admits
// it.
//
// Invariant: every block but the last is full (logBlock tokens); the
// last holds at most logBlock; n counts the tokens of them all.
type tokenLog struct {
	blocks [][]int
	n      int
}

const (
	// logBlock is the tokens of a full block of a tokenLog (8 KiB).
	logBlock = 1024
	// firstBlock is the room of a log's first block when it is made.
	firstBlock = 16
)

// append adds ts at the end.
func (l *tokenLog) append(ts []int) {
	for len(ts) > 0 {
		switch {
		case len(l.blocks) == 0:
			l.blocks = append(l.blocks, make([]int, 0, firstBlock))
		case len(l.blocks[len(l.blocks)-1]) == logBlock:
			l.blocks = append(l.blocks, make([]int, 0, logBlock))
		}
		b := &l.blocks[len(l.blocks)-1]
		if len(*b) == cap(*b) {
			// The first block, full below logBlock: twice the room.
			nb := make([]int, len(*b), min(2*cap(*b), logBlock))
			copy(nb, *b)
			*b = nb
		}
		k := min(len(ts), cap(*b)-len(*b))
		*b = append(*b, ts[:k]...)
		ts = ts[k:]
		l.n += k
	}
}

// truncate keeps the first n tokens (n at most l.n).
func (l *tokenLog) truncate(n int) {
	full := (n + logBlock - 1) / logBlock
	clear(l.blocks[full:])
	l.blocks = l.blocks[:full]
	if full > 0 {
		l.blocks[full-1] = l.blocks[full-1][:n-(full-1)*logBlock]
	}
	l.n = n
}

// appendTo appends the tokens to dst.
func (l *tokenLog) appendTo(dst []int) []int {
	for _, b := range l.blocks {
		dst = append(dst, b...)
	}
	return dst
}

// check reports whether the blocks hold n tokens, every one but the last
// full, none with room past logBlock.
func (l *tokenLog) check() bool {
	n := 0
	for i, b := range l.blocks {
		if (i < len(l.blocks)-1 && len(b) != logBlock) || len(b) == 0 || cap(b) > logBlock {
			return false
		}
		n += len(b)
	}
	return n == l.n
}
