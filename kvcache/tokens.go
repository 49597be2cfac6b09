package kvcache

// tokenLog is a sequence's tokens past its prompt (the prompt's own are
// its prompt), kept in blocks of logBlock tokens: appending never moves
// what is there. A slice regrown by doubling would copy the whole context
// now and then, and that one Append would cost as much as the context.
//
// Invariant: every block but the last is full, and n counts the tokens
// of them all.
type tokenLog struct {
	blocks [][]int
	n      int
}

// logBlock is the tokens of one block of a tokenLog (8 KiB).
const logBlock = 1024

// append adds ts at the end.
func (l *tokenLog) append(ts []int) {
	for len(ts) > 0 {
		if len(l.blocks) == 0 || len(l.blocks[len(l.blocks)-1]) == logBlock {
			l.blocks = append(l.blocks, make([]int, 0, logBlock))
		}
		b := &l.blocks[len(l.blocks)-1]
		k := min(len(ts), logBlock-len(*b))
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
// full.
func (l *tokenLog) check() bool {
	n := 0
	for i, b := range l.blocks {
		if (i < len(l.blocks)-1 && len(b) != logBlock) || len(b) == 0 {
			return false
		}
		n += len(b)
	}
	return n == l.n
}
