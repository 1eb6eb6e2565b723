package dispatcher

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/schemas"
)

// A stream's commit, handed to its CommitSink before the winner's result
// is in, carries the dispatcher's estimate of the prompt's input (marked
// estimated) — what an Anthropic door reports in message_start — and the
// final answer the winner's own count.
func TestAStreamsCommitCarriesTheInputEstimateUntilTheResultIsIn(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 5}))
	req := chat(true)
	req.Messages[0].Content = json.RawMessage(`"` + strings.Repeat("hedgerow ", 40) + `"`)
	var commit *Response
	resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: req}, commitSinkFunc{
		delta:     func(Delta) error { return nil },
		committed: func(r *Response) { commit = r },
	})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	want := schemas.Usage{InputUnits: estimateInput(req), Estimated: true}
	if commit == nil || commit.Usage != want {
		t.Fatalf("commit %+v, want usage %+v", commit, want)
	}
	if want.InputUnits < 80 {
		t.Fatalf("estimate %d of a 360-byte prompt", want.InputUnits)
	}
	if resp.Usage.Estimated || resp.Usage.OutputUnits != 5 {
		t.Errorf("final usage %+v, want the winner's own count", resp.Usage)
	}
}
