// Package recordstest keeps records in a real stream for the tests of what
// reads them back (the report, its gateway endpoint, the command).
package recordstest

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/adapters/records"
)

// Keep publishes raw records as a dispatcher does, each on its subject
// (workers' own are not kept), waits until the stream has
// acknowledged them all, and returns how many it published.
func Keep(t testing.TB, p *records.Publisher, lines [][]byte) int {
	t.Helper()
	n := 0
	for _, l := range lines {
		subject, _, keep, err := records.SubjectAndID(l)
		if err != nil {
			t.Fatal(err)
		}
		if keep {
			p.Publish(subject, l)
			n++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	return n
}
