package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// story is the request the continuation tests continue: a system prompt,
// a question, a cap of 100 tokens, a temperature and a user id.
func story() *schemas.ChatRequest {
	temp := 0.5
	return &schemas.ChatRequest{
		Model: "general",
		Messages: []schemas.Message{
			{Role: schemas.MessageSystem, Content: schemas.TextContent("You tell short stories.")},
			{Role: schemas.MessageUser, Content: schemas.TextContent("Tell me a story.")},
		},
		MaxTokens:   100,
		Temperature: &temp,
		Extra:       map[string]json.RawMessage{"user": json.RawMessage(`"user-7"`)},
	}
}

// continuer is what both adapters offer the worker.
type continuer interface {
	Continue(ctx context.Context, req *schemas.ChatRequest, from schemas.Continuation, sink Sink) (Outcome, error)
}

// continuingRoute is a provider of one API that records the request
// bodies it receives and answers each with body, and an adapter of the
// given continuation style for it.
type continuingRoute struct {
	bodies chan []byte
	up     continuer
}

func newContinuingRoute(t *testing.T, api string, style ContinuationStyle, body string) *continuingRoute {
	t.Helper()
	c := &continuingRoute{bodies: make(chan []byte, 1)}
	h := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.bodies <- b
		replay(answer{body: []byte(body)})(w, r)
	}
	opts := Options{Model: "route-model-2024", Now: func() time.Time { return fixedNow }, Continuation: style}
	switch api {
	case "anthropic":
		p := newMessagesProvider(t, h)
		opts.BaseURL = p.URL
		a, err := NewAnthropic(AnthropicOptions{Options: opts})
		if err != nil {
			t.Fatalf("NewAnthropic: %v", err)
		}
		t.Cleanup(a.CloseIdleConnections)
		c.up = a
	default:
		p := newProvider(t, h)
		opts.BaseURL = p.URL + "/v1"
		o, err := NewOpenAI(opts)
		if err != nil {
			t.Fatalf("NewOpenAI: %v", err)
		}
		t.Cleanup(o.CloseIdleConnections)
		c.up = o
	}
	return c
}

// body is the one request the provider received.
func (c *continuingRoute) body(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-c.bodies:
		return b
	case <-time.After(wait):
		t.Fatal("the provider received no request")
		return nil
	}
}

var (
	openAIStory    = openAIChunk(openAIRoleChunk) + openAIChunk(`{"content":"there was"}`) + openAIChunk(`{"content":" a fox."}`) + openAIEnd
	messagesStory  = messagesOpening + messagesText(0, " there was") + messagesText(0, " a fox.") + messagesEnd(0, "end_turn")
	onceUponATime  = schemas.Continuation{Text: "Once upon a time, ", OffsetTokens: 6}
	continuedStory = []Delta{{Content: "there was", Tokens: 1}, {Content: " a fox.", Tokens: 1}}
)

// Each style's continuation request is the request as Stream sends it
// plus the partial answer as the final assistant message, marked as the
// provider asks, with max_tokens lowered by the tokens already produced;
// the caller is told only the text that follows the partial answer.
func TestEachStyleSendsThePartialAnswerAsTheProvidersContinuationRequest(t *testing.T) {
	for _, tc := range []struct {
		api    string
		style  ContinuationStyle
		stream string
		golden string
	}{
		{"openai", ContinueFinalMessage, openAIStory, "continuation_continue_final_message.golden.json"},
		{"openai", ContinuePrefix, openAIStory, "continuation_prefix.golden.json"},
		// The prefill is stripped of its trailing space, which the
		// continuation repeats and the caller is not told twice.
		{"anthropic", ContinuePrefill, messagesStory, "continuation_prefill.golden.json"},
	} {
		t.Run(string(tc.style), func(t *testing.T) {
			route := newContinuingRoute(t, tc.api, tc.style, tc.stream)
			var rec recorder
			out, err := route.up.Continue(context.Background(), story(), onceUponATime, &rec)
			if err != nil {
				t.Fatalf("Continue: %v", err)
			}
			if got, want := route.body(t), fixture(t, tc.golden); !sameJSON(t, got, want) {
				t.Errorf("request body\n%s\nwant\n%s", got, want)
			}
			if !reflect.DeepEqual(rec.deltas, continuedStory) || out.Content != "there was a fox." {
				t.Errorf("deltas %+v, content %q; want %+v, %q", rec.deltas, out.Content, continuedStory, "there was a fox.")
			}
			if out.Usage.Estimated || out.Usage.OutputUnits == 0 || !out.WellFormed {
				t.Errorf("outcome %+v: want the continuation's own reported usage, well-formed", out)
			}
		})
	}
}

