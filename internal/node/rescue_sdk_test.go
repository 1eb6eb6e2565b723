package node

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// These tests break committed streams at simulated providers and read them
// through the official SDKs (docs/architecture.md §6, "Rescue"): a stream
// cut after its commit is continued on another route, and its caller reads
// one whole answer.

// rescueQuestion is what every rescue test asks, and rescueMaxTokens its cap.
const (
	rescueQuestion  = "What is a hedgerow?"
	rescueMaxTokens = 50
)

// longModel is calmModel answering 24 tokens: a break after 6 leaves most
// of the answer to a continuation.
func longModel(t *testing.T) *workload.Model {
	m := calmModel(t)
	m.OutputTokens = workload.LogNormal{Mu: math.Log(24)}
	return m
}

// rescueRoute is one simulated route of a rescue test.
type rescueRoute struct {
	name string
	opts fakellm.Options
	// model is the route's; nil is longModel.
	model *workload.Model
}

// startRescueServe runs serve over routes speaking provider, each
// continuing in style, in two pools: "rescued" (rescue: continue, max 1)
// and "plain" (rescue off, the default). Its default policy's stall bound
// is stallBound. It returns the gateway's base URL.
func startRescueServe(t *testing.T, provider string, style config.Continuation, stallBound time.Duration, routes ...rescueRoute) string {
	t.Helper()
	var y strings.Builder
	y.WriteString("http:\n  listen: 127.0.0.1:0\nroutes:\n")
	var names []string
	for i, r := range routes {
		m := r.model
		if m == nil {
			m = longModel(t)
		}
		opts := r.opts
		if opts.Continuation == "" {
			// The simulated provider continues as the route says it does.
			opts.Continuation = fakellm.Continuation(style)
		}
		url := fakeServer(t, i, m, opts)
		if provider == "openai" {
			url += "/v1"
		}
		fmt.Fprintf(&y, "  - {name: %s, provider: %s, base_url: %q, model: m, continuation: %s}\n", r.name, provider, url, style)
		names = append(names, r.name)
	}
	list := strings.Join(names, ", ")
	fmt.Fprintf(&y, `pools:
  rescued: {routes: [%s], rescue: {mode: continue, max: 1}}
  plain: {routes: [%s]}
policies:
  default: {control_fraction: 0, deadline: 10s, heartbeat_interval: 50ms, stall_after_first_token: %s, stall_floor: %s}
tenants:
  acme: {api_key_hashes: [%q]}
`, list, list, stallBound, stallBound, config.HashAPIKey(sdkKey))
	return serveYAML(t, "rescue.yaml", y.String())
}

