package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sse builds a chat completion stream as hedgerow's door writes it: a role
// chunk, a chunk per token, the finish, the usage chunk and [DONE]; edit
// changes the events before they are joined.
func sse(tokens []string, edit func(events []string) []string) []byte {
	chunk := func(body string) string {
		return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"rescued",` + body + "}\n\n"
	}
	events := []string{chunk(`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null`)}
	for _, t := range tokens {
		events = append(events, chunk(fmt.Sprintf(`"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}],"usage":null`, t)))
	}
	events = append(events,
		chunk(`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null`),
		chunk(fmt.Sprintf(`"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d,"total_tokens":%d}`, len(tokens), 9+len(tokens))),
		"data: [DONE]\n\n")
	if edit != nil {
		events = edit(events)
	}
	return []byte(strings.Join(events, ""))
}

// interruptedEvent is the error event hedgerow ends a broken stream with.
const interruptedEvent = `data: {"error":{"message":"the stream broke","type":"server_error","param":null,"code":"stream_interrupted"}}` + "\n\n"

func TestJoinStreamJudgesAStreamWholeOrSaysWhyNot(t *testing.T) {
	tokens := []string{"The", " hedge", " holds", " the", " line"}
	want := strings.Join(tokens, "")
	tests := []struct {
		name        string
		body        []byte
		why         string // a part of checkStream's reason; "" for a valid stream
		interrupted bool
	}{
		{"the whole answer", sse(tokens, nil), "", false},
		{"keep-alive comments and CRLF", []byte(strings.ReplaceAll(": ping\n\n"+string(sse(tokens, nil)), "\n", "\r\n")), "", false},
		{"a token repeated at the splice", sse(append(tokens[:3:3], tokens[2:]...), nil), "text differs at word 4", false},
		{"a token missing at the splice", sse(append(tokens[:2:2], tokens[3:]...), nil), "text differs at word 3", false},
		{"ended by stream_interrupted", sse(tokens[:2], func(e []string) []string {
			return append(e[:3:3], interruptedEvent)
		}), `error event "stream_interrupted"`, true},
		{"an error event before [DONE]", sse(tokens, func(e []string) []string {
			return append(e[:len(e)-1:len(e)-1], interruptedEvent, e[len(e)-1])
		}), "after the error event", false},
		{"no [DONE]", sse(tokens, func(e []string) []string { return e[:len(e)-1] }), "no [DONE]", false},
		{"two finish reasons", sse(tokens, func(e []string) []string {
			return append(e[:len(e)-2:len(e)-2], e[len(e)-3], e[len(e)-2], e[len(e)-1])
		}), "2 finish reasons", false},
		{"finished at its length", sse(tokens, func(e []string) []string {
			e[len(e)-3] = strings.Replace(e[len(e)-3], `"stop"`, `"length"`, 1)
			return e
		}), `finish "length"`, false},
		{"a malformed chunk", sse(tokens, func(e []string) []string {
			e[2] = `data: {"id":"chatcmpl-1","choices":[{"delta":{"content":` + "\n\n"
			return e
		}), "is not JSON", false},
		{"a chunk of another stream", sse(tokens, func(e []string) []string {
			e[3] = strings.Replace(e[3], "chatcmpl-1", "chatcmpl-2", 1)
			return e
		}), "has id", false},
		{"no usage chunk", sse(tokens, func(e []string) []string {
			return append(e[:len(e)-2:len(e)-2], e[len(e)-1])
		}), "no usage chunk", false},
		{"usage short of the answer", sse(tokens, func(e []string) []string {
			e[len(e)-2] = strings.Replace(e[len(e)-2], `"completion_tokens":5`, `"completion_tokens":4`, 1)
			return e
		}), "usage counts 4", false},
		{"content after the finish", sse(tokens, func(e []string) []string {
			return append(e[:len(e)-2:len(e)-2], e[2], e[len(e)-2], e[len(e)-1])
		}), "content after the finish", false},
		{"an event after [DONE]", sse(tokens, func(e []string) []string { return append(e, e[1]) }), "after [DONE]", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := joinStream(tc.body)
			why := checkStream(a, err, want)
			switch {
			case tc.why == "" && why != "":
				t.Fatalf("a valid stream judged invalid: %s", why)
			case tc.why != "" && !strings.Contains(why, tc.why):
				t.Fatalf("judged %q, want a reason holding %q", why, tc.why)
			}
			if interrupted := err == nil && a.errCode == "stream_interrupted"; interrupted != tc.interrupted {
				t.Errorf("stream_interrupted %v, want %v", interrupted, tc.interrupted)
			}
		})
	}
}

