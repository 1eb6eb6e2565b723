package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// slowStream writes the first content chunk, then holds the stream open
// until the client goes away, closing gone when its request context ends.
func slowStream(t *testing.T, gone chan<- struct{}) http.HandlerFunc {
	body := fixture(t, "stream_content.sse")
	// everything before the event carrying " there": the role chunk and "Hello"
	cut := bytes.LastIndex(body[:bytes.Index(body, []byte(`" there"`))], []byte("data: "))
	firstEvents := body[:cut]
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(firstEvents)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}
}

func TestCancelClosesTheUpstreamConnectionPromptly(t *testing.T) {
	gone := make(chan struct{})
	p := newProvider(t, slowStream(t, gone))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := recorder{onDelta: func(Delta) { cancel() }} // the caller gives up at the first token

	out, err := newAdapter(t, p, "").Stream(ctx, hello(), &rec)
	eventually.Closed(t, wait, "the provider to see its request context done", gone)

	ue := asError(t, err)
	if ue.Status != schemas.StatusCanceled || ue.Scope != schemas.ScopeNone {
		t.Errorf("error = %v, want canceled with no scope: not a failure of the route", ue)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("errors.Is(err, context.Canceled) = false for %v", err)
	}
	want := schemas.Usage{InputUnits: out.Usage.InputUnits, OutputUnits: 1, Estimated: true}
	if out.Content != "Hello" || out.Usage != want || out.Usage.InputUnits == 0 {
		t.Errorf("outcome = %+v, want the partial answer with estimated usage", out)
	}
}

func TestStreamHeldOpenAfterDoneStillCompletes(t *testing.T) {
	gone := make(chan struct{})
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(fixture(t, "stream_content.sse"))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never ends the body on its own
		close(gone)
	})

	out, err := newAdapter(t, p, "").Stream(context.Background(), hello(), nil)
	if err != nil {
		t.Fatalf("Stream: %v, want the complete answer", err)
	}
	if !out.WellFormed || out.Content != "Hello there!" {
		t.Errorf("outcome = %+v, want the well-formed answer", out)
	}
	eventually.Closed(t, wait, "the held-open connection to be closed", gone)
}

func TestDeadlineMidStreamIsATransientTimeout(t *testing.T) {
	gone := make(chan struct{})
	p := newProvider(t, slowStream(t, gone))
	ctx := newExpiringContext()
	rec := recorder{onDelta: func(Delta) { ctx.expire() }}

	out, err := newAdapter(t, p, "").Stream(ctx, hello(), &rec)
	eventually.Closed(t, wait, "the provider to see its request context done", gone)

	ue := asError(t, err)
	if ue.Status != schemas.StatusTimeout || ue.Scope != schemas.ScopeTransient {
		t.Errorf("error = %v, want a transient timeout", ue)
	}
	if out.Content != "Hello" || !out.Usage.Estimated {
		t.Errorf("outcome = %+v, want the partial answer with estimated usage", out)
	}
}

func TestAttemptsThatNeverReachTheProviderAreNotBilled(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	refusedURL := closed.URL
	closed.Close()
	passed, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()

	for _, tc := range []struct {
		name       string
		ctx        context.Context
		wantStatus schemas.StatusClass
		wantScope  schemas.ErrorScope
	}{
		{"a refused connection is a transient server error", context.Background(), schemas.StatusServerError, schemas.ScopeTransient},
		{"a deadline passed before the call is a transient timeout", passed, schemas.StatusTimeout, schemas.ScopeTransient},
		{"a cancel before the call is canceled", canceled, schemas.StatusCanceled, schemas.ScopeNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := NewOpenAI(Options{BaseURL: refusedURL + "/v1", Model: "m"})
			if err != nil {
				t.Fatalf("NewOpenAI: %v", err)
			}
			defer o.CloseIdleConnections()
			var rec recorder

			out, err := o.Stream(tc.ctx, hello(), &rec)
			ue := asError(t, err)
			if ue.Status != tc.wantStatus || ue.Scope != tc.wantScope {
				t.Errorf("error = %v, want %s (%s)", ue, tc.wantStatus, tc.wantScope)
			}
			if out.Usage != (schemas.Usage{}) || rec.firstBytes != 0 {
				t.Errorf("usage = %+v, first bytes %d; want nothing billed or seen", out.Usage, rec.firstBytes)
			}
			if strings.Contains(ue.Error(), "127.0.0.1") {
				t.Errorf("error text %q names the endpoint", ue.Error())
			}
		})
	}
}

