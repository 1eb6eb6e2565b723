package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestFakeLLMServesModelsUntilStopped(t *testing.T) {
	noLeaks(t)
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--workload", "sonnet", "--seed", "3",
		"--time-scale", "0.01", "--route", "2")
	base := r.waitFor(servingURL)
	status, body := getBody(t, base+"/v1/models")
	if status != http.StatusOK || !strings.Contains(body, `"sonnet"`) {
		t.Fatalf("/v1/models: %d %s", status, body)
	}
	status, body = getBody(t, base+"/stats?limit=0")
	if status != http.StatusOK || !strings.Contains(body, `"route":2`) || !strings.Contains(body, `"seed":3`) {
		t.Fatalf("/stats does not show the flags: %d %s", status, body)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

func TestFakeLLMRefusesAnUnknownWorkload(t *testing.T) {
	out, err := runRoot(t, "fakellm", "--listen", "127.0.0.1:0", "--workload", "nope")
	if err == nil {
		t.Fatalf("fakellm with an unknown workload started:\n%s", out)
	}
}

func TestFakeLLMAnswers429PastItsRequestsPerMinute(t *testing.T) {
	noLeaks(t)
	// Two requests a real minute: the bucket starts full and refills one
	// every 30 s, so the third request at once is refused.
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "1", "--requests-per-minute", "2")
	base := r.waitFor(servingURL)
	var statuses []int
	for i := range 3 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"model":"sonnet","max_tokens":1,"messages":[{"role":"user","content":"q%d"}]}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, resp.StatusCode)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
			t.Errorf("429 without Retry-After")
		}
		resp.Body.Close()
	}
	if statuses[2] != http.StatusTooManyRequests || statuses[0] == http.StatusTooManyRequests || statuses[1] == http.StatusTooManyRequests {
		t.Errorf("statuses %v: want the first two admitted and the third 429", statuses)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

func TestFakeLLMRefusesALimitItsTimeScaleCannotKeepWhole(t *testing.T) {
	out, err := runRoot(t, "fakellm", "--listen", "127.0.0.1:0", "--time-scale", "0.1", "--requests-per-minute", "5")
	if err == nil || !strings.Contains(err.Error(), "whole number") {
		t.Fatalf("fakellm with 0.5 requests a model minute: err %v\n%s", err, out)
	}
}

func TestFakeLLMRefusesAnUnknownContinuationStyleOrBreakModeOrAStallThatCannotResume(t *testing.T) {
	for _, args := range [][]string{
		{"--continuation", "suffix"},
		{"--break-mode", "explode"},
		{"--break-share", "1.5"},
		{"--break-mode", "stall", "--break-stall-for", "-1s"},
		{"--break-mode", "cut", "--break-stall-for", "1s"},
	} {
		out, err := runRoot(t, append([]string{"fakellm", "--listen", "127.0.0.1:0"}, args...)...)
		if err == nil {
			t.Errorf("fakellm %v started:\n%s", args, out)
		}
	}
}

// TestFakeLLMDelaysOnlyAnInstantRoutesFirstToken: --first-token shapes
// the instant route alone, and never negative; --timings is never negative.
func TestFakeLLMDelaysOnlyAnInstantRoutesFirstToken(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--first-token", "50ms"}, "only with --instant"},
		{[]string{"--instant", "20", "--first-token", "-1s"}, "want a positive duration"},
		{[]string{"--instant", "20", "--timings", "-1"}, "timings -1 is negative"},
	}
	for _, tt := range tests {
		out, err := runRoot(t, append([]string{"fakellm", "--listen", "127.0.0.1:0"}, tt.args...)...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("fakellm %v = %v, want an error saying %q:\n%s", tt.args, err, tt.want, out)
		}
	}
	for _, first := range []time.Duration{0, 80 * time.Millisecond} {
		m, err := instantModel(20, first, 0.5)
		if err != nil {
			t.Fatal(err)
		}
		// Model seconds: at --time-scale 0.5 a real 80 ms is 160 ms of the model's.
		if got, want := m.TTFT.Main.Median(), 2*first.Seconds(); first > 0 && math.Abs(got-want) > 1e-9 {
			t.Errorf("first token %v at time scale 0.5: the model's median is %vs, want %vs", first, got, want)
		}
	}
}

