package fakellm_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// slowFirstTokenModel is steadyModel whose first token comes after an hour
// of model time: with a time scale of 1, nothing a test waits for.
func slowFirstTokenModel(t *testing.T) *workload.Model {
	t.Helper()
	m := steadyModel(t, 10)
	m.TTFT.Main = workload.LogNormalMedian(3600, 0)
	return m
}

// openEarlyAPIs are the two dialects: where a request goes, its body, and
// the opening events a stream sends before its first token.
var openEarlyAPIs = []struct {
	name    string
	path    string
	body    func(prompt string) string
	opening []string // the event names (Messages) or chunk shapes (chat) in order
}{
	{"chat completions", "/v1/chat/completions", func(p string) string { return chatBody(p, `"stream":true`) },
		[]string{`"role":"assistant","content":""`}},
	{"messages", "/v1/messages", func(p string) string { return messagesBody(p, 1024, `"stream":true`) },
		[]string{"event: message_start", "event: content_block_start", "event: ping"}},
}

func TestOpenEarlySendsTheOpeningAtOnceAndNoTokenBeforeTheFirstByte(t *testing.T) {
	for _, api := range openEarlyAPIs {
		t.Run(api.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: slowFirstTokenModel(t), Seed: 1, TimeScale: 1, OpenEarly: true})
			ctx, cancel := context.WithTimeout(context.Background(), recordWait)
			defer cancel()
			// The headers come although the first token is an hour away.
			resp := fs.do(t, ctx, http.MethodPost, api.path, api.body("open early"))
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			lines := bufio.NewScanner(resp.Body)
			for _, want := range api.opening {
				if !nextNonBlank(lines) {
					t.Fatalf("stream ended before %q: %v", want, lines.Err())
				}
				if !strings.Contains(lines.Text(), want) {
					t.Fatalf("opening line %q, want %q", lines.Text(), want)
				}
				if strings.HasPrefix(lines.Text(), "event:") && !nextNonBlank(lines) { // its data line
					t.Fatalf("event %q without data", want)
				}
			}
			cancel()
			resp.Body.Close()

			rec := fs.nextRecord(t)
			if rec.Outcome != "ok" || rec.Status != http.StatusOK || rec.End != fakellm.EndDisconnected ||
				rec.TokensSent != 0 || rec.FirstByteRealMs != nil {
				t.Errorf("record = %+v, want an opened stream left before its first token", rec)
			}
		})
	}
}

func nextNonBlank(sc *bufio.Scanner) bool {
	for sc.Scan() {
		if sc.Text() != "" {
			return true
		}
	}
	return false
}

func TestOpenEarlyStreamsAreWellFormedWithTheFirstTokenAtTheDrawnFirstByte(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 12), Seed: 3, TimeScale: fastScale, OpenEarly: true})

	status, _, body := fs.post(t, chatBody("early chat", `"stream":true,"stream_options":{"include_usage":true}`))
	rec := fs.nextRecord(t)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if s := parseStream(t, body, true); s.tokens != 12 || s.finishReason != "stop" {
		t.Errorf("chat stream: %d tokens, finish %q; want 12, stop", s.tokens, s.finishReason)
	}
	checkFirstTokenTimes(t, rec)

	status, _, body = fs.postMessages(t, messagesBody("early messages", 1024, `"stream":true`))
	rec = fs.nextRecord(t)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if s := readMessagesStream(t, body); s.deltas != 12 || s.stopReason != "end_turn" {
		t.Errorf("messages stream: %d deltas, stop %q; want 12, end_turn", s.deltas, s.stopReason)
	}
	checkFirstTokenTimes(t, rec)
}

// checkFirstTokenTimes checks that the record's first byte is the first
// token's, which cannot be written before the drawn first byte.
func checkFirstTokenTimes(t *testing.T, rec fakellm.Record) {
	t.Helper()
	if rec.FirstByteRealMs == nil || rec.FirstByteModelMs == nil {
		t.Fatalf("record lacks first byte times: %+v", rec)
	}
	if drawn := *rec.FirstByteModelMs * fastScale; *rec.FirstByteRealMs < drawn {
		t.Errorf("first token written %.3f ms into the attempt, before its drawn first byte at %.3f ms", *rec.FirstByteRealMs, drawn)
	}
}

func TestOpenEarlyHangIsAnOpenSilentStreamEndedByAnErrorEventAtTheHangCap(t *testing.T) {
	for _, api := range openEarlyAPIs {
		t.Run(api.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: hangModel(t), Seed: 1, TimeScale: fastScale, OpenEarly: true})
			resp := fs.do(t, context.Background(), http.MethodPost, api.path, api.body("hang open"))
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			text := string(body)
			if !strings.Contains(text, api.opening[0]) || !strings.Contains(text, `"timeout`) ||
				strings.Contains(text, "content_block_delta") || strings.Contains(text, "[DONE]") {
				t.Errorf("stream %q: want the opening, then only an error event", text)
			}
			if rec := fs.nextRecord(t); rec.End != fakellm.EndHangCapped || rec.Status != http.StatusOK || rec.TokensSent != 0 {
				t.Errorf("record = %+v, want an opened stream capped without a token", rec)
			}
		})
	}
}

func TestOpenEarlyHangHoldsTheOpenStreamUntilTheClientLeaves(t *testing.T) {
	// Real time: the 30 s hang cap is far beyond the test, so only the
	// client's leaving can end the request.
	fs := startServer(t, fakellm.Options{Model: hangModel(t), Seed: 1, TimeScale: 1, OpenEarly: true})
	ctx, cancel := context.WithTimeout(context.Background(), recordWait)
	defer cancel()
	resp := fs.do(t, ctx, http.MethodPost, "/v1/chat/completions", chatBody("hang", `"stream":true`))
	lines := bufio.NewScanner(resp.Body)
	if resp.StatusCode != http.StatusOK || !nextNonBlank(lines) || !strings.Contains(lines.Text(), `"role":"assistant"`) {
		t.Fatalf("status %d, first line %q: want the stream opened with the role chunk", resp.StatusCode, lines.Text())
	}
	cancel()
	resp.Body.Close()

	rec := fs.nextRecord(t)
	if rec.Outcome != "hang" || rec.End != fakellm.EndDisconnected || rec.Status != http.StatusOK ||
		rec.TokensSent != 0 || rec.BilledOutputTokens != 0 {
		t.Errorf("record = %+v, want an open hang left by its client, billed no output", rec)
	}
}
