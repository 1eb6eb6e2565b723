package fakellm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// streamPaths are the streaming APIs, each with a streaming request.
var streamPaths = []struct {
	path string
	body func(prompt string) string
}{
	{"/v1/chat/completions", func(prompt string) string { return chatBody(prompt, `"stream":true`) }},
	{"/v1/messages", func(prompt string) string { return messagesBody(prompt, 1000, `"stream":true`) }},
	{"/v1/responses", func(prompt string) string { return responsesBody(prompt, `"stream":true`) }},
}

// streamEvent is one event of a stream in any API: its kind (the chat
// API's "chunk", "error" or "[DONE]", another API's event name) and the
// content it carries.
type streamEvent struct {
	kind, content string
}

// readEvent reads the next event of a stream from rd; false at the body's
// end, clean or not.
func readEvent(t *testing.T, rd *bufio.Reader) (streamEvent, bool) {
	t.Helper()
	var e streamEvent
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return e, false
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && e.kind != "":
			return e, true
		case strings.HasPrefix(line, "event: "):
			e.kind = strings.TrimPrefix(line, "event: ")
		case line == "data: [DONE]":
			e.kind = "[DONE]"
		case strings.HasPrefix(line, "data: "):
			var data struct {
				Error   json.RawMessage `json:"error"`
				Delta   json.RawMessage `json:"delta"`
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data); err != nil {
				t.Fatalf("data line %q: %v", line, err)
			}
			switch {
			case e.kind == "" && data.Error != nil:
				e.kind = "error"
			case e.kind == "":
				e.kind = "chunk"
				for _, c := range data.Choices {
					e.content += c.Delta.Content
				}
			case e.kind == "content_block_delta":
				var d struct{ Text string }
				_ = json.Unmarshal(data.Delta, &d) // checked by the Messages tests
				e.content = d.Text
			case e.kind == "response.output_text.delta":
				_ = json.Unmarshal(data.Delta, &e.content) // a string delta
			}
		}
	}
}

// readStream reads a whole stream: its events, its content tokens and
// whether the body ended cleanly.
func readStream(t *testing.T, body io.Reader) (kinds []string, tokens int, clean bool) {
	t.Helper()
	data, err := io.ReadAll(body)
	rd := bufio.NewReader(strings.NewReader(string(data)))
	for {
		e, ok := readEvent(t, rd)
		if !ok {
			return kinds, tokens, err == nil
		}
		kinds = append(kinds, e.kind)
		if e.content != "" {
			tokens++
		}
	}
}

func TestABrokenStreamBreaksAfterExactlyNTokensAsItsModeSays(t *testing.T) {
	for _, mode := range []fakellm.BreakMode{fakellm.BreakCut, fakellm.BreakError, fakellm.BreakStall} {
		for _, after := range []int{0, 3} {
			for _, api := range streamPaths {
				t.Run(fmt.Sprintf("%s after %d tokens %s", mode, after, api.path), func(t *testing.T) {
					fs := startServer(t, fakellm.Options{Model: steadyModel(t, 10), Seed: 1, TimeScale: fastScale,
						BreakShare: 1, BreakAfter: after, BreakMode: mode})
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					resp := fs.do(t, ctx, http.MethodPost, api.path, api.body("break me"))
					defer resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d", resp.StatusCode)
					}
					var kinds []string
					tokens, clean := 0, false
					if mode == fakellm.BreakStall {
						// Read up to the Nth token's event; the stall holds the
						// stream open, so the client leaves.
						rd := bufio.NewReader(resp.Body)
						for tokens < after || len(kinds) == 0 {
							e, ok := readEvent(t, rd)
							if !ok {
								t.Fatalf("the stream ended after %d tokens (%v); a stall holds it open", tokens, kinds)
							}
							kinds = append(kinds, e.kind)
							if e.content != "" {
								tokens++
							}
						}
						select {
						case rec := <-fs.records:
							t.Fatalf("the stalled exchange ended while the client waited: %+v", rec)
						default:
						}
						cancel()
					} else {
						kinds, tokens, clean = readStream(t, resp.Body)
					}
					last := kinds[len(kinds)-1]
					switch {
					case tokens != after:
						t.Errorf("%d content tokens arrived; want %d", tokens, after)
					case mode == fakellm.BreakCut && clean:
						t.Errorf("a cut stream's body ended cleanly: %v", kinds)
					case mode == fakellm.BreakError && (!clean || last != "error"):
						t.Errorf("events %v (clean end %v); want the stream to end with the API's error event", kinds, clean)
					case mode != fakellm.BreakError && (last == "error" || last == "[DONE]" || strings.Contains(last, "stop") || strings.Contains(last, "completed")):
						t.Errorf("events %v: a %s stream sent a final event", kinds, mode)
					}
					rec := fs.nextRecord(t)
					if rec.End != fakellm.EndBroken || rec.Break != mode || rec.TokensSent != after ||
						rec.BilledOutputTokens != int64(after) || rec.FinishReason != "" || rec.OutputTokens != 10 {
						t.Errorf("record %+v", rec)
					}
					if mode == fakellm.BreakStall && rec.DisconnectUnixMs == nil {
						t.Errorf("a stall's record lacks when the client left: %+v", rec)
					}
				})
			}
		}
	}
}

