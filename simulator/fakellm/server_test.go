package fakellm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

func TestNonStreamingAnswerIsAChatCompletion(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 40), Seed: 1, TimeScale: fastScale})

	status, hdr, body := fs.post(t, chatBody("hello", ""))
	if status != http.StatusOK || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
		t.Fatalf("status %d, content type %q: %s", status, hdr.Get("Content-Type"), body)
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Model != "gpt-4o" || c.Created == 0 {
		t.Errorf("envelope = %+v", c)
	}
	if len(c.Choices) != 1 {
		t.Fatalf("%d choices, want 1", len(c.Choices))
	}
	ch := c.Choices[0]
	if ch.Message.Role != "assistant" || ch.FinishReason != "stop" {
		t.Errorf("choice = %+v, want assistant/stop", ch)
	}
	if c.Usage == nil || c.Usage.CompletionTokens != 40 || c.Usage.PromptTokens < 1 ||
		c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
		t.Errorf("usage = %+v, want 40 completion tokens that add up", c.Usage)
	}
	if words := len(strings.Fields(ch.Message.Content)); words != 40 {
		t.Errorf("content has %d words, want one per token (40)", words)
	}

	rec := fs.nextRecord(t)
	if rec.End != fakellm.EndCompleted || rec.Status != http.StatusOK || rec.TokensSent != 40 ||
		rec.BilledOutputTokens != 40 || rec.BilledInputTokens != int64(c.Usage.PromptTokens) || rec.Stream {
		t.Errorf("record = %+v", rec)
	}
}

