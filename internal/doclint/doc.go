// Package doclint holds tests over the module's documentation: the
// comments godoc shows; the README and the pages of docs/ (their Go code
// is the module's Examples, their links resolve, they name every sentinel
// and no issue); the examples; that a module of a user's can depend on a
// clone of this one. It has no code of its own; its tests read the source
// tree.
package doclint
