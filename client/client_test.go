package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

func newClient(t *testing.T, nc *nats.Conn) *client.Client {
	t.Helper()
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSubmitReturnsTheCommittedAnswer(t *testing.T) {
	h, nc := newHedgerow(t, 2, instant(t, 20))
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	resp, err := c.Submit(ctx, ask("hello"))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if words := len(strings.Fields(resp.Content)); words != 20 || resp.FinishReason != "stop" || resp.Usage.OutputUnits != 20 {
		t.Fatalf("answer %q (%d words), finish %q, usage %+v: want the route's 20 tokens", resp.Content, words, resp.FinishReason, resp.Usage)
	}
	if resp.Attempts != 1 || resp.WinnerAttempt != 1 || resp.Hedged || resp.Gate == nil || resp.Gate.GroupID != resp.GroupID ||
		(resp.WinnerRoute != "fake-a" && resp.WinnerRoute != "fake-b") {
		t.Fatalf("response %+v: want the primary, on a configured route, committed", resp)
	}
	if rec := h.nextRecord(t); rec.End != fakellm.EndCompleted || rec.TokensSent != 20 {
		t.Errorf("route record %+v, want a completed 20-token answer", rec)
	}
}

func TestStreamDeliversTheCommittedAnswerInOrder(t *testing.T) {
	_, nc := newHedgerow(t, 2, paced(t, 30))
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// The same request, whole: the route draws the same answer for it.
	whole, err := c.Submit(ctx, ask("stream me"))
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	s, err := c.Stream(ctx, ask("stream me"))
	if err != nil {
		t.Fatalf("Stream: %v", err)
	}
	defer s.Close()
	var text strings.Builder
	chunks := 0
	for s.Next() {
		chunks++
		if ch := s.Chunk(); ch.Seq != int64(chunks) {
			t.Fatalf("chunk %d has seq %d", chunks, ch.Seq)
		}
		text.WriteString(s.Chunk().Delta)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if text.String() != whole.Content {
		t.Fatalf("streamed %q, want the answer %q in order", text.String(), whole.Content)
	}
	// 30 tokens 10 ms apart, coalesced per 5 ms or 16 tokens: several chunks.
	if chunks < 3 {
		t.Errorf("%d chunks: want the answer streamed as it was produced", chunks)
	}
	resp := s.Response()
	if resp == nil || resp.Content != "" || resp.FinishReason != "stop" || resp.WinnerAttempt != 1 {
		t.Fatalf("final response %+v, want the commit without repeating the content", resp)
	}
	if s.Next() {
		t.Error("Next after the end returned true")
	}
}

func TestFailuresAreTypedErrorsWithTheirStableCode(t *testing.T) {
	_, nc := newHedgerow(t, 2, hanging(t))
	c := newClient(t, nc)
	for _, tc := range []struct {
		name   string
		req    client.Request
		code   schemas.ErrorCode
		status int
	}{
		{"unknown model class", func() client.Request { r := ask("hi"); r.ModelClass = "gpt-9"; return r }(), schemas.ErrUnknownModel, 404},
		{"unknown operation class characters", func() client.Request { r := ask("hi"); r.OperationClass = "no spaces"; return r }(),
			schemas.ErrInvalidRequest, 400},
		{"deadline", func() client.Request { r := ask("hi"); r.DeadlineMs = 200; return r }(), schemas.ErrDeadlineExceeded, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, stream := range []bool{false, true} {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				var err error
				if stream {
					var s *client.Stream
					if s, err = c.Stream(ctx, tc.req); err == nil {
						for s.Next() {
							t.Errorf("chunk %+v of a failing request", s.Chunk())
						}
						err = s.Err()
						_ = s.Close()
					}
				} else {
					_, err = c.Submit(ctx, tc.req)
				}
				cancel()
				var herr *client.Error
				if !errors.As(err, &herr) || herr.Code != tc.code || herr.Status != tc.status || herr.Message == "" {
					t.Fatalf("stream=%v: error %v, want a *client.Error %s (%d) with a message", stream, err, tc.code, tc.status)
				}
				if tc.code == schemas.ErrDeadlineExceeded && herr.Group == "" {
					t.Errorf("stream=%v: %+v names no group", stream, herr)
				}
			}
		})
	}
}

func TestCancellingTheContextCancelsTheGroup(t *testing.T) {
	h, nc := newHedgerow(t, 2, hanging(t))
	c := newClient(t, nc)
	groups := make(chan schemas.GroupRecord, 16)
	// Records are read as the observer: a client may not.
	obs, err := h.users.Connect(h.NATSURL(), natsauth.UserObserver)
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	sub, err := obs.Subscribe("hedgerow.events.group", func(m *nats.Msg) {
		var r schemas.GroupRecord
		if json.Unmarshal(m.Data, &r) == nil {
			groups <- r
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}

	for _, stream := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			if !stream {
				_, err := c.Submit(ctx, ask("wait for me"))
				done <- err
				return
			}
			s, err := c.Stream(ctx, ask("wait for me"))
			if err == nil {
				for s.Next() {
				}
				err = s.Err()
				_ = s.Close()
			}
			done <- err
		}()
		h.waitStarted(t) // the primary is held by its route
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("stream=%v: call ended with %v, want context.Canceled", stream, err)
			}
		case <-time.After(wait):
			t.Fatalf("stream=%v: the call did not return when its context ended", stream)
		}
		if rec := h.nextRecord(t); rec.End != fakellm.EndDisconnected {
			t.Fatalf("stream=%v: route record %+v, want the upstream request disconnected", stream, rec)
		}
		select {
		case g := <-groups:
			if g.Outcome != schemas.GroupFailed || g.ErrorCode != schemas.ErrCanceled {
				t.Fatalf("stream=%v: group record %+v, want failed with canceled", stream, g)
			}
		case <-time.After(wait):
			t.Fatalf("stream=%v: no group record", stream)
		}
	}
}