func TestStreamingAnswerIsWellFormedSSE(t *testing.T) {
	for _, tc := range []struct {
		name         string
		extra        string
		includeUsage bool
	}{
		{"without usage", `"stream":true`, false},
		{"with include_usage", `"stream":true,"stream_options":{"include_usage":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Workload: workload.GPT4o, Seed: 7, TimeScale: fastScale})
			// Several requests so the drawn lengths and coalescing vary.
			answered := 0
			for i := range 5 {
				status, hdr, body := fs.post(t, chatBody("stream me "+string(rune('a'+i)), tc.extra))
				rec := fs.nextRecord(t)
				if rec.Outcome != "ok" {
					continue // this seed's draw for the request failed; the error tests cover that
				}
				if status != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" {
					t.Fatalf("status %d, content type %q", status, hdr.Get("Content-Type"))
				}
				s := parseStream(t, body, tc.includeUsage)
				if s.finishReason != "stop" {
					t.Errorf("finish_reason = %q, want stop", s.finishReason)
				}
				if s.tokens != rec.OutputTokens || rec.TokensSent != rec.OutputTokens || rec.End != fakellm.EndCompleted {
					t.Errorf("streamed %d tokens; record %+v", s.tokens, rec)
				}
				if tc.includeUsage && (s.usage.CompletionTokens != s.tokens ||
					s.usage.TotalTokens != s.usage.PromptTokens+s.usage.CompletionTokens) {
					t.Errorf("usage %+v does not match %d streamed tokens", *s.usage, s.tokens)
				}
				if rec.FirstByteRealMs == nil || rec.FirstByteModelMs == nil {
					t.Errorf("record lacks first byte times: %+v", rec)
				}
				answered++
			}
			if answered == 0 {
				t.Fatal("no request of this seed was answered; pick another seed")
			}
		})
	}
}

func TestMaxTokensCutsTheAnswerWithFinishReasonLength(t *testing.T) {
	for _, tc := range []struct {
		name       string
		extra      string
		wantTokens int
		wantFinish string
	}{
		{"max_tokens below the drawn length", `"max_tokens":3`, 3, "length"},
		{"max_completion_tokens below the drawn length", `"max_completion_tokens":5`, 5, "length"},
		{"the smaller of both caps applies", `"max_tokens":9,"max_completion_tokens":4`, 4, "length"},
		{"max_tokens above the drawn length", `"max_tokens":500`, 100, "stop"},
		{"max_tokens equal to the drawn length", `"max_tokens":100`, 100, "stop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Model: steadyModel(t, 100), Seed: 1, TimeScale: fastScale})

			status, _, body := fs.post(t, chatBody("count", tc.extra))
			var c completion
			if err := json.Unmarshal(body, &c); err != nil || status != http.StatusOK {
				t.Fatalf("status %d: %v: %s", status, err, body)
			}
			if c.Usage.CompletionTokens != tc.wantTokens || c.Choices[0].FinishReason != tc.wantFinish {
				t.Errorf("non-streaming: %d tokens, finish %q; want %d, %q",
					c.Usage.CompletionTokens, c.Choices[0].FinishReason, tc.wantTokens, tc.wantFinish)
			}
			fs.nextRecord(t)

			status, _, body = fs.post(t, chatBody("count", tc.extra+`,"stream":true`))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			s := parseStream(t, body, false)
			if s.tokens != tc.wantTokens || s.finishReason != tc.wantFinish {
				t.Errorf("streaming: %d tokens, finish %q; want %d, %q", s.tokens, s.finishReason, tc.wantTokens, tc.wantFinish)
			}
			if rec := fs.nextRecord(t); rec.FinishReason != tc.wantFinish || rec.OutputTokens != tc.wantTokens {
				t.Errorf("record = %+v", rec)
			}
		})
	}
}

func TestSameBodyOnTwoRoutesDrawsTheSameAnswerWithItsOwnLatency(t *testing.T) {
	routes := []*fakeServer{
		startServer(t, fakellm.Options{Workload: workload.GPT4o, Seed: 3, TimeScale: fastScale, Route: 0}),
		startServer(t, fakellm.Options{Workload: workload.GPT4o, Seed: 3, TimeScale: fastScale, Route: 1}),
	}
	latencyDiffers := false
	for i := range 6 {
		prompt := "same question " + string(rune('a'+i))
		var contents [2]string
		var recs [2]fakellm.Record
		for r, fs := range routes {
			// The second route gets the body with other whitespace, as a
			// re-encoding hop would send it: the id must not change.
			body := chatBody(prompt, `"stream":true`)
			if r == 1 {
				body = strings.ReplaceAll(body, `,"`, `, "`)
			}
			_, _, data := fs.post(t, body)
			recs[r] = fs.nextRecord(t)
			if recs[r].Outcome == "ok" {
				contents[r] = parseStream(t, data, false).content
			}
		}
		if recs[0].RequestID != recs[1].RequestID || recs[0].OutputTokens != recs[1].OutputTokens {
			t.Errorf("request %d: routes drew id/length %d/%d and %d/%d", i,
				recs[0].RequestID, recs[0].OutputTokens, recs[1].RequestID, recs[1].OutputTokens)
		}
		if recs[0].Outcome == "ok" && recs[1].Outcome == "ok" {
			if contents[0] != contents[1] {
				t.Errorf("request %d: routes answered different text", i)
			}
			latencyDiffers = latencyDiffers || *recs[0].FirstByteModelMs != *recs[1].FirstByteModelMs
		}
	}
	if !latencyDiffers {
		t.Error("both routes drew the same first byte for every request; each route should draw its own latency")
	}
}

func TestDisconnectMidStreamBillsTheCancellationLag(t *testing.T) {
	// 1000 tokens at exactly 10 per model second take 100 model seconds,
	// a real second at this scale: the client leaves long before the end.
	// A 1 s cancellation lag is then exactly 10 more billed tokens.
	m := steadyModel(t, 1000)
	m.TokensPerSecond, m.ITLSigma, m.CancelLag = 10, 0, time.Second
	const lagTokens = 10
	fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: 0.01})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := fs.do(t, ctx, http.MethodPost, "/v1/chat/completions", chatBody("long answer", `"stream":true`))
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	for contentEvents := 0; contentEvents < 2; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"role"`) {
			contentEvents++
		}
	}
	cancel()

	rec := fs.nextRecord(t)
	if rec.End != fakellm.EndDisconnected || rec.DisconnectUnixMs == nil || rec.DisconnectModelMs == nil {
		t.Fatalf("record = %+v, want a disconnect", rec)
	}
	if rec.TokensSent < 1 || rec.TokensSent >= 1000 {
		t.Errorf("tokens sent = %d, want part of the answer", rec.TokensSent)
	}
	// The last token sent may have been forced out a rounding error before
	// its model time, hence one token of slack.
	if rec.BilledOutputTokens < int64(rec.TokensSent+lagTokens-1) {
		t.Errorf("billed %d output tokens after sending %d; want the %d-token lag on top",
			rec.BilledOutputTokens, rec.TokensSent, lagTokens)
	}
	if rec.BilledInputTokens < 1 || rec.FinishReason != "" {
		t.Errorf("record = %+v, want input billed and no finish reason", rec)
	}
	st, err := fs.fake.Stats(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Totals.ByEnd[fakellm.EndDisconnected] != 1 || st.Totals.BilledOutputTokens != rec.BilledOutputTokens {
		t.Errorf("totals = %+v", st.Totals)
	}
}

func TestRateLimitedAnswerCarriesRetryAfter(t *testing.T) {
	// A frozen clock keeps both requests at model time 0, so the one-request
	// bucket cannot refill between them.
	frozen := time.Unix(1_700_000_000, 0)
	fs := startServer(t, fakellm.Options{
		Model: steadyModel(t, 5), Seed: 1, TimeScale: fastScale,
		RateLimit: workload.RateLimit{RPM: 1},
		Now:       func() time.Time { return frozen },
	})

	if status, _, body := fs.post(t, chatBody("first", "")); status != http.StatusOK {
		t.Fatalf("first request: status %d: %s", status, body)
	}
	fs.nextRecord(t)
	status, hdr, body := fs.post(t, chatBody("second", ""))
	if status != http.StatusTooManyRequests {
		t.Fatalf("second request: status %d, want 429: %s", status, body)
	}
	// The bucket refills in 60 model seconds: 60 real ms at this scale.
	if got := hdr.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1 (real seconds, rounded up)", got)
	}
	if got := hdr.Get("Retry-After-Ms"); got != "60" {
		t.Errorf("Retry-After-Ms = %q, want 60", got)
	}
	if typ, code := openAIError(t, body); typ != "requests" || code != "rate_limit_exceeded" {
		t.Errorf("error type/code = %q/%q", typ, code)
	}
	rec := fs.nextRecord(t)
	if rec.Outcome != "rate_limited" || rec.BilledInputTokens != 0 || rec.BilledOutputTokens != 0 {
		t.Errorf("record = %+v, want a rate-limited attempt billed nothing", rec)
	}
}