// fullAnswer is the simulated providers' whole answer to rescueQuestion
// (with the leading system prompt an Anthropic request carries, if any).
func fullAnswer(t *testing.T, system string) string {
	t.Helper()
	msgs := []schemas.Message{{Role: "user", Content: jsonText(t, rescueQuestion)}}
	if system != "" {
		// The Anthropic SDK sends the system prompt and the question as
		// text blocks, which the simulator reads as text parts.
		parts := func(text string) json.RawMessage {
			return jsonText(t, []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}{{"text", text}})
		}
		msgs = []schemas.Message{{Role: "system", Content: parts(system)}, {Role: "user", Content: parts(rescueQuestion)}}
	}
	text, err := fakellm.FullText(longModel(t), msgs, rescueMaxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

func jsonText(t *testing.T, s any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// breaking is a route that breaks every stream after its sixth token.
func breaking(name string, mode fakellm.BreakMode) rescueRoute {
	return rescueRoute{name: name, opts: fakellm.Options{BreakShare: 1, BreakAfter: 6, BreakMode: mode}}
}

// openAIStream streams rescueQuestion from pool through the OpenAI SDK's
// accumulator, returning what it accumulated and the stream's error.
func openAIStream(t *testing.T, base, pool string, opts ...option.RequestOption) (openai.ChatCompletionAccumulator, string, error) {
	t.Helper()
	client := sdkClient(t, base, sdkKey)
	params := openai.ChatCompletionNewParams{
		Model:         pool,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(rescueQuestion)},
		MaxTokens:     openai.Int(rescueMaxTokens),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	stream := client.Chat.Completions.NewStreaming(context.Background(), params, opts...)
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	var deltas strings.Builder
	for stream.Next() {
		chunk := stream.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused a chunk: %s", chunk.RawJSON())
		}
		if len(chunk.Choices) > 0 {
			deltas.WriteString(chunk.Choices[0].Delta.Content)
		}
	}
	return acc, deltas.String(), stream.Err()
}

func TestRescueSplicesACutOpenAIStreamIntoTheWholeAnswer(t *testing.T) {
	want := fullAnswer(t, "")
	for _, tc := range []struct {
		style config.Continuation
		mode  fakellm.BreakMode
	}{
		{config.ContinuationContinueFinalMessage, fakellm.BreakCut},
		{config.ContinuationContinueFinalMessage, fakellm.BreakError},
		{config.ContinuationPrefix, fakellm.BreakCut},
	} {
		t.Run(fmt.Sprintf("%s after a %s", tc.style, tc.mode), func(t *testing.T) {
			base := startRescueServe(t, "openai", tc.style, 2*time.Second, breaking("r-a", tc.mode), breaking("r-b", tc.mode))
			var first *http.Response
			key := option.WithHeader(frontdoor.HeaderIdempotencyKey, "rescued-"+string(tc.style)+"-"+string(tc.mode))
			acc, deltas, err := openAIStream(t, base, "rescued", key, option.WithResponseInto(&first))
			if err != nil {
				t.Fatalf("the rescued stream failed: %v (after %q)", err, deltas)
			}
			if len(acc.Choices) != 1 || deltas != want || acc.Choices[0].Message.Content != want || acc.Choices[0].FinishReason != "stop" {
				t.Fatalf("accumulated %+v, deltas %q; want the whole answer %q, one stop", acc.Choices, deltas, want)
			}
			words := int64(len(strings.Fields(want)))
			if u := acc.Usage; u.CompletionTokens != words || u.PromptTokens <= 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Fatalf("usage %+v, want the whole answer's %d completion tokens", u, words)
			}
			spliced(t, base)
			// The idempotent replay keeps the joined answer.
			var again *http.Response
			if _, replayed, err := openAIStream(t, base, "rescued", key, option.WithResponseInto(&again)); err != nil || replayed != want ||
				again.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" || again.Header.Get(frontdoor.HeaderGate) != first.Header.Get(frontdoor.HeaderGate) {
				t.Fatalf("the retry read %q (%v, replayed %q), want the joined answer replayed under the same gate",
					replayed, err, again.Header.Get(frontdoor.HeaderIdempotentReplayed))
			}
			// Rescue off: the same break ends the stream with an error.
			if _, deltas, err := openAIStream(t, base, "plain"); err == nil || !strings.Contains(err.Error(), string(schemas.ErrStreamInterrupted)) {
				t.Fatalf("without rescue the broken stream ended %v after %q, want stream_interrupted", err, deltas)
			}
		})
	}
}

func TestRescueSplicesACutAnthropicStreamIntoTheWholeAnswer(t *testing.T) {
	const system = "Answer briefly."
	want := fullAnswer(t, system)
	base := startRescueServe(t, "anthropic", config.ContinuationPrefill, 2*time.Second,
		breaking("c-a", fakellm.BreakCut), breaking("c-b", fakellm.BreakCut))
	client := claudeClient(t, base, sdkKey)
	params := anthropic.MessageNewParams{
		Model:     "rescued",
		MaxTokens: rescueMaxTokens,
		System:    []anthropic.TextBlockParam{{Text: system}},
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(rescueQuestion))},
	}
	stream := client.Messages.NewStreaming(context.Background(), params)
	defer stream.Close()
	var acc anthropic.Message
	var text strings.Builder
	for stream.Next() {
		ev := stream.Current()
		if err := acc.Accumulate(ev); err != nil {
			t.Fatalf("Accumulate %s: %v", ev.Type, err)
		}
		if ev.Type == "content_block_delta" {
			text.WriteString(ev.Delta.Text)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the rescued stream failed: %v (after %q)", err, text.String())
	}
	if len(acc.Content) != 1 || acc.Content[0].Text != want || text.String() != want || acc.StopReason != anthropic.StopReasonEndTurn {
		t.Fatalf("accumulated %s, text %q; want the whole answer %q", acc.RawJSON(), text.String(), want)
	}
	if words := int64(len(strings.Fields(want))); acc.Usage.OutputTokens != words {
		t.Fatalf("usage %+v, want the whole answer's %d output tokens", acc.Usage, words)
	}
	spliced(t, base)
}

// slowStart is longModel whose first token takes 1.5 model seconds.
func slowStart(t *testing.T) *workload.Model {
	m := longModel(t)
	m.TTFT = workload.TTFT{Main: workload.LogNormalMedian(1.5, 0), Stall: workload.LogNormalMedian(1.5, 0)}
	return m
}

