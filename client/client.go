// Package client is the Go client of hedgerow's NATS front door: a service
// that already speaks NATS submits a user action to whichever gateway
// replica is free, over request-reply on hedgerow.submit, and gets the
// committed answer — or streams it — with one stable error code when the
// action fails.
//
//	nc, _ := nats.Connect(url)
//	c, _ := client.New(nc)
//	resp, err := c.Submit(ctx, client.Request{
//		ModelClass: "general",
//		Request:    schemas.ChatRequest{Messages: []schemas.Message{{Role: "user", Content: schemas.TextContent("Say hello")}}},
//	})
//	var herr *client.Error
//	if errors.As(err, &herr) && herr.Code == schemas.ErrDeadlineExceeded { ... }
//
// The context bounds the call: its deadline becomes the request's
// deadline_ms when shorter, and when it ends before the answer the client
// cancels the request, which cancels its hedge group (no fallback, no
// late commit). The wire, the reply framing and the cancel subject are
// described in package schemas (SubmitSubject). Each request carries a
// fresh random id of 128 bits, so its cancel is honoured on any gateway,
// and only its own caller's: a connection with a client user's inbox
// prefix (nats.CustomInboxPrefix(schemas.ClientInboxPrefix + "." + user),
// which `hedgerow nats-auth` users must connect with) cancels on the
// subject naming that user, and WithAPIKey's key goes with each cancel.
package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
)

// Request, Response and Chunk are the wire types of the front door.
type (
	// Request is one user action: the chat request, the model class (the
	// pool of equivalent routes), the operation class (the policy) and
	// optionally an idempotency key and a deadline.
	Request = schemas.SubmitRequest
	// Response is the committed answer and how it was won.
	Response = schemas.SubmitResponse
	// Chunk is one piece of a committed stream.
	Chunk = schemas.SubmitChunk
)

// Errors of the client, which callers may branch on with errors.Is.
var (
	// ErrStreamBroken means a stream lost a chunk (the client fell behind
	// and NATS dropped messages) or received something it could not read;
	// the request was cancelled.
	ErrStreamBroken = errors.New("client: stream broken")
)

// DefaultOperationClass is the operation class (policy) a request that
// names none is sent with: the gateway's default policy.
const DefaultOperationClass = "default"

// DefaultTimeout is how long a call waits for its answer when its context
// has no deadline; WithTimeout changes it.
const DefaultTimeout = 5 * time.Minute

// Error is a failure the gateway answered with: one stable code, mirroring
// the group error codes of schemas.ErrorCode, plus the front door's own
// (unknown_model, unavailable). Match it with errors.As.
type Error struct {
	Code schemas.ErrorCode
	// Status is the HTTP-like status of the micro error header, e.g. 400 or
	// 504; the HTTP front door answers the same status for the same failure.
	Status  int
	Message string
	// Group names the hedge group that failed, as its records do; empty
	// when the request failed before a group ran.
	Group string
	// Winner is the committed winner of the user action (already_committed).
	Winner *schemas.GateValue
	// Region names the region that committed the user action
	// (committed_in_region): a retry submitted there is answered.
	Region string
	// RetryAfter, when positive, is when the same request may succeed
	// (the gateway's Retry-After, in whole seconds).
	RetryAfter time.Duration
	// shouldRetry is the gateway's own word (Hedgerow-Should-Retry), when
	// it sent one: it knows what the code alone does not, e.g. that a
	// budget_exhausted after a death frees up at RetryAfter.
	shouldRetry *bool
	err         error
}

func (e *Error) Error() string {
	return fmt.Sprintf("hedgerow: %s (%d): %s", e.Code, e.Status, e.Message)
}

// Unwrap returns the transport error behind the failure, if any (e.g.
// nats.ErrNoResponders when no gateway serves the subject).
func (e *Error) Unwrap() error { return e.err }