func TestClosingAStreamMidwayCancelsTheGroup(t *testing.T) {
	h, nc := newHedgerow(t, 1, paced(t, 500)) // 5 s of tokens: far longer than the test
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	s, err := c.Stream(ctx, ask("a long answer"))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Next() {
		t.Fatalf("no first chunk: %v", s.Err())
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if rec := h.nextRecord(t); rec.End != fakellm.EndDisconnected || rec.TokensSent >= 500 {
		t.Fatalf("route record %+v, want the stream cut off early", rec)
	}
	if s.Next() || !errors.Is(s.Err(), context.Canceled) {
		t.Fatalf("after Close: Next true or Err %v, want context.Canceled", s.Err())
	}
}

func TestGatewayIsDiscoverableThroughMicroPing(t *testing.T) {
	_, nc := newHedgerow(t, 1, instant(t, 5))
	m, err := nc.Request("$SRV.PING."+schemas.SubmitServiceName, nil, wait)
	if err != nil {
		t.Fatalf("$SRV.PING.%s: %v", schemas.SubmitServiceName, err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != schemas.SubmitServiceName {
		t.Fatalf("ping answer %s (%v), want service %s", m.Data, err, schemas.SubmitServiceName)
	}
}

func TestNoGatewayIsUnavailableAndRetryable(t *testing.T) {
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(1<<20)), nats.Name("client-test"))
	c := newClient(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	_, err := c.Submit(ctx, ask("anyone?"))
	var herr *client.Error
	if !errors.As(err, &herr) || herr.Code != schemas.ErrUnavailable || !herr.Retryable() || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("Submit: %v, want a retryable unavailable *client.Error wrapping nats.ErrNoResponders", err)
	}
	s, err := c.Stream(ctx, ask("anyone?"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Next() || !errors.As(s.Err(), &herr) || herr.Code != schemas.ErrUnavailable {
		t.Fatalf("Stream: %v, want unavailable", s.Err())
	}
}

func TestNewRejectsWhatItCannotUse(t *testing.T) {
	if _, err := client.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(1<<20)), nats.Name("client-test"))
	if _, err := client.New(nc, client.WithTimeout(0)); err == nil {
		t.Error("New with a zero timeout succeeded")
	}
}

// WithAPIKey sends the key on every request, submitted or streamed, as
// the gateway's doors read it; without it no Authorization header is sent.
// A tenant-limit refusal is retryable and says when.
func TestAPIKeyTravelsInTheAuthorizationHeaderOfEveryRequest(t *testing.T) {
	nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(1<<20)), nats.Name("client-test"))
	seen := make(chan string, 4)
	sub, err := nc.Subscribe(schemas.SubmitSubject, func(m *nats.Msg) {
		seen <- m.Header.Get(schemas.HeaderAuthorization)
		h := nats.Header{}
		h.Set(schemas.HeaderStatus, schemas.StatusError)
		h.Set("Nats-Service-Error-Code", "429")
		h.Set(schemas.HeaderErrorCode, string(schemas.ErrTenantRateLimited))
		h.Set(schemas.HeaderRetryAfter, "3")
		_ = nc.PublishMsg(&nats.Msg{Subject: m.Reply, Header: h})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	keyed, err := client.New(nc, client.WithAPIKey("sk-test"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = keyed.Submit(ctx, ask("hi"))
	var herr *client.Error
	if !errors.As(err, &herr) || herr.Code != schemas.ErrTenantRateLimited || herr.Status != 429 || !herr.Retryable() || herr.RetryAfter != 3*time.Second {
		t.Fatalf("Submit: %v (%+v); want a retryable tenant_rate_limited, retry after 3s", err, herr)
	}
	s, err := keyed.Stream(ctx, ask("hi"))
	if err != nil {
		t.Fatal(err)
	}
	for s.Next() {
	}
	_ = s.Close()
	_, _ = newClient(t, nc).Submit(ctx, ask("hi"))
	for _, want := range []string{"Bearer sk-test", "Bearer sk-test", ""} {
		select {
		case got := <-seen:
			if got != want {
				t.Fatalf("Authorization %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatal("a request never arrived")
		}
	}
}

// Retryable takes the gateway's word (Hedgerow-Should-Retry) when it sent
// one, and falls back on the code when it did not.
func TestRetryableTakesTheGatewaysWordOverTheCode(t *testing.T) {
	for _, tt := range []struct {
		name        string
		code        schemas.ErrorCode
		shouldRetry string // the header; empty: not sent
		want        bool
	}{
		{"budget_exhausted after a death, said retryable", schemas.ErrBudgetExhausted, "true", true},
		{"budget_exhausted, said final", schemas.ErrBudgetExhausted, "false", false},
		{"all_routes_failed, said final", schemas.ErrAllRoutesFailed, "false", false},
		{"all_routes_failed, no word: the code decides", schemas.ErrAllRoutesFailed, "", true},
		{"invalid_request, no word: the code decides", schemas.ErrInvalidRequest, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			nc := natstest.Connect(t, natstest.Start(t, natstest.MaxPayload(1<<20)), nats.Name("client-test"))
			sub, err := nc.Subscribe(schemas.SubmitSubject, func(m *nats.Msg) {
				h := nats.Header{}
				h.Set(schemas.HeaderStatus, schemas.StatusError)
				h.Set("Nats-Service-Error-Code", "429")
				h.Set(schemas.HeaderErrorCode, string(tt.code))
				if tt.shouldRetry != "" {
					h.Set(schemas.HeaderShouldRetry, tt.shouldRetry)
				}
				_ = nc.PublishMsg(&nats.Msg{Subject: m.Reply, Header: h})
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			c, err := client.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_, err = c.Submit(ctx, ask("hi"))
			var herr *client.Error
			if !errors.As(err, &herr) || herr.Code != tt.code {
				t.Fatalf("Submit: %v; want a %s error", err, tt.code)
			}
			if got := herr.Retryable(); got != tt.want {
				t.Errorf("Retryable() = %v, want %v", got, tt.want)
			}
		})
	}
}