func TestServerErrorAnswerIsOpenAIShaped(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run("stream="+map[bool]string{false: "false", true: "true"}[stream], func(t *testing.T) {
			m := steadyModel(t, 10)
			m.ErrorFraction = 1
			fs := startServer(t, fakellm.Options{Model: m, Seed: 1, TimeScale: fastScale})

			extra := ""
			if stream {
				extra = `"stream":true`
			}
			status, hdr, body := fs.post(t, chatBody("fail", extra))
			if status != http.StatusInternalServerError || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Fatalf("status %d, content type %q", status, hdr.Get("Content-Type"))
			}
			if typ, _ := openAIError(t, body); typ != "server_error" {
				t.Errorf("error type = %q, want server_error", typ)
			}
			rec := fs.nextRecord(t)
			if rec.Outcome != "server_error" || rec.BilledInputTokens < 1 || rec.BilledOutputTokens != 0 || rec.TokensSent != 0 {
				t.Errorf("record = %+v, want input billed and no output", rec)
			}
		})
	}
}

func TestModelsListsTheModel(t *testing.T) {
	for _, tc := range []struct {
		name, modelID, want string
	}{
		{"the workload's name by default", "", workload.Sonnet},
		{"the configured id", "claude-fake", "claude-fake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Workload: workload.Sonnet, ModelID: tc.modelID, TimeScale: fastScale})
			resp := fs.do(t, context.Background(), http.MethodGet, "/v1/models", "")
			defer resp.Body.Close()
			var list struct {
				Object string `json:"object"`
				Data   []struct {
					ID      string `json:"id"`
					Object  string `json:"object"`
					OwnedBy string `json:"owned_by"`
				} `json:"data"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %v", resp.StatusCode, err)
			}
			if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != tc.want ||
				list.Data[0].Object != "model" || list.Data[0].OwnedBy == "" {
				t.Errorf("list = %+v, want one model %q", list, tc.want)
			}
		})
	}
}

func TestInvalidRequestsAreAnsweredWithOpenAIErrors(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, body string
		wantStatus               int
		wantCode                 string
		countsInvalid            bool
	}{
		{"malformed JSON", http.MethodPost, "/v1/chat/completions", `{"messages":[`, http.StatusBadRequest, "invalid_json", true},
		{"a JSON array body", http.MethodPost, "/v1/chat/completions", `[]`, http.StatusBadRequest, "invalid_json", true},
		{"no messages field", http.MethodPost, "/v1/chat/completions", `{"model":"x"}`, http.StatusBadRequest, "invalid_value", true},
		{"empty messages", http.MethodPost, "/v1/chat/completions", `{"messages":[]}`, http.StatusBadRequest, "invalid_value", true},
		{"a message without a role", http.MethodPost, "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, http.StatusBadRequest, "invalid_value", true},
		{"negative max_tokens", http.MethodPost, "/v1/chat/completions", chatBody("x", `"max_tokens":-1`), http.StatusBadRequest, "invalid_value", true},
		{"more than one choice", http.MethodPost, "/v1/chat/completions", chatBody("x", `"n":2`), http.StatusBadRequest, "invalid_value", true},
		{"a body over the size cap", http.MethodPost, "/v1/chat/completions", chatBody(strings.Repeat("x", 2048), ""), http.StatusRequestEntityTooLarge, "request_too_large", true},
		{"GET on chat completions", http.MethodGet, "/v1/chat/completions", "", http.StatusMethodNotAllowed, "method_not_allowed", false},
		{"POST on models", http.MethodPost, "/v1/models", "{}", http.StatusMethodNotAllowed, "method_not_allowed", false},
		{"an unknown path", http.MethodPost, "/v1/completions", "{}", http.StatusNotFound, "unknown_url", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := startServer(t, fakellm.Options{Workload: workload.GPT4o, TimeScale: fastScale, MaxBodyBytes: 1024})
			resp := fs.do(t, context.Background(), tc.method, tc.path, tc.body)
			defer resp.Body.Close()
			var raw json.RawMessage
			if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status = %d, want %d: %s", resp.StatusCode, tc.wantStatus, raw)
			}
			if typ, code := openAIError(t, raw); typ != "invalid_request_error" || code != tc.wantCode {
				t.Errorf("error type/code = %q/%q, want invalid_request_error/%q", typ, code, tc.wantCode)
			}
			if tc.wantStatus == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
			st, err := fs.fake.Stats(0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 1}[tc.countsInvalid]; st.Totals.Invalid != want || st.Totals.Requests != 0 {
				t.Errorf("totals = %+v, want %d invalid and no request reaching the provider", st.Totals, want)
			}
		})
	}
}

// hangModel never sends a first byte.
func hangModel(t *testing.T) *workload.Model {
	t.Helper()
	m := steadyModel(t, 10)
	m.TTFT.HangFraction = 1
	return m
}

func TestHangHoldsTheConnectionUntilTheClientCancels(t *testing.T) {
	// Real time: the 30 s hang cap is far beyond the test, so only the
	// client's cancel can end the request.
	fs := startServer(t, fakellm.Options{Model: hangModel(t), Seed: 1, TimeScale: 1})

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, fs.http.URL+"/v1/chat/completions",
			strings.NewReader(chatBody("hang", `"stream":true`)))
		if err == nil {
			var resp *http.Response
			if resp, err = fs.http.Client().Do(req); err == nil {
				resp.Body.Close()
			}
		}
		errc <- err
	}()
	<-fs.arrived
	cancel()

	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client got %v, want its own cancellation (no answer)", err)
	}
	rec := fs.nextRecord(t)
	if rec.Outcome != "hang" || rec.End != fakellm.EndDisconnected || rec.Status != 0 || rec.FirstByteRealMs != nil {
		t.Errorf("record = %+v, want a hang that sent nothing until the disconnect", rec)
	}
	if rec.BilledInputTokens < 1 || rec.BilledOutputTokens != 0 {
		t.Errorf("billed %d/%d, want input only", rec.BilledInputTokens, rec.BilledOutputTokens)
	}
}

func TestHangIsAnswered504AtTheHangCap(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: hangModel(t), Seed: 1, TimeScale: fastScale})

	status, _, body := fs.post(t, chatBody("hang", ""))
	if status != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504: %s", status, body)
	}
	if typ, _ := openAIError(t, body); typ != "timeout" {
		t.Errorf("error type = %q, want timeout", typ)
	}
	if rec := fs.nextRecord(t); rec.End != fakellm.EndHangCapped {
		t.Errorf("record = %+v, want hang_capped", rec)
	}
}

func TestCloseAnswersHeldRequestsWithServiceUnavailable(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: hangModel(t), Seed: 1, TimeScale: 1})

	type answer struct {
		status int
		body   []byte
	}
	answers := make(chan answer, 1)
	go func() {
		status, _, body := fs.post(t, chatBody("hang", ""))
		answers <- answer{status, body}
	}()
	<-fs.arrived
	fs.fake.Close()

	a := <-answers
	if a.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", a.status, a.body)
	}
	openAIError(t, a.body)
	if rec := fs.nextRecord(t); rec.End != fakellm.EndShutdown || rec.DisconnectUnixMs == nil {
		t.Errorf("record = %+v, want a shutdown", rec)
	}
	if status, _, _ := fs.post(t, chatBody("after close", "")); status != http.StatusServiceUnavailable {
		t.Errorf("request after Close: status %d, want 503", status)
	}
}

func TestStatsSinceReturnsOnlyNewerRecordsFromABoundedRing(t *testing.T) {
	fs := startServer(t, fakellm.Options{Model: steadyModel(t, 3), Seed: 1, TimeScale: fastScale, StatsCapacity: 3})
	for i := range 5 {
		fs.post(t, chatBody("SECRET-PROMPT "+string(rune('a'+i)), ""))
		fs.nextRecord(t)
	}
	for _, tc := range []struct {
		name          string
		since         uint64
		limit         int
		wantSeqs      []uint64
		wantNextSince uint64
		wantDropped   uint64
		wantMore      bool
	}{
		{"from the start, past evicted records", 0, 0, []uint64{3, 4, 5}, 5, 2, false},
		{"only records after since", 3, 0, []uint64{4, 5}, 5, 0, false},
		{"nothing new", 5, 0, nil, 5, 0, false},
		{"a limit leaves more", 2, 1, []uint64{3}, 3, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := fs.fake.Stats(tc.since, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for _, r := range st.Requests {
				seqs = append(seqs, r.Seq)
			}
			if !equalSeqs(seqs, tc.wantSeqs) || st.NextSince != tc.wantNextSince || st.Dropped != tc.wantDropped || st.More != tc.wantMore {
				t.Errorf("seqs %v next %d dropped %d more %v; want %v %d %d %v",
					seqs, st.NextSince, st.Dropped, st.More, tc.wantSeqs, tc.wantNextSince, tc.wantDropped, tc.wantMore)
			}
			if st.Totals.Requests != 5 || st.Totals.ByOutcome["ok"] != 5 || st.Totals.InFlight != 0 {
				t.Errorf("totals = %+v, want all 5 requests", st.Totals)
			}
		})
	}
	if _, err := fs.fake.Stats(6, 0); err == nil {
		t.Error("since past the last record was accepted")
	}

	resp := fs.do(t, context.Background(), http.MethodGet, "/stats?since=3", "")
	defer resp.Body.Close()
	var body json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /stats: status %d: %v", resp.StatusCode, err)
	}
	var st fakellm.Stats
	if err := json.Unmarshal(body, &st); err != nil || len(st.Requests) != 2 || st.Workload != workload.GPT4o {
		t.Errorf("GET /stats?since=3 = %s (%v)", body, err)
	}
	if strings.Contains(string(body), "SECRET") {
		t.Error("/stats leaks prompt text")
	}
	for _, q := range []string{"since=x", "since=99", "limit=-1"} {
		r := fs.do(t, context.Background(), http.MethodGet, "/stats?"+q, "")
		var raw json.RawMessage
		if err := json.NewDecoder(r.Body).Decode(&raw); err != nil || r.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /stats?%s: status %d, want 400 (%v)", q, r.StatusCode, err)
		}
		r.Body.Close()
		openAIError(t, raw)
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestNewRejectsConfigsItCannotRun(t *testing.T) {
	bad := steadyModel(t, 5)
	bad.TokensPerSecond = math.NaN()
	for _, tc := range []struct {
		name string
		cfg  fakellm.Options
		want error
	}{
		{"an unknown workload", fakellm.Options{Workload: "gpt5"}, workload.ErrUnknownModel},
		{"a route the degraded model lacks", fakellm.Options{Workload: workload.Degraded, Route: 3}, workload.ErrNoSuchRoute},
		{"a negative time scale", fakellm.Options{Workload: workload.GPT4o, TimeScale: -1}, fakellm.ErrInvalidOptions},
		{"a negative stats capacity", fakellm.Options{Workload: workload.GPT4o, StatsCapacity: -1}, fakellm.ErrInvalidOptions},
		{"a negative hang cap", fakellm.Options{Workload: workload.GPT4o, HangCap: -time.Second}, fakellm.ErrInvalidOptions},
		{"a negative stall of a break", fakellm.Options{Workload: workload.GPT4o, BreakMode: fakellm.BreakStall, BreakStallFor: -time.Second}, fakellm.ErrInvalidOptions},
		{"a break that resumes but does not stall", fakellm.Options{Workload: workload.GPT4o, BreakMode: fakellm.BreakCut, BreakStallFor: time.Second}, fakellm.ErrInvalidOptions},
		{"a resuming stall of the default mode, a cut", fakellm.Options{Workload: workload.GPT4o, BreakStallFor: time.Second}, fakellm.ErrInvalidOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := fakellm.New(tc.cfg); !errors.Is(err, tc.want) {
				t.Errorf("New = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := fakellm.New(fakellm.Options{Model: bad}); err == nil {
		t.Error("an invalid explicit model was accepted")
	}
}

func TestHealthzAnswersOK(t *testing.T) {
	fs := startServer(t, fakellm.Options{Workload: workload.Degraded, Route: 2, TimeScale: fastScale})
	resp := fs.do(t, context.Background(), http.MethodGet, "/healthz", "")
	defer resp.Body.Close()
	var body map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK || body["status"] != "ok" {
		t.Errorf("GET /healthz: status %d body %v (%v)", resp.StatusCode, body, err)
	}
}

// flushCounter is a ResponseWriter that counts the writes a handler flushes.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
}

func (f *flushCounter) Flush() { f.flushes++ }

func TestStreamCoalescesTokensDueWithinAFlushInterval(t *testing.T) {
	// 500 tokens 154 µs apart in real time: one write per token would be
	// 500 flushes; at most one per millisecond is about 80.
	const tokens = 500
	fake, err := fakellm.New(fakellm.Options{Model: steadyModel(t, tokens), Seed: 1, TimeScale: 0.02})
	if err != nil {
		t.Fatal(err)
	}
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody("coalesce", `"stream":true`)))
	fake.ServeHTTP(w, req)

	if s := parseStream(t, w.Body.Bytes(), false); s.tokens != tokens {
		t.Fatalf("streamed %d tokens, want %d", s.tokens, tokens)
	}
	if w.flushes < 1 || w.flushes > tokens/3 {
		t.Errorf("%d flushes for %d tokens; want tokens due together written together", w.flushes, tokens)
	}
}