func TestCheckCompletionWantsTheWholeAnswerStopped(t *testing.T) {
	const want = "The hedge holds"
	body := func(content, finish string) []byte {
		return []byte(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":%q}]}`,
			content, finish))
	}
	for _, tc := range []struct {
		name   string
		status int
		body   []byte
		why    string
	}{
		{"the whole answer", 200, body(want, "stop"), ""},
		{"a word short", 200, body("The hedge", "stop"), "text differs at word 3"},
		{"cut at its length", 200, body(want, "length"), `finish "length"`},
		{"an error status", 502, []byte(`{"error":{"code":"stream_interrupted"}}`), "status 502"},
		{"not JSON", 200, []byte(`{"id":`), "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := checkCompletion(tc.status, tc.body, want)
			if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Fatalf("judged %q, want %q", why, tc.why)
			}
		})
	}
}

func TestPercentileIsTheNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 10; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5 * time.Millisecond}, {0.9, 9 * time.Millisecond}, {0.99, 10 * time.Millisecond}, {1, 10 * time.Millisecond}} {
		if got := percentile(ds, tc.q); got != tc.want {
			t.Errorf("P%g of 1..10 ms = %v, want %v", tc.q*100, got, tc.want)
		}
	}
	if got := percentile(nil, 0.99); got != 0 {
		t.Errorf("P99 of nothing = %v", got)
	}
	if ds[0] != 10*time.Millisecond {
		t.Error("percentile sorted its argument")
	}
}

func TestRescueCountsReadsTheOutcomesOfAMetricsPage(t *testing.T) {
	page := "# HELP hedgerow_rescues_total Continuation attempts.\n# TYPE hedgerow_rescues_total counter\n" +
		"hedgerow_rescues_total{outcome=\"started\"} 3\nhedgerow_rescues_total{outcome=\"won\"} 2\n" +
		"hedgerow_rescues_total_other{outcome=\"won\"} 9\nhedgerow_hedges_launched_total 4\n"
	got, err := rescueCounts(page)
	if err != nil || len(got) != 2 || got["started"] != 3 || got["won"] != 2 || got["failed"] != 0 {
		t.Fatalf("read %v, %v", got, err)
	}
	if _, err := rescueCounts(`hedgerow_rescues_total{outcome="won"} many`); err == nil {
		t.Fatal("a count that is no number was read")
	}
}

// TestAShortFaultRunLetsNoBrokenStreamThroughTheRescuedPool runs the tool
// on one fault with a few requests: the run ends, prints its table, and
// the rescued pool's answers are all whole. (Its times are the tool's
// output, not judged here.)
func TestAShortFaultRunLetsNoBrokenStreamThroughTheRescuedPool(t *testing.T) {
	o := defaultOptions()
	o.faults, o.requests, o.concurrency = []fakellm.BreakMode{fakellm.BreakError}, 6, 2
	// A bound no healthy stream comes near under the race detector on a
	// busy machine: the error fault needs none.
	o.stallBound = 5 * time.Second
	var out strings.Builder
	failed, err := run(context.Background(), o, &out)
	if err != nil || failed != "" {
		t.Fatalf("run: %v; failed: %s\n%s", err, failed, out.String())
	}
	for _, want := range []string{"rescued", "plain+retry", "load average at end"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("the output lacks %q:\n%s", want, out.String())
		}
	}
}