func TestBreakDecisionsAreADrawOfSeedRouteAndRequest(t *testing.T) {
	const n = 4000
	breaks := func(seed uint64, route int, share float64) (count int, set map[uint64]bool) {
		set = map[uint64]bool{}
		for id := range uint64(n) {
			if fakellm.StreamBreaks(seed, route, id, share) {
				count++
				set[id] = true
			}
			if fakellm.StreamBreaks(seed, route, id, share) != set[id] {
				t.Fatalf("request %d: two draws disagree", id)
			}
		}
		return count, set
	}
	if c, _ := breaks(1, 0, 0); c != 0 {
		t.Errorf("share 0 broke %d streams", c)
	}
	if c, _ := breaks(1, 0, 1); c != n {
		t.Errorf("share 1 broke %d of %d streams", c, n)
	}
	c, base := breaks(1, 0, 0.25)
	if share := float64(c) / n; share < 0.22 || share > 0.28 {
		t.Errorf("share 0.25 broke %.3f of the streams", share)
	}
	for _, other := range []struct {
		seed  uint64
		route int
	}{{2, 0}, {1, 1}} {
		_, set := breaks(other.seed, other.route, 0.25)
		same := 0
		for id := range base {
			if set[id] {
				same++
			}
		}
		if same == len(base) || same > len(base)/2 {
			t.Errorf("seed %d route %d breaks %d of the %d streams seed 1 route 0 breaks; want independent draws",
				other.seed, other.route, same, len(base))
		}
	}
}

func TestAServerBreaksExactlyTheStreamsStreamBreaksPredicts(t *testing.T) {
	const seed, route, share = 4, 1, 0.5
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 6), Seed: seed, Route: route, TimeScale: fastScale,
		BreakShare: share, BreakAfter: 2, BreakMode: fakellm.BreakError})
	broke := map[bool]int{}
	for _, prompt := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		id, err := fakellm.RequestID(conversation(prompt), 0)
		if err != nil {
			t.Fatal(err)
		}
		want := fakellm.StreamBreaks(seed, route, id, share)
		status, _, _ := fs.post(t, chatBody(prompt, `"stream":true`))
		rec := fs.nextRecord(t)
		if status != http.StatusOK || rec.RequestID != id || (rec.End == fakellm.EndBroken) != want {
			t.Errorf("%q: status %d, record %+v; predicted a break: %v", prompt, status, rec, want)
		}
		broke[want]++
	}
	if broke[true] == 0 || broke[false] == 0 {
		t.Fatalf("the prompts broke %v: pick prompts that show both", broke)
	}
}

