// Package apitest holds tests over the module's public API as a whole:
// every exported type's nil and zero value answers with an error or a
// harmless zero, never a panic, and every package's errors carry their
// sentinel for the standard library's errors.Is as well as internal/errors'.
// It has no code of its own; its tests import every layer.
package apitest