func TestFailedAttemptsAreNeverRetried(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"a 500 answer", replay(answer{status: 500, body: []byte(`{"error":{"message":"boom","type":"server_error"}}`)})},
		{"a connection closed before the answer", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var failNext sync.Mutex // held while the handler should fail
			fail := false
			p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
				failNext.Lock()
				f := fail
				failNext.Unlock()
				if f {
					tc.handler(w, r)
					return
				}
				replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
			})
			o := newAdapter(t, p, "")
			// A first, successful attempt leaves an idle connection, so the
			// failing one runs on a reused connection — the case in which a
			// transport would be tempted to resend.
			if _, err := o.Stream(context.Background(), hello(), nil); err != nil {
				t.Fatalf("warm-up Stream: %v", err)
			}
			failNext.Lock()
			fail = true
			failNext.Unlock()

			_, err := o.Stream(context.Background(), hello(), nil)
			ue := asError(t, err)
			if ue.Scope != schemas.ScopeTransient {
				t.Errorf("error = %v, want transient", ue)
			}
			if n := p.requests.Load(); n != 2 {
				t.Errorf("provider saw %d requests, want 2 (one warm-up, one failed attempt)", n)
			}
		})
	}
}

func TestAuthorizationHeaderIsSentOnlyWhenAKeyIsConfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  string
		want string
	}{
		{"no key, no header", "", ""},
		{"a key is sent as a bearer token", testKey, "Bearer " + testKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan string, 1)
			p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
				_, present := r.Header["Authorization"]
				if !present {
					got <- ""
				} else {
					got <- r.Header.Get("Authorization")
				}
				replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
			})
			if _, err := newAdapter(t, p, tc.key).Stream(context.Background(), hello(), nil); err != nil {
				t.Fatalf("Stream: %v", err)
			}
			if h := <-got; h != tc.want {
				t.Errorf("Authorization = %q, want %q", h, tc.want)
			}
		})
	}
}

func TestAPIKeyNeverAppearsInErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		key    string
		status int
		body   string
	}{
		{"a 401 echoing the key", testKey, 401, string(fixture(t, "error_401_invalid_api_key.json"))},
		{"a key that does not look like one", "plainpassword", 401, `{"error":{"message":"bad key plainpassword","type":"authentication_error"}}`},
		{"a 500 echoing the authorization header", testKey, 500, `{"error":{"message":"upstream rejected Authorization: Bearer ` + testKey + `","type":"server_error"}}`},
		{"an error event echoing the key", "plainpassword", 200, "data: {\"error\":{\"message\":\"key plainpassword revoked\",\"type\":\"authentication_error\"}}\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, replay(answer{status: tc.status, body: []byte(tc.body)}))

			_, err := newAdapter(t, p, tc.key).Stream(context.Background(), hello(), nil)
			ue := asError(t, err)
			for _, s := range []string{ue.Error(), ue.Message} {
				if strings.Contains(s, tc.key) || strings.Contains(strings.ToLower(s), "bearer") {
					t.Errorf("error text %q leaks the key", s)
				}
			}
		})
	}
}

func TestRequestBodyCarriesTheCanonicalRequestUnderTheRouteModel(t *testing.T) {
	temp, topP, pres, freq := 0.2, 0.9, 0.5, -0.5
	seed := int64(42)
	req := &schemas.ChatRequest{
		Model: "general", // replaced by the route's model
		Messages: []schemas.Message{
			{Role: schemas.MessageSystem, Content: schemas.TextContent("You answer briefly.")},
			{Role: schemas.MessageUser, Content: json.RawMessage(`[
				{"type":"text","text":"What is in this image, and the weather?"},
				{"type":"image_url","image_url":{"url":"https://example.com/cat.png","detail":"low"}}]`)},
			{Role: schemas.MessageAssistant, Content: json.RawMessage(`null`), ToolCalls: json.RawMessage(
				`[{"id":"call_abc123","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]`)},
			{Role: schemas.MessageTool, ToolCallID: "call_abc123", Content: schemas.TextContent("18C, cloudy")},
			{Role: schemas.MessageUser, Name: "alice", Content: schemas.TextContent("Thanks.")},
		},
		MaxTokens:        256,
		Temperature:      &temp,
		TopP:             &topP,
		PresencePenalty:  &pres,
		FrequencyPenalty: &freq,
		Seed:             &seed,
		Stop:             []string{"\n\n", "END"},
		Tools: json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Current weather",
			"parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}}}]`),
		ToolChoice:     json.RawMessage(`{"type":"function","function":{"name":"get_weather"}}`),
		ResponseFormat: json.RawMessage(`{"type":"json_object"}`),
		Stream:         false, // the provider is streamed from regardless
	}
	type seen struct {
		body                []byte
		contentType, accept string
	}
	got := make(chan seen, 1)
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{b, r.Header.Get("Content-Type"), r.Header.Get("Accept")}
		replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
	})

	if _, err := newAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	s := <-got
	if want := fixture(t, "request_body.golden.json"); !sameJSON(t, s.body, want) {
		t.Errorf("request body\n%s\nwant\n%s", s.body, want)
	}
	if s.contentType != "application/json" || s.accept != "text/event-stream" {
		t.Errorf("Content-Type %q, Accept %q; want application/json and text/event-stream", s.contentType, s.accept)
	}
}