func TestStreamsThatNeverBreak(t *testing.T) {
	m := steadyModel(t, 6)
	full := fullText(t, m, "whole", 0)
	for _, tc := range []struct {
		name  string
		cfg   fakellm.Options
		body  string
		check func(t *testing.T, data []byte)
	}{
		{"an answer of N tokens or fewer", fakellm.Options{Model: steadyModel(t, 3)}, chatBody("whole", `"stream":true`),
			func(t *testing.T, data []byte) { parseStream(t, data, false) }},
		{"a non-streaming answer", fakellm.Options{Model: m}, chatBody("whole", ""),
			func(t *testing.T, data []byte) {
				if r := readReply(t, "/v1/chat/completions", false, data); r.text != full {
					t.Errorf("answered %q, want %q", r.text, full)
				}
			}},
		{"a continuation", fakellm.Options{Model: m, Continuation: fakellm.ContinuationPrefix},
			continuationStyles[2].body("whole", tokens(full)[0], streamExtra("/v1/chat/completions")),
			func(t *testing.T, data []byte) {
				if s := parseStream(t, data, true); s.content != full[len(tokens(full)[0]):] {
					t.Errorf("continued with %q; want the rest of %q", s.content, full)
				}
			}},
	} {
		// Not stall: a stream it broke would hold the request open.
		for _, mode := range []fakellm.BreakMode{fakellm.BreakCut, fakellm.BreakMalformed, fakellm.BreakTruncate} {
			t.Run(fmt.Sprintf("%s %s", tc.name, mode), func(t *testing.T) {
				cfg := tc.cfg
				cfg.Seed, cfg.TimeScale = 1, fastScale
				cfg.BreakShare, cfg.BreakAfter, cfg.BreakMode = 1, 3, mode
				fs := startServer(t, cfg)
				status, _, data := fs.post(t, tc.body)
				if status != http.StatusOK {
					t.Fatalf("%d %s", status, data)
				}
				tc.check(t, data)
				if rec := fs.nextRecord(t); rec.End != fakellm.EndCompleted || rec.Break != "" {
					t.Errorf("record %+v", rec)
				}
			})
		}
	}
}

// TestAStallThatResumesAfterItsTimeCompletesWithTheFullText: with
// Options.BreakStallFor D, a stalled stream goes silent after its Nth
// token for D of model time, then resumes and completes normally: the
// joined text is the conversation's full text, the record a completed
// stream that stalled. A client that leaves during the stall still ends a
// broken one.
func TestAStallThatResumesAfterItsTimeCompletesWithTheFullText(t *testing.T) {
	const (
		answer = 10
		after  = 3
		// stallFor is model time: 100 ms of real time at fastScale.
		stallFor = 100 * time.Second
		realWait = 100 * time.Millisecond
	)
	m := steadyModel(t, answer)
	for _, api := range streamPaths {
		for _, tc := range []struct {
			name  string
			leave bool // the client leaves once the Nth token is in
		}{
			{"resumes and completes", false},
			{"ends broken when the client leaves during the stall", true},
		} {
			t.Run(api.path+" "+tc.name, func(t *testing.T) {
				fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale,
					BreakShare: 1, BreakAfter: after, BreakMode: fakellm.BreakStall, BreakStallFor: stallFor})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				sent := time.Now()
				resp := fs.do(t, ctx, http.MethodPost, api.path, api.body("stall then go on"))
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				rd := bufio.NewReader(resp.Body)
				var (
					text   strings.Builder
					tokens int
					kinds  []string
					resume time.Duration // from sending the request to the first token after the stall
				)
				for {
					if tc.leave && tokens == after {
						cancel()
						break
					}
					e, ok := readEvent(t, rd)
					if !ok {
						break
					}
					kinds = append(kinds, e.kind)
					if e.content == "" {
						continue
					}
					if tokens++; tokens == after+1 {
						resume = time.Since(sent)
					}
					text.WriteString(e.content)
				}
				rec := fs.nextRecord(t)
				if tc.leave {
					if rec.End != fakellm.EndBroken || rec.Break != fakellm.BreakStall || rec.TokensSent != after ||
						rec.BilledOutputTokens != after || rec.DisconnectUnixMs == nil {
						t.Errorf("record %+v: want a stall broken after %d tokens when the client left", rec, after)
					}
					return
				}
				if want := fullText(t, m, "stall then go on", 0); text.String() != want {
					t.Errorf("joined text %q, want the full text %q (events %v)", text.String(), want, kinds)
				}
				if resume < realWait {
					t.Errorf("the first token after the stall came %v after the request, want at least the stall's %v", resume, realWait)
				}
				if last := kinds[len(kinds)-1]; last == "error" {
					t.Errorf("events %v: a resumed stall ended with an error", kinds)
				}
				if rec.End != fakellm.EndCompleted || rec.Break != fakellm.BreakStall || rec.TokensSent != answer ||
					rec.BilledOutputTokens != answer || rec.FinishReason != "stop" || rec.DisconnectUnixMs != nil {
					t.Errorf("record %+v: want a completed stream of %d tokens that stalled", rec, answer)
				}
				if d := time.Duration(rec.EndUnixMs-rec.StartUnixMs) * time.Millisecond; d < realWait {
					t.Errorf("the exchange lasted %v, less than its stall's %v", d, realWait)
				}
			})
		}
	}
}