// The prefill's stripped white space W reaches the caller exactly once:
// the continuation's longest prefix that repeats W is dropped, however the
// provider splits it, and from the first character that differs every
// character is the caller's.
func TestAPrefillsStrippedWhiteSpaceReachesTheCallerExactlyOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		partial string
		deltas  []string
		prefill string // the final assistant message sent; "" for none
		want    []string
	}{
		{"a continuation that repeats the space is told without it", "Hello ", []string{" world", "!"}, "Hello", []string{"world", "!"}},
		{"a continuation that does not repeat it is told whole", "Hello ", []string{"world", "!"}, "Hello", []string{"world", "!"}},
		{"a repeat split across deltas is dropped across them", "Hello\n\n", []string{"\n", "\nNext"}, "Hello", []string{"", "Next"}},
		{"a partial repeat is dropped up to the first character that differs", "Hello\n\n", []string{"\n", "Next"}, "Hello", []string{"", "Next"}},
		{"white space beyond the stripped is the continuation's own", "Hello ", []string{"  indented"}, "Hello", []string{" indented"}},
		{"a partial without trailing space drops nothing", "Hello", []string{" world"}, "Hello", []string{" world"}},
		{"a partial of white space only is sent without a prefill", "  ", []string{" Hi"}, "", []string{"Hi"}},
		{"a later delta that starts like the space is never dropped", "Hello ", []string{"world", " again"}, "Hello", []string{"world", " again"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stream := messagesOpening
			for _, d := range tc.deltas {
				stream += messagesText(0, d)
			}
			route := newContinuingRoute(t, "anthropic", ContinuePrefill, stream+messagesEnd(0, "end_turn"))
			var rec recorder
			out, err := route.up.Continue(context.Background(), story(), schemas.Continuation{Text: tc.partial}, &rec)
			if err != nil {
				t.Fatalf("Continue: %v", err)
			}
			var got []string
			for _, d := range rec.deltas {
				got = append(got, d.Content)
				if d.Tokens != 1 {
					t.Errorf("delta %q counts %d tokens, want the provider's 1", d.Content, d.Tokens)
				}
			}
			if !reflect.DeepEqual(got, tc.want) || out.Content != strings.Join(tc.want, "") {
				t.Errorf("told %q (content %q), want %q", got, out.Content, tc.want)
			}
			var body struct {
				Messages []struct {
					Role    string          `json:"role"`
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(route.body(t), &body); err != nil {
				t.Fatal(err)
			}
			last := body.Messages[len(body.Messages)-1]
			switch {
			case tc.prefill == "" && last.Role != "user":
				t.Errorf("final message %s %s, want the user's: no prefill", last.Role, last.Content)
			case tc.prefill != "" && (last.Role != "assistant" || string(last.Content) != `"`+tc.prefill+`"`):
				t.Errorf("final message %s %s, want the prefill %q", last.Role, last.Content, tc.prefill)
			}
		})
	}
}

// What a splice cannot join is refused before anything is sent, as an
// invalid request of the group's scope; a route whose style is none or
// not its provider's refuses every continuation, at its own scope.
func TestAContinuationThatCannotBeJoinedIsRefusedBeforeAnythingIsSent(t *testing.T) {
	tools := func(r *schemas.ChatRequest) {
		r.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	}
	for _, tc := range []struct {
		name   string
		api    string
		style  ContinuationStyle
		change func(*schemas.ChatRequest)
		from   schemas.Continuation
		scope  schemas.ErrorScope
		is     error
	}{
		{"tools", "openai", ContinueFinalMessage, tools, onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"tool_choice", "anthropic", ContinuePrefill, func(r *schemas.ChatRequest) { r.ToolChoice = json.RawMessage(`"auto"`) },
			onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"json_schema", "openai", ContinuePrefix, func(r *schemas.ChatRequest) {
			r.ResponseFormat = json.RawMessage(`{"type":"json_schema","json_schema":{"name":"a","schema":{}}}`)
		}, onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"n of 2", "openai", ContinueFinalMessage, func(r *schemas.ChatRequest) { r.Extra["n"] = json.RawMessage(`2`) },
			onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"extended thinking", "anthropic", ContinuePrefill, func(r *schemas.ChatRequest) {
			r.Dialect, r.Extra = schemas.DialectAnthropic, map[string]json.RawMessage{"thinking": json.RawMessage(`{"type":"enabled","budget_tokens":1024}`)}
		}, onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"a Responses request on an OpenAI route", "openai", ContinueFinalMessage, func(r *schemas.ChatRequest) {
			r.Dialect, r.Extra = schemas.DialectResponses, nil
		}, onceUponATime, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"an empty partial answer", "openai", ContinuePrefix, func(*schemas.ChatRequest) {}, schemas.Continuation{},
			schemas.ScopeGroup, schemas.ErrMalformedRequest},
		{"a partial answer that holds max_tokens", "anthropic", ContinuePrefill, func(*schemas.ChatRequest) {},
			schemas.Continuation{Text: "x", OffsetTokens: 100}, schemas.ScopeGroup, schemas.ErrNotContinuable},
		{"a route that cannot continue", "openai", ContinueNone, func(*schemas.ChatRequest) {}, onceUponATime,
			schemas.ScopeRoute, ErrCannotContinue},
		{"a route of no style", "anthropic", "", func(*schemas.ChatRequest) {}, onceUponATime, schemas.ScopeRoute, ErrCannotContinue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route := newContinuingRoute(t, tc.api, tc.style, "")
			req := story()
			tc.change(req)
			_, err := route.up.Continue(context.Background(), req, tc.from, nil)
			ue := asError(t, err)
			if ue.Status != schemas.StatusInvalidRequest || ue.Scope != tc.scope || !errors.Is(err, tc.is) {
				t.Errorf("error %v (%s, %s), want invalid_request of scope %s matching %v", err, ue.Status, ue.Scope, tc.scope, tc.is)
			}
			if strings.Contains(ue.Message, "Once upon") {
				t.Errorf("message %q quotes the partial answer", ue.Message)
			}
			select {
			case b := <-route.bodies:
				t.Errorf("the provider was sent %s", b)
			default:
			}
		})
	}
}

