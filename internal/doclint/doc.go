// Package doclint holds tests over the module's documentation: the
// comments godoc shows, the README's code, the examples. It has no code of
// its own; its tests read the source tree.
package doclint
