package fakellm_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func TestInstantModelAnswersEveryRequestAtOnceWithTheSameLength(t *testing.T) {
	const tokens, requests = 20, 50
	m, err := fakellm.InstantModel(tokens)
	if err != nil {
		t.Fatal(err)
	}
	// Real time (no time scale): whatever the model waits is really waited.
	fs := startServer(t, fakellm.Options{Model: m, Seed: 3})
	for i := range requests {
		extra := ""
		if i%2 == 1 {
			extra = `"stream":true`
		}
		status, _, body := fs.post(t, chatBody("instant "+string(rune('a'+i%26))+string(rune('a'+i/26)), extra))
		if status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, status, body)
		}
		rec := fs.nextRecord(t)
		if rec.Outcome != "ok" || rec.OutputTokens != tokens || rec.TokensSent != tokens || rec.End != fakellm.EndCompleted {
			t.Fatalf("request %d: record %+v, want %d tokens sent, completed", i, rec, tokens)
		}
		if rec.FirstByteModelMs == nil || *rec.FirstByteModelMs != 0 {
			t.Fatalf("request %d: drawn first byte %v ms, want 0", i, rec.FirstByteModelMs)
		}
		// A bound far below any modelled wait (gpt4o's median first byte is
		// 620 ms), loose enough for a loaded machine under -race.
		if rec.FirstByteRealMs == nil || time.Duration(*rec.FirstByteRealMs*float64(time.Millisecond)) > 250*time.Millisecond {
			t.Fatalf("request %d: first byte after %v ms of real time, want next to nothing", i, rec.FirstByteRealMs)
		}
	}
}

func TestInstantModelRejectsAnEmptyAnswer(t *testing.T) {
	for _, n := range []int{0, -1} {
		if _, err := fakellm.InstantModel(n); !errors.Is(err, fakellm.ErrInvalidOptions) {
			t.Errorf("InstantModel(%d) = %v, want ErrInvalidOptions", n, err)
		}
	}
}
