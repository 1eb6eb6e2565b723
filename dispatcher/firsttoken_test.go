package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// Providers open their streams long before the model produces anything.
// The hedge trigger must see the first token, not the opening: a primary
// whose stream opened at once and then stalls is hedged, and the hedge wins
// (docs/architecture.md §4 rule 2). Real NATS, workers, adapters and
// dispatcher; the providers are scripted HTTP servers.
func TestAStreamOpenedAtOnceThatStallsBeforeItsFirstTokenIsHedged(t *testing.T) {
	for _, api := range []string{"chat completions", "messages"} {
		for _, stream := range []bool{true, false} {
			name := api + map[bool]string{true: " streaming", false: " non-streaming"}[stream]
			t.Run(name, func(t *testing.T) {
				sc := newScript(behaviour{openEarly: true, words: 5}, behaviour{openEarly: true, hang: true})
				ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
				if api == "messages" {
					ps = map[string]*provider{"a": newMessagesProvider(t, "a", sc), "b": newMessagesProvider(t, "b", sc)}
				}
				c := newCluster(t, []string{"a", "b"}, ps, "")

				resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(stream)}, nil)
				if err != nil {
					t.Fatalf("Submit: %v (the stalled primary was not hedged)", err)
				}
				if !resp.Hedged || resp.Winner != 2 || resp.Attempts != 2 {
					t.Fatalf("response %+v, want the hedge (attempt 2) to win", resp)
				}
				g := c.groupRecord(resp.GroupID)
				if g.Outcome != schemas.GroupCommitted || !g.HedgeLaunched || g.WinnerAttempt != 2 {
					t.Fatalf("group record %+v, want a hedge launched and winning", g)
				}
				recs := c.attemptRecords(resp.GroupID, 2)
				primary, hedge := recs[1], recs[2]
				if primary.Outcome != schemas.OutcomeLoserCanceled || primary.FirstByteMs != nil {
					t.Errorf("primary record %+v, want cancelled without a first byte although its stream was open", primary)
				}
				if hedge.Outcome != schemas.OutcomeWinner || hedge.FirstByteMs == nil {
					t.Errorf("hedge record %+v, want the winner with its first token's time", hedge)
				}
			})
		}
	}
}

// A stream that is open but has produced no token for longer than the
// heartbeat timeout (300 ms in policyYAML) is a slow model, not a lost
// worker: the worker's heartbeats go on until the first token, and the
// lone attempt of a single-route pool wins.
func TestAnOpenStreamWithoutATokenOutlastsTheHeartbeatTimeout(t *testing.T) {
	for _, api := range []string{"chat completions", "messages"} {
		t.Run(api, func(t *testing.T) {
			sc := newScript(behaviour{openEarly: true, firstByte: 900 * time.Millisecond, words: 3})
			p := newProvider(t, "a", sc)
			if api == "messages" {
				p = newMessagesProvider(t, "a", sc)
			}
			c := newCluster(t, []string{"a"}, map[string]*provider{"a": p}, "")

			resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, nil)
			if err != nil {
				t.Fatalf("Submit: %v (the open stream was taken for a lost worker)", err)
			}
			if resp.Winner != 1 || resp.Attempts != 1 {
				t.Fatalf("response %+v, want the only attempt to win", resp)
			}
			if rec := c.attemptRecords(resp.GroupID, 1)[1]; rec.Outcome != schemas.OutcomeWinner || rec.FirstByteMs == nil {
				t.Errorf("record %+v, want the winner with its first token's time", rec)
			}
		})
	}
}