func TestFakeLLMContinuesAPrefixAndBreaksStreamsAsItsFlagsSay(t *testing.T) {
	noLeaks(t)
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "6", "--continuation", "prefix",
		"--break-share", "1", "--break-after", "2", "--break-mode", "error")
	base := r.waitFor(servingURL)
	post := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(data)
	}
	const question = `{"role":"user","content":"q"}`
	status, full := post(`{"model":"m","messages":[` + question + `]}`)
	var answer struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(full), &answer); status != http.StatusOK || err != nil || len(answer.Choices) != 1 {
		t.Fatalf("answer: %d %v %s", status, err, full)
	}
	text := answer.Choices[0].Message.Content
	cut := strings.Index(text[1:], " ") + 1 // after the first word
	status, rest := post(`{"model":"m","messages":[` + question + `,{"role":"assistant","prefix":true,"content":` +
		strconv.Quote(text[:cut]) + `}]}`)
	if err := json.Unmarshal([]byte(rest), &answer); status != http.StatusOK || err != nil || answer.Choices[0].Message.Content != text[cut:] {
		t.Errorf("continuation after %q: %d %s; want the rest %q", text[:cut], status, rest, text[cut:])
	}
	status, stream := post(`{"model":"m","stream":true,"messages":[` + question + `]}`)
	if status != http.StatusOK || strings.Count(stream, `"content":"`) != 3 || !strings.Contains(stream, `data: {"error":`) ||
		strings.Contains(stream, "[DONE]") {
		t.Errorf("a stream broken after 2 tokens with an error event: %d\n%s", status, stream)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

// TestFakeLLMResumesAStallAfterBreakStallFor: with --break-mode stall
// --break-stall-for D, a broken stream goes silent after --break-after
// tokens for D, then completes as an unbroken one does.
func TestFakeLLMResumesAStallAfterBreakStallFor(t *testing.T) {
	noLeaks(t)
	const stall = 50 * time.Millisecond // model time, real at the default --time-scale 1
	r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "6",
		"--break-share", "1", "--break-after", "2", "--break-mode", "stall", "--break-stall-for", stall.String())
	base := r.waitFor(servingURL)
	sent := time.Now()
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"q"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(sent)
	// The role chunk's empty content and six tokens', then [DONE].
	if err != nil || resp.StatusCode != http.StatusOK || strings.Count(string(data), `"content":"`) != 7 ||
		!strings.Contains(string(data), "[DONE]") || strings.Contains(string(data), `data: {"error":`) {
		t.Errorf("a stream stalled after 2 tokens for %v: %d %v\n%s", stall, resp.StatusCode, err, data)
	}
	if took < stall {
		t.Errorf("the stream took %v, less than its stall's %v", took, stall)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("fakellm: %v", err)
	}
}

// TestFakeLLMMalformsAndTruncatesStreamsAsItsFlagsSay: --break-mode
// malformed ends a stream after --break-after tokens with one event whose
// data is not JSON; --break-mode truncate ends it normally there, at its
// length limit.
func TestFakeLLMMalformsAndTruncatesStreamsAsItsFlagsSay(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		check func(stream string) bool
	}{
		{"malformed", func(stream string) bool {
			events := strings.Split(strings.TrimSuffix(stream, "\n\n"), "\n\n")
			last := strings.TrimPrefix(events[len(events)-1], "data: ")
			return !json.Valid([]byte(last)) && !strings.Contains(stream, "[DONE]") && !strings.Contains(stream, `"finish_reason":"`)
		}},
		{"truncate", func(stream string) bool {
			return strings.Count(stream, `"finish_reason":"length"`) == 1 && strings.HasSuffix(stream, "data: [DONE]\n\n")
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			noLeaks(t)
			r := startCmd(t, "fakellm", "--listen", "127.0.0.1:0", "--instant", "6",
				"--break-share", "1", "--break-after", "2", "--break-mode", tc.mode)
			base := r.waitFor(servingURL)
			resp, err := http.Post(base+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"q"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			// The role chunk's empty content and two tokens'.
			if err != nil || resp.StatusCode != http.StatusOK || strings.Count(string(data), `"content":"`) != 3 || !tc.check(string(data)) {
				t.Errorf("a stream broken after 2 tokens by %s: %d %v\n%s", tc.mode, resp.StatusCode, err, data)
			}
			if err := r.stop(); err != nil {
				t.Fatalf("fakellm: %v", err)
			}
		})
	}
}
