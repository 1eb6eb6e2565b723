package dispatcher

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// unusable are the answers the default success predicate refuses
// (docs/architecture.md §6) when the pool configures no contract.
var unusable = []struct {
	name string
	b    behaviour
}{
	{"truncated after 5 tokens with max_tokens 50 asked", behaviour{words: 5, finish: "length"}},
	{"ended by the content filter", behaviour{words: 3, finish: "content_filter"}},
	{"empty", behaviour{empty: true}},
}

// TestAnUnusableAnswerNeverWinsWhileAHealthyRouteAnswers: with no contract
// configured, a route answering truncated, filtered or empty loses to the
// healthy route, whether it answers as the fast hedge of a slow healthy
// primary or as the primary (then a replacement goes to the healthy route).
func TestAnUnusableAnswerNeverWinsWhileAHealthyRouteAnswers(t *testing.T) {
	healthy := behaviour{firstByte: 400 * time.Millisecond, words: 4}
	for _, u := range unusable {
		for _, order := range []struct {
			name  string
			first []behaviour
		}{
			{"faulty hedge", []behaviour{healthy, u.b}},
			{"faulty primary", []behaviour{u.b, healthy}},
		} {
			t.Run(u.name+"/"+order.name, func(t *testing.T) {
				c, _ := twoRoutes(t, newScript(healthy, order.first...))
				resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
				if err != nil {
					t.Fatalf("Submit: %v", err)
				}
				if resp.FinishReason != "stop" || resp.Content == "" || resp.Attempts != 2 {
					t.Fatalf("committed attempt %d of %d: finish %q, content %q; want the healthy route's answer",
						resp.Winner, resp.Attempts, resp.FinishReason, resp.Content)
				}
				recs := c.attemptRecords(resp.GroupID, 2)
				faulty := recs[3-resp.Winner]
				if faulty.StatusClass != schemas.StatusContractInvalid || faulty.ContractValid {
					t.Fatalf("faulty attempt's record = %+v, want contract_invalid", faulty)
				}
			})
		}
	}
}

// TestStreamCommittedAtItsFirstTokenEndsWithAnErrorWhenItsAnswerIsTruncated:
// at the first_token commit point truncation cannot be seen yet; the result
// shows it, and the committed stream ends with an error rather than passing
// for a whole answer. An empty streamed answer never commits: the other
// route's stream wins.
func TestStreamCommittedAtItsFirstTokenEndsWithAnErrorWhenItsAnswerIsTruncated(t *testing.T) {
	t.Run("truncated", func(t *testing.T) {
		c, _ := twoRoutes(t, newScript(behaviour{words: 4}, behaviour{words: 5, finish: "length"}))
		var got strings.Builder
		_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, sinkFunc(func(d Delta) error {
			got.WriteString(d.Content)
			return nil
		}))
		var ge *GroupError
		if !errors.As(err, &ge) || !ge.Streamed {
			t.Fatalf("Submit = %v, want a GroupError after the streamed bytes", err)
		}
		if got.Len() == 0 {
			t.Fatal("nothing was streamed before the error: the test did not commit at the first token")
		}
		rec := c.attemptRecords(ge.Group, 1)[1]
		if rec.Outcome != schemas.OutcomeWinner || rec.StatusClass != schemas.StatusContractInvalid {
			t.Fatalf("winner's record = %+v, want winner ended contract_invalid", rec)
		}
	})
	t.Run("empty", func(t *testing.T) {
		c, _ := twoRoutes(t, newScript(behaviour{words: 4}, behaviour{empty: true}))
		var got strings.Builder
		resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, sinkFunc(func(d Delta) error {
			got.WriteString(d.Content)
			return nil
		}))
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		if resp.Winner != 2 || got.Len() == 0 {
			t.Fatalf("winner %d streamed %q, want the replacement's answer", resp.Winner, got.String())
		}
	})
}

// TestAPoolMayAllowWhatThePredicateRefuses: allow_truncated,
// allow_content_filter and allow_empty let such an answer win.
func TestAPoolMayAllowWhatThePredicateRefuses(t *testing.T) {
	c, _ := twoRoutesWithPool(t, "    contract: {allow_truncated: true, allow_content_filter: true, allow_empty: true}\n",
		newScript(behaviour{words: 4}, unusable[0].b, unusable[1].b, unusable[2].b))
	for _, u := range unusable {
		resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
		if err != nil {
			t.Fatalf("%s: Submit: %v", u.name, err)
		}
		if resp.Attempts != 1 {
			t.Fatalf("%s: %d attempts, want the allowed answer to win alone", u.name, resp.Attempts)
		}
	}
}

func twoRoutesWithPool(t *testing.T, poolYAML string, sc *script) (*cluster, map[string]*provider) {
	t.Helper()
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	return newClusterWithPool(t, []string{"a", "b"}, ps, poolYAML, ""), ps
}

// TestACommittedStreamThatFailsGivesItsClaimBackSoARetryCommits: a stream
// committed at its first token whose answer then fails (here: truncated)
// never delivered its user action, so the group gives its winner gate
// claim back and records itself failed; the caller's retry with the same
// Idempotency-Key commits, under a higher epoch, instead of meeting the
// failed commit with already_committed.
func TestACommittedStreamThatFailsGivesItsClaimBackSoARetryCommits(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 4}, behaviour{words: 5, finish: "length"}))
	sub := Submission{Pool: "general", IdempotencyKey: "order-7", Request: chat(true)}
	_, err := c.d.Submit(context.Background(), sub, sinkFunc(func(Delta) error { return nil }))
	var ge *GroupError
	if !errors.As(err, &ge) || !ge.Streamed {
		t.Fatalf("first try: %v, want a GroupError after streamed bytes", err)
	}
	failed := c.groupRecord(ge.Group)
	if failed.Outcome != schemas.GroupFailed || failed.ErrorCode != schemas.ErrStreamInterrupted || failed.WinnerAttempt != 0 {
		t.Fatalf("failed commit's group record: outcome %s, error %s, winner %d; want failed stream_interrupted with no winner",
			failed.Outcome, failed.ErrorCode, failed.WinnerAttempt)
	}
	resp, err := c.d.Submit(context.Background(), sub, sinkFunc(func(Delta) error { return nil }))
	if err != nil {
		t.Fatalf("retry of the same user action: %v, want it to commit", err)
	}
	retry := c.groupRecord(resp.GroupID)
	if retry.Outcome != schemas.GroupCommitted || retry.GateEpoch < 2 || retry.UserActionID != failed.UserActionID {
		t.Fatalf("retry's record: outcome %s, epoch %d (gate %s); want committed at a higher epoch of the same user action",
			retry.Outcome, retry.GateEpoch, resp.Gate)
	}
}
