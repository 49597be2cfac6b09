package main

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// maxTableWidth is the widest a printed table of several columns is let
// be, in characters: wider, it is printed a column at a time (a block per
// column, each with the row labels) so that it reads on a terminal
// instead of wrapping line by line. 120 is a wide terminal; the replay
// table's labels alone take 77.
const maxTableWidth = 120

// tableWidth is how wide printTable prints table.
func tableWidth(table [][]string) int {
	var widths []int
	for _, row := range table {
		for i, c := range row {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	w := 0
	for i, x := range widths {
		if i > 0 {
			w += 2 // printTable's padding
		}
		w += x
	}
	return w
}

// printWrapped prints table as printTable does when it fits in
// maxTableWidth, or else one block per column after the labels: each
// block the label column and that column, blocks apart by a blank line.
func printWrapped(w io.Writer, table [][]string) {
	if len(table) == 0 || len(table[0]) <= 2 || tableWidth(table) <= maxTableWidth {
		printTable(w, table)
		return
	}
	for col := 1; col < len(table[0]); col++ {
		if col > 1 {
			fmt.Fprintln(w)
		}
		block := make([][]string, len(table))
		for i, row := range table {
			cell := ""
			if col < len(row) {
				cell = row[col]
			}
			block[i] = []string{row[0], cell}
		}
		printTable(w, block)
	}
}
