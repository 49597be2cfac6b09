//go:build invariants

package arena

// invariants builds poison every pool's freed memory (PoolProps.Poison).
const invariants = true