// Retryable reports whether the same request may succeed if sent again
// (to another replica, or later). The gateway says so on every error it
// answers (Hedgerow-Should-Retry), and its word is taken: a user action
// whose attempts a death spent, say, is budget_exhausted until RetryAfter.
// Without it the code decides: the gateway was unavailable, no route
// was healthy, the pool had no live worker, the routes pushed back, the workers were full, the winner
// gate could not decide, a committed stream broke midway, or the
// caller's tenant was over its request rate or requests in flight
// (RetryAfter says when).
func (e *Error) Retryable() bool {
	if e.shouldRetry != nil {
		return *e.shouldRetry
	}
	switch e.Code {
	case schemas.ErrUnavailable, schemas.ErrNoRoute, schemas.ErrNoWorkers, schemas.ErrRateLimited, schemas.ErrOverloaded, schemas.ErrAllRoutesFailed,
		schemas.ErrGateUnavailable, schemas.ErrStreamInterrupted, schemas.ErrTenantRateLimited, schemas.ErrTenantConcurrencyLimited:
		return true
	}
	return false
}

// Client submits requests to the hedgerow.submit front door. It is safe for
// concurrent use.
type Client struct {
	nc      *nats.Conn
	timeout time.Duration
	apiKey  string
	wire    schemas.Wire // the region whose gateways it submits to
	// inbox is an inbox of nc: its requests' reply subjects share its
	// prefix, which names the client user cancels are sent as.
	inbox string
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout sets how long a call waits when its context has no deadline
// (DefaultTimeout otherwise).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithAPIKey sends key with every request, in the header Authorization as
// "Bearer <key>": a gateway with tenants configured refuses a request
// without one of their keys (unauthenticated, 401), and counts the
// request against the key's tenant (spend ceilings, request limits,
// idempotency keys). The client never logs it.
func WithAPIKey(key string) Option { return func(c *Client) { c.apiKey = key } }

// WithRegion submits to the gateways of one region of a supercluster
// (their deployment.region): on the region's subject, with the region's
// cancels (schemas.RegionWire). Without it the client speaks the wire of a
// deployment of one region.
func WithRegion(region string) Option {
	return func(c *Client) { c.wire = schemas.RegionWire(region) }
}

// New returns a client on nc, which the caller keeps owning and closing.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	if nc == nil {
		return nil, errors.New("hedgerow client: a NATS connection is required")
	}
	c := &Client{nc: nc, timeout: DefaultTimeout, inbox: nc.NewInbox()}
	for _, o := range opts {
		o(c)
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("hedgerow client: timeout %v must be positive", c.timeout)
	}
	return c, nil
}

// Submit sends req as a non-streaming request (req.Request.Stream is
// ignored; an empty OperationClass means DefaultOperationClass) and returns the committed answer. A failure the gateway answered
// is an *Error; when ctx ends first, the request is cancelled and ctx's
// error is returned (wrapped).
func (c *Client) Submit(ctx context.Context, req Request) (*Response, error) {
	req.Request.Stream = false
	ctx, cancel := c.bound(ctx)
	defer cancel()
	msg, id, err := c.message(ctx, req, "")
	if err != nil {
		return nil, err
	}
	m, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, noGateway(c.wire, err)
		}
		if ctx.Err() != nil {
			c.cancel(id)
			return nil, fmt.Errorf("hedgerow submit: %w", ctx.Err())
		}
		return nil, fmt.Errorf("hedgerow submit: %w", err)
	}
	switch m.Header.Get(schemas.HeaderStatus) {
	case schemas.StatusDone:
		var resp Response
		if err := schemas.Decode(m.Data, &resp); err != nil {
			return nil, fmt.Errorf("hedgerow submit: read the answer: %w", err)
		}
		return &resp, nil
	case schemas.StatusError:
		return nil, errorFrom(m)
	}
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		return nil, errorFrom(m)
	}
	return nil, fmt.Errorf("hedgerow submit: unexpected answer (header %s %q)", schemas.HeaderStatus, m.Header.Get(schemas.HeaderStatus))
}