func TestAnAdapterRefusesAContinuationStyleItsProviderDoesNotSpeak(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(ContinuationStyle) error
		bad   []ContinuationStyle
		good  []ContinuationStyle
	}{
		{"openai", func(s ContinuationStyle) error {
			_, err := NewOpenAI(Options{BaseURL: "http://127.0.0.1:1/v1", Continuation: s})
			return err
		}, []ContinuationStyle{ContinuePrefill, "resume"}, []ContinuationStyle{"", ContinueNone, ContinueFinalMessage, ContinuePrefix}},
		{"anthropic", func(s ContinuationStyle) error {
			_, err := NewAnthropic(AnthropicOptions{Options: Options{BaseURL: "http://127.0.0.1:1", Continuation: s}})
			return err
		}, []ContinuationStyle{ContinueFinalMessage, ContinuePrefix, "resume"}, []ContinuationStyle{"", ContinueNone, ContinuePrefill}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, s := range tc.bad {
				if err := tc.build(s); err == nil || !strings.Contains(err.Error(), "continuation") {
					t.Errorf("style %q: error %v, want one naming the continuation", s, err)
				}
			}
			for _, s := range tc.good {
				if err := tc.build(s); err != nil {
					t.Errorf("style %q: %v", s, err)
				}
			}
		})
	}
}