// rescues reads hedgerow_rescues_total{outcome} from the gateway at base.
func rescues(t *testing.T, base, outcome string) float64 {
	t.Helper()
	_, metrics := get(t, base+"/metrics")
	return metricValue(t, string(metrics), `hedgerow_rescues_total{outcome="`+outcome+`"}`)
}

// TestRescueAStallMidAnswerIsRacedByAContinuation: a stream that stalls
// after its commit keeps its chance while a continuation starts beside it
// at the stall bound (300 ms). Stalled for good, the continuation's first
// token takes the stream over; stalled for 400 ms and resumed before the
// continuation's first token (1.5 s away), the original keeps it and the
// continuation is cancelled. Either way the caller reads the whole answer.
func TestRescueAStallMidAnswerIsRacedByAContinuation(t *testing.T) {
	want := fullAnswer(t, "")
	tests := []struct {
		name     string
		route    func(name string) rescueRoute
		outcome  string
		notTaken string
	}{
		{"the continuation talks first and takes the stream", func(name string) rescueRoute {
			return breaking(name, fakellm.BreakStall)
		}, "won", "original_won"},
		{"the original resumes first and keeps it", func(name string) rescueRoute {
			r := breaking(name, fakellm.BreakStall)
			r.model = slowStart(t)
			// A model second is a real one on these routes.
			r.opts.TimeScale, r.opts.BreakStallFor = 1, 400*time.Millisecond
			return r
		}, "original_won", "won"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := startRescueServe(t, "openai", config.ContinuationContinueFinalMessage, 300*time.Millisecond,
				tc.route("s-a"), tc.route("s-b"))
			acc, deltas, err := openAIStream(t, base, "rescued")
			if err != nil {
				t.Fatalf("the stalled stream failed: %v (after %q)", err, deltas)
			}
			if deltas != want || acc.Choices[0].FinishReason != "stop" {
				t.Fatalf("deltas %q, finish %q; want the whole answer %q, one stop", deltas, acc.Choices[0].FinishReason, want)
			}
			if got := rescues(t, base, tc.outcome); got != 1 {
				t.Fatalf("hedgerow_rescues_total{outcome=%q} = %v, want 1", tc.outcome, got)
			}
			if got := rescues(t, base, tc.notTaken); got != 0 {
				t.Fatalf("hedgerow_rescues_total{outcome=%q} = %v, want 0", tc.notTaken, got)
			}
		})
	}
}

// TestRescueSplicesACutResponsesStreamOnAnthropicRoutes: a Responses
// stream is continued by assistant prefill on an Anthropic route (OpenAI's
// /responses cannot continue), and the Responses events carry the whole
// answer once.
func TestRescueSplicesACutResponsesStreamOnAnthropicRoutes(t *testing.T) {
	want := fullAnswer(t, "")
	base := startRescueServe(t, "anthropic", config.ContinuationPrefill, 2*time.Second,
		breaking("c-a", fakellm.BreakCut), breaking("c-b", fakellm.BreakCut))
	client := sdkClient(t, base, sdkKey)
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model:           "rescued",
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String(rescueQuestion)},
		MaxOutputTokens: openai.Int(rescueMaxTokens),
	})
	defer stream.Close()
	var deltas strings.Builder
	var done string
	var final responses.Response
	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			deltas.WriteString(ev.AsResponseOutputTextDelta().Delta)
		case "response.output_text.done":
			done = ev.AsResponseOutputTextDone().Text
		case "response.completed":
			final = ev.AsResponseCompleted().Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("the rescued stream failed: %v (after %q)", err, deltas.String())
	}
	if deltas.String() != want || done != want || final.OutputText() != want || final.Status != responses.ResponseStatusCompleted {
		t.Fatalf("deltas %q, done %q, completed %q (%s); want the whole answer %q", deltas.String(), done, final.OutputText(), final.Status, want)
	}
	if words := int64(len(strings.Fields(want))); final.Usage.OutputTokens != words {
		t.Fatalf("usage %+v, want the whole answer's %d output tokens", final.Usage, words)
	}
	spliced(t, base)
}

// spliced checks that the gateway at base spliced one continuation into a
// stream: the answer read whole was rescued, not simply unbroken.
func spliced(t *testing.T, base string) {
	t.Helper()
	if won := rescues(t, base, "won"); won != 1 {
		t.Fatalf("hedgerow_rescues_total{outcome=\"won\"} = %v, want 1", won)
	}
}