// Stream sends req as a streaming request (req.Request.Stream is set) and
// returns the stream of its committed answer. The stream must be read with
// Next until it returns false, or closed; ctx bounds it as a whole.
func (c *Client) Stream(ctx context.Context, req Request) (*Stream, error) {
	req.Request.Stream = true
	ctx, cancel := c.bound(ctx)
	inbox := c.nc.NewInbox()
	msg, id, err := c.message(ctx, req, inbox)
	if err != nil {
		cancel()
		return nil, err
	}
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("hedgerow stream: subscribe %s: %w", inbox, err)
	}
	if err := c.nc.PublishMsg(msg); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return nil, fmt.Errorf("hedgerow stream: publish: %w", err)
	}
	return &Stream{c: c, ctx: ctx, stop: cancel, sub: sub, id: id}, nil
}

// bound gives ctx the client's timeout when it has no deadline.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.timeout)
}

// message encodes req with a fresh request id, its deadline_ms no longer
// than what is left of ctx.
func (c *Client) message(ctx context.Context, req Request, reply string) (*nats.Msg, string, error) {
	if req.OperationClass == "" {
		req.OperationClass = DefaultOperationClass
	}
	if dl, ok := ctx.Deadline(); ok {
		left := max(time.Until(dl).Milliseconds(), 1)
		if req.DeadlineMs == 0 || left < req.DeadlineMs {
			req.DeadlineMs = left
		}
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, "", fmt.Errorf("hedgerow: encode request: %w", err)
	}
	var b [schemas.MinUnguessableRequestIDLen / 2]byte // 128 bits as hex
	_, _ = rand.Read(b[:])                             // crypto/rand.Read never fails
	id := hex.EncodeToString(b[:])
	h := nats.Header{schemas.HeaderRequestID: {id}}
	if c.apiKey != "" {
		h.Set(schemas.HeaderAuthorization, "Bearer "+c.apiKey)
	}
	return &nats.Msg{Subject: c.wire.SubmitSubject(), Reply: reply, Header: h, Data: data}, id, nil
}

// cancel tells every gateway replica that the request is abandoned; the one
// running it cancels its group. It proves the request's owner as the
// request did: the same user's subject, the same key.
func (c *Client) cancel(id string) {
	msg := &nats.Msg{Subject: c.wire.SubmitCancelSubjectFor(c.inbox, id)}
	if c.apiKey != "" {
		msg.Header = nats.Header{schemas.HeaderAuthorization: {"Bearer " + c.apiKey}}
	}
	_ = c.nc.PublishMsg(msg)
}

func noGateway(wire schemas.Wire, err error) *Error {
	return &Error{Code: schemas.ErrUnavailable, Status: 503, err: err,
		Message: "no hedgerow gateway serves " + wire.SubmitSubject()}
}

// errorFrom reads an error answer: the micro error headers, the stable code
// and the SubmitError body when present.
func errorFrom(m *nats.Msg) *Error {
	e := &Error{
		Code:    schemas.ErrorCode(m.Header.Get(schemas.HeaderErrorCode)),
		Message: m.Header.Get(micro.ErrorHeader),
		Group:   m.Header.Get(schemas.HeaderGroup),
		Region:  m.Header.Get(schemas.HeaderRegion),
	}
	e.Status, _ = strconv.Atoi(m.Header.Get(micro.ErrorCodeHeader))
	if secs, err := strconv.Atoi(m.Header.Get(schemas.HeaderRetryAfter)); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	if retry, err := strconv.ParseBool(m.Header.Get(schemas.HeaderShouldRetry)); err == nil {
		e.shouldRetry = &retry
	}
	var body schemas.SubmitError
	if len(m.Data) > 0 && json.Unmarshal(m.Data, &body) == nil {
		if body.Code != "" {
			e.Code = body.Code
		}
		if body.Message != "" {
			e.Message = body.Message
		}
		e.Winner = body.Winner
	}
	if e.Code == "" {
		e.Code = schemas.ErrUnavailable // a micro error from something other than hedgerow
	}
	return e
}