func TestNullAndAbsentOptionalFieldsAreNotSent(t *testing.T) {
	req := hello()
	req.Tools, req.ToolChoice, req.ResponseFormat = json.RawMessage(`null`), json.RawMessage(` null `), nil
	got := make(chan map[string]any, 1)
	p := newProvider(t, func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		got <- m
		replay(answer{body: fixture(t, "stream_content.sse")})(w, r)
	})

	if _, err := newAdapter(t, p, "").Stream(context.Background(), req, nil); err != nil {
		t.Fatalf("Stream: %v", err)
	}
	m := <-got
	for _, k := range []string{"tools", "tool_choice", "response_format", "max_tokens", "temperature", "top_p", "seed", "stop"} {
		if _, ok := m[k]; ok {
			t.Errorf("body has %q = %v, want it absent", k, m[k])
		}
	}
	if m["model"] != "route-model-2024" || m["stream"] != true {
		t.Errorf("model %v, stream %v; want the route model and stream true", m["model"], m["stream"])
	}
}

func TestUnencodableRequestEndsTheGroup(t *testing.T) {
	p := newProvider(t, replay(answer{body: fixture(t, "stream_content.sse")}))
	req := hello()
	req.Tools = json.RawMessage(`[{"type":`) // invalid raw JSON

	_, err := newAdapter(t, p, "").Stream(context.Background(), req, nil)
	ue := asError(t, err)
	if ue.Status != schemas.StatusInvalidRequest || ue.Scope != schemas.ScopeGroup {
		t.Errorf("error = %v, want group-scoped invalid_request", ue)
	}
	if n := p.requests.Load(); n != 0 {
		t.Errorf("provider saw %d requests, want none", n)
	}
}

func TestBaseURLIncludesTheVersionPath(t *testing.T) {
	for _, suffix := range []string{"/v1", "/v1/"} {
		t.Run(suffix, func(t *testing.T) {
			p := newProvider(t, replay(answer{body: fixture(t, "stream_content.sse")}))
			o, err := NewOpenAI(Options{BaseURL: p.URL + suffix})
			if err != nil {
				t.Fatalf("NewOpenAI: %v", err)
			}
			defer o.CloseIdleConnections()
			if _, err := o.Stream(context.Background(), hello(), nil); err != nil {
				t.Errorf("Stream against %s: %v, want POST %s/chat/completions", suffix, err, suffix)
			}
		})
	}
}

func TestNewOpenAIRefusesABaseURLThatIsNotAbsoluteHTTP(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:9101/v1", "ftp://host/v1", "http://", "://bad"} {
		if _, err := NewOpenAI(Options{BaseURL: u}); err == nil {
			t.Errorf("NewOpenAI(%q) succeeded, want an error", u)
		}
	}
}

func TestAnAnswerIsNotHeldUpByAProviderThatEndsItsBodyLate(t *testing.T) {
	// Only the end of the body can finish a drain within the test.
	defer func(wait time.Duration) { drainWait = wait }(drainWait)
	drainWait = time.Hour

	for _, tc := range []struct {
		name    string
		fixture string
		adapter func(t *testing.T, h http.HandlerFunc) Upstream
	}{
		{"openai, after [DONE]", "stream_content.sse", func(t *testing.T, h http.HandlerFunc) Upstream {
			return newAdapter(t, newProvider(t, h), "")
		}},
		{"anthropic, after message_stop", "anthropic_stream_text.sse", func(t *testing.T, h http.HandlerFunc) Upstream {
			return newAnthropicAdapter(t, newMessagesProvider(t, h), "")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release, ended := make(chan struct{}), make(chan struct{})
			body := fixture(t, tc.fixture)
			up := tc.adapter(t, func(w http.ResponseWriter, r *http.Request) {
				defer close(ended)
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write(body)
				w.(http.Flusher).Flush()
				<-release // the final event is out; the body ends only when the test says so
			})
			var (
				out      Outcome
				err      error
				returned = make(chan struct{})
			)
			go func() {
				defer close(returned)
				out, err = up.Stream(context.Background(), hello(), nil)
			}()
			eventually.Closed(t, wait, "the answer while the provider still holds its body open", returned)
			close(release)
			eventually.Closed(t, wait, "the provider to end its body", ended)
			if err != nil || !out.WellFormed || out.FinishReason == "" {
				t.Fatalf("Stream = %+v, %v; want the complete answer", out, err)
			}
		})
	}
}
