package main

import (
	"encoding/json"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
)

// progress returns a progress callback that draws a bar of total steps on
// stderr when stderr is a terminal (and quiet is off), and the func that ends
// the bar; both are no-ops otherwise.
func progress(total int64, desc string, quiet bool) (func(int), func()) {
	if quiet || !isTerminal(os.Stderr) {
		return nil, func() {}
	}
	bar := progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionClearOnFinish(),
	)
	return func(n int) { _ = bar.Add(n) }, func() { _ = bar.Finish() }
}

// isTerminal reports whether f is a terminal, where a progress bar belongs.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// report is what simulate and demo print: a table, or one JSON object.
type report interface{ WriteTable(io.Writer) error }

func printReport(w io.Writer, rep report, asJSON bool) error {
	if !asJSON {
		return rep.WriteTable(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}
