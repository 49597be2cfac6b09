//go:build !invariants

package arena

// invariants builds (go test -tags invariants) poison every pool's freed
// memory; this one poisons only pools created with PoolProps.Poison.
const invariants = false
